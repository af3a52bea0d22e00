//! The incident half of the restart path: suspect sightings, the shared incident timer, the
//! alerts of an incident and of alert-only episodes, escalation, and the incarnation a worker
//! runs (someone else's restart gets a cooldown of its own; ours is recognised by its claim).

use crate::alerts::{AlertKind, Resolve};
use crate::clock::{human, ms, Millis, Stamp};
use crate::coord::CoordError;
use crate::hang::journal::About;
use crate::hang::marks::{self, MARK_TTL};
use crate::hang::model::Episode;
use crate::hang::model::Incident;
use crate::hang::policy::{TimerEnd, Verdict};
use crate::hang::policy_due;
use crate::hang::policy_record;
use crate::runtime::container::Container;
use crate::trail::Code;

use super::{random_token, short, Case, RestartPath};

/// The kind of an episode's alert.
fn episode_kind(e: Episode) -> AlertKind {
    match e {
        Episode::Unreachable => AlertKind::Unreachable,
        Episode::Stalled => AlertKind::Stalled,
        Episode::GpuFailed => AlertKind::GpuFailed,
        Episode::TpuFailed => AlertKind::TpuFailed,
        Episode::Paused => AlertKind::Paused,
        Episode::Exited => AlertKind::Exited,
    }
}

impl RestartPath<'_> {
    /// The worker's condition ended: the sinks that keep alerts open (Alertmanager) resolve
    /// the alerts `end` covers.
    pub(super) async fn resolve_alerts(&self, worker: &str, end: Resolve) {
        self.ctx
            .notifier
            .resolve(self.ctx.keys.node(), worker, end)
            .await;
    }

    pub(super) async fn record_suspect(
        &mut self,
        case: &Case<'_>,
        hb: Millis,
        now: Millis,
    ) -> Result<(), CoordError> {
        let key = self.ctx.keys.suspect(case.worker());
        self.ctx
            .coord
            .set(&key, &Stamp::new(hb, now.to_string()).to_string(), MARK_TTL)
            .await?;
        let detail = format!(
            "heartbeat {} old; waiting for a second observation",
            human(now - hb)
        );
        self.note(now, case.about(), Code::Suspect, detail).await
    }

    pub(super) async fn clear_incident(
        &mut self,
        case: &Case<'_>,
        end: TimerEnd,
        now: Millis,
    ) -> Result<(), CoordError> {
        self.ctx
            .coord
            .del(&[self.ctx.keys.incident(case.worker())])
            .await?;
        let (code, why) = match end {
            TimerEnd::Booting => (
                Code::TimerCleared,
                "cooldown marker present: this is our own restart booting",
            ),
            TimerEnd::Maintenance => (Code::TimerCleared, "node in maintenance: no restarts"),
            TimerEnd::Recovered => (Code::Recovered, "heartbeat fresh again; incident closed"),
            TimerEnd::Paused => (
                Code::TimerCleared,
                "container paused by someone: no restart; a new timer starts if it hangs once running",
            ),
        };
        let mut about = case.about();
        if let Some(inc) = &case.marks.incident {
            about = about.incident(&inc.id);
        }
        let ended = match end {
            TimerEnd::Recovered => Resolve::Recovered,
            _ => Resolve::IncidentCleared,
        };
        self.resolve_alerts(case.worker(), ended).await;
        self.note(now, about, code, why.to_string()).await
    }

    pub(super) async fn forget_restart(
        &mut self,
        case: &Case<'_>,
        now: Millis,
    ) -> Result<(), CoordError> {
        let w = case.worker();
        self.ctx
            .coord
            .del(&[self.ctx.keys.restarted(w), self.ctx.keys.escalated(w)])
            .await?;
        self.resolve_alerts(w, Resolve::Recovered).await;
        let detail = "worker healthy after our restart".to_string();
        self.note(now, case.about(), Code::Recovered, detail).await
    }

    pub(super) async fn close_episode(
        &mut self,
        case: &Case<'_>,
        e: Episode,
        now: Millis,
    ) -> Result<(), CoordError> {
        self.ctx
            .coord
            .del(&[self.ctx.keys.episode(case.worker(), e.as_str())])
            .await?;
        self.resolve_alerts(case.worker(), Resolve::Episode(episode_kind(e)))
            .await;
        let detail = format!("{} condition ended", e.as_str());
        self.note(now, case.about(), Code::EpisodeClosed, detail)
            .await
    }

    pub(super) async fn open_episode(
        &mut self,
        case: &Case<'_>,
        e: Episode,
        now: Millis,
    ) -> Result<(), CoordError> {
        // The SET NX is the de-duplication: only the first observer alerts.
        let key = self.ctx.keys.episode(case.worker(), e.as_str());
        if !self.claim_alert(&key, now, MARK_TTL).await? {
            return Ok(());
        }
        let ahead = case
            .status
            .and_then(|s| policy_record::heartbeat_from_future(s, now));
        let future;
        let (kind, detail) = match e {
            Episode::Unreachable if case.invalid.is_some() => {
                future = format!(
                    "{}; alert only until the record is fixed (other workers are judged as usual)",
                    case.invalid.unwrap_or_default()
                );
                (AlertKind::Unreachable, future.as_str())
            }
            Episode::Unreachable if ahead.is_some() => {
                future = format!(
                    "the record's heartbeat is {} ahead of the coordinator's clock (milliseconds written where seconds belong?): the record is invalid, alert only until the worker writes seconds since the epoch",
                    human(ahead.unwrap_or_default())
                );
                (AlertKind::Unreachable, future.as_str())
            }
            Episode::Unreachable => (AlertKind::Unreachable, "status record missing or unreadable; alert only (the machine may be rebooting, partitioned or off on purpose)"),
            Episode::Stalled => (AlertKind::Stalled, "heartbeat fresh but progress unchanged; alert only (long jobs legitimately look like this)"),
            Episode::GpuFailed => (AlertKind::GpuFailed, "the GPU under this worker has failed; a restart cannot fix hardware"),
            Episode::TpuFailed => (AlertKind::TpuFailed, "the node's TPU has failed; a restart cannot fix hardware"),
            Episode::Paused => (AlertKind::Paused, "the container is paused (someone's decision); alert only, never restarted while paused"),
            Episode::Exited => (AlertKind::Exited, "the container has exited and nothing runs in its place; alert only: Vigil never starts what someone stopped (a crash is for the runtime's restart policy)"),
        };
        let since = case
            .marks
            .progress
            .as_ref()
            .map(|(_, t)| *t)
            .filter(|_| e == Episode::Stalled);
        let alert = self.alert_for(kind, case, since, now, detail);
        self.ctx.notifier.send(&alert).await;
        let detail = format!("{} alert sent", kind.as_str());
        self.note(now, case.about(), Code::Alerted, detail).await
    }

    /// Start the incident timer (first observer wins) and read back whoever's start time stands.
    pub(super) async fn open_incident(
        &mut self,
        case: &Case<'_>,
        now: Millis,
    ) -> Result<Option<Incident>, CoordError> {
        let key = self.ctx.keys.incident(case.worker());
        let id = format!("{now:x}-{}", &random_token()[..6]);
        let won = self
            .ctx
            .coord
            .set_nx(&key, &Incident { started: now, id }.encode(), MARK_TTL)
            .await?;
        // Whoever won, everyone reads the same start time back.
        let incident = self
            .ctx
            .coord
            .get_many(&[key])
            .await?
            .pop()
            .flatten()
            .and_then(|s| Incident::decode(&s));
        if let (true, Some(inc)) = (won, &incident) {
            let wait = policy_due::restart_wait(case.v, &self.ctx.cfg.policy);
            let detail = format!(
                "{} confirmed; restart due in {}",
                case.v.as_str(),
                human(ms(wait))
            );
            let about = case.about().incident(&inc.id);
            self.note(now, about, Code::TimerStarted, detail).await?;
        }
        Ok(incident)
    }

    pub(super) async fn escalate(
        &mut self,
        case: &Case<'_>,
        now: Millis,
    ) -> Result<(), CoordError> {
        let key = self.ctx.keys.escalated(case.worker());
        if !self.claim_alert(&key, now, MARK_TTL).await? {
            return Ok(());
        }
        let restarted = case.marks.restarted_at.unwrap_or(now);
        let detail = format!(
            "still broken {} after our restart; the restart did not fix it, a person is needed",
            human(now - restarted)
        );
        let alert = self.alert_for(AlertKind::Escalation, case, Some(restarted), now, detail);
        self.ctx.notifier.send(&alert).await;
        let detail = "paged: restart did not recover the worker".to_string();
        self.note(now, case.about(), Code::Escalated, detail).await
    }

    /// The hung / errored alert, once per incident (de-duplicated in the coordinator).
    pub(super) async fn alert_incident(
        &mut self,
        case: &Case<'_>,
        inc: &Incident,
        now: Millis,
    ) -> Result<(), CoordError> {
        let key = self.ctx.keys.alert_dedup(&inc.id, case.v.as_str());
        if !self.claim_alert(&key, now, MARK_TTL).await? {
            return Ok(());
        }
        let kind = if case.v == Verdict::Errored {
            AlertKind::Errored
        } else {
            AlertKind::Hung
        };
        let wait = policy_due::restart_wait(case.v, &self.ctx.cfg.policy);
        let since = policy_due::condition_since(case.v, inc.started, case.marks, case.status);
        let detail = if case.alert_only() {
            "alert only: its restarts belong to its owner; Vigil will not restart it".to_string()
        } else {
            format!(
                "restart due in {}",
                human((inc.started + ms(wait) - now).max(0))
            )
        };
        let mut alert = self.alert_for(kind, case, Some(since), now, detail);
        alert.incident = Some(inc.id.clone());
        if !self.gpu_evidence.is_empty() {
            // Application XIDs on the worker's GPU do not make the hardware unhealthy, but
            // they are the first thing a person wants to see next to a hang.
            alert
                .detail
                .push_str(&format!("; GPU evidence: {}", self.gpu_evidence.join("; ")));
        }
        self.ctx.notifier.send(&alert).await;
        let detail = format!("{} alert sent", kind.as_str());
        let about = case.about().incident(&inc.id);
        self.note(now, about, Code::Alerted, detail).await
    }

    /// A new incarnation of the container that we did not start (an operator's `docker
    /// restart`, Docker's restart policy) boots just like ours and looks just as hung: it gets
    /// the same cooldown marker, and any timer of the previous incarnation is dropped.
    /// True when anything was written (the marks read before are stale then).
    pub(super) async fn track_incarnation(
        &mut self,
        c: &Container,
        now: Millis,
        read: marks::Decoded,
    ) -> Result<bool, CoordError> {
        let marks::Decoded {
            incarnation: prev,
            cooldown: cooling,
            locked,
            ..
        } = read;
        let k = self.ctx.keys.clone();
        let w = c.worker.as_str();
        let seen = marks::incarnation(c);
        if prev.as_deref() == Some(seen.as_str()) {
            return Ok(false);
        }
        // Ours: a restart of exactly the previous incarnation, seen through (`:done`). Claimed:
        // an instance claimed that restart and never recorded its outcome (it died, or failed
        // closed, mid-command): its command may have run, or someone else's restart came
        // instead. Either way the new incarnation gets a full cooldown of its own.
        let marked = |suffix: String| cooling.as_ref().is_some_and(|m| m.ends_with(&suffix));
        let ours = |p: &str| marked(format!(":{p}{}", marks::DONE));
        let claimed = |p: &str| marked(format!(":{p}"));
        let external = prev.as_deref().is_some_and(|p| !ours(p));
        let unfinished = prev.as_deref().is_some_and(claimed);
        if unfinished && locked {
            // NB: the instance that claimed it most likely still holds the lock and is
            // verifying its restart right now: leave the new incarnation to it (its marker
            // stands meanwhile). If it died, the lock expires and the next cycle records it.
            return Ok(false);
        }
        if external {
            // NB: before the incarnation is recorded: a write that fails (or a crash) in between
            // must leave the next cycle to find the new incarnation again, never a recorded
            // incarnation without its cooldown.
            self.cool_down_external(w, now).await?;
        }
        self.ctx
            .coord
            .set(&k.incarnation(w), &seen, MARK_TTL)
            .await?;
        if !external {
            return Ok(true);
        }
        let claim = cooling.as_deref().filter(|_| unfinished);
        if claim.is_some() {
            // Our restart, finished by whoever sees it: its fruitless run counts from here.
            self.settle_fruitless(w, Some(now), false).await;
        }
        self.note_new_incarnation(c, now, claim).await?;
        Ok(true)
    }

    /// Anyone else's restart (an operator's, Docker's restart policy, kubelet's) gets a full
    /// cooldown from its own start, even one that lands inside our cooldown, and the previous
    /// incarnation's timers and alerts go.
    async fn cool_down_external(&mut self, w: &str, now: Millis) -> Result<(), CoordError> {
        let k = &self.ctx.keys;
        let marker = format!("{now}{}", marks::EXTERNAL);
        let cooldown = self.ctx.cfg.policy.cooldown;
        self.ctx
            .coord
            .set(&k.cooldown(w), &marker, cooldown)
            .await?;
        let timers = [k.incident(w), k.suspect(w), k.error_since(w)];
        self.ctx.coord.del(&timers).await?;
        self.resolve_alerts(w, Resolve::IncidentCleared).await;
        Ok(())
    }

    /// The trail entry for a new incarnation we did not verify ourselves: the restart of an
    /// instance that died mid-command (`claim`: its unfinished claim), or someone else's.
    async fn note_new_incarnation(
        &mut self,
        c: &Container,
        now: Millis,
        claim: Option<&str>,
    ) -> Result<(), CoordError> {
        let cooldown = humantime::format_duration(self.ctx.cfg.policy.cooldown);
        let about = About::worker(&c.worker, Verdict::Booting);
        let Some(claim) = claim else {
            let detail = format!(
                "container {} restarted outside Vigil; treated as booting for {cooldown}",
                short(&c.id)
            );
            return self.note(now, about, Code::ExternalRestart, detail).await;
        };
        // NB: ours, finished by the survivor: the incident the claim names is kept, so the trail
        // reads as one restart of one incident, never as "outside Vigil".
        let about = match marks::claimed_incident(claim) {
            Some(id) => about.incident(id),
            None => about,
        };
        let detail = format!(
            "container {} runs a new incarnation after a restart claimed by an instance that did not record its outcome (it stopped mid-command; its restart ran); recorded for it, treated as booting for {cooldown}",
            short(&c.id)
        );
        self.note(now, about, Code::Restarted, detail).await
    }
}
