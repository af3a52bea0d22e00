//! The incident half of the restart path: suspect sightings, the shared incident timer and its
//! end, and the incarnation a worker runs (someone else's restart gets a cooldown of its own;
//! ours is recognised by its claim). Its pages (hung, episodes, escalation) are `super::pages`'.

use crate::alerts::Resolve;
use crate::clock::{human, ms, Millis, Stamp};
use crate::coord::lease::Lease;
use crate::coord::{Op, Result};
use crate::hang::journal::About;
use crate::hang::marks::{self, MARK_TTL};
use crate::hang::model::{Episode, Incident};
use crate::hang::policy::{TimerEnd, Verdict};
use crate::hang::policy_due;
use crate::runtime::container::Container;
use crate::trail::Code;

use super::command::{settle_fruitless, settle_gang_line, Line};
use super::{short, Case, RestartPath};

impl RestartPath<'_> {
    pub(super) async fn record_suspect(&mut self, case: &Case<'_>, hb: Millis) -> Result<()> {
        let (key, now) = (self.ctx.keys.suspect(case.worker()), case.now);
        self.ctx.coord.set(&key, &Stamp::new(hb, now.to_string()).to_string(), MARK_TTL).await?;
        let detail = format!("heartbeat {} old; waiting for a second observation", human(now - hb));
        self.journal.note(now, case.about(), Code::Suspect, detail).await
    }

    pub(super) async fn clear_incident(&mut self, case: &Case<'_>, end: TimerEnd) -> Result<()> {
        self.ctx.coord.del(&[self.ctx.keys.incident(case.worker())]).await?;
        let why = match end {
            TimerEnd::Booting => "cooldown marker present: this is our own restart booting",
            TimerEnd::Maintenance => "node in maintenance: no restarts",
            TimerEnd::Recovered => "heartbeat fresh again; incident closed",
            TimerEnd::Paused => "container paused by someone: no restart; a new timer starts if it hangs once running",
        };
        let (code, ended) = match end {
            TimerEnd::Recovered => (Code::Recovered, Resolve::Recovered),
            _ => (Code::TimerCleared, Resolve::IncidentCleared),
        };
        let about = case.about();
        let about = case.marks.incident.as_ref().map_or(about, |inc| about.incident(&inc.id));
        self.pager().resolve_alerts(case.worker(), ended).await;
        self.journal.note(case.now, about, code, why.to_string()).await
    }

    pub(super) async fn forget_restart(&mut self, case: &Case<'_>) -> Result<()> {
        let w = case.worker();
        self.ctx.coord.del(&[self.ctx.keys.restarted(w), self.ctx.keys.escalated(w)]).await?;
        self.pager().resolve_alerts(w, Resolve::Recovered).await;
        let detail = "worker healthy after our restart".to_string();
        self.journal.note(case.now, case.about(), Code::Recovered, detail).await
    }

    pub(super) async fn close_episode(&mut self, case: &Case<'_>, e: Episode) -> Result<()> {
        self.ctx.coord.del(&[self.ctx.keys.episode(case.worker(), e.as_str())]).await?;
        let kind = super::pages::episode_kind(e);
        self.pager().resolve_alerts(case.worker(), Resolve::Episode(kind)).await;
        let detail = format!("{} condition ended", e.as_str());
        self.journal.note(case.now, case.about(), Code::EpisodeClosed, detail).await
    }

    /// Start the incident timer (first observer wins) and read back whoever's start time stands.
    pub(super) async fn open_incident(&mut self, case: &Case<'_>) -> Result<Option<Incident>> {
        let (key, now) = (self.ctx.keys.incident(case.worker()), case.now);
        let id = format!("{now:x}-{}", &Lease::random_token()[..6]);
        let won =
            self.ctx.coord.set_nx(&key, &Incident { started: now, id }.encode(), MARK_TTL).await?;
        // Whoever won, everyone reads the same start time back.
        let incident = self.ctx.coord.get(&key).await?.and_then(|s| Incident::decode(&s));
        if let (true, Some(inc)) = (won, &incident) {
            let due = human(ms(policy_due::restart_wait(case.v, &self.ctx.cfg.policy)));
            let detail = format!("{} confirmed; restart due in {due}", case.v.as_str());
            let about = case.about().incident(&inc.id);
            self.journal.note(now, about, Code::TimerStarted, detail).await?;
        }
        Ok(incident)
    }

    /// A new incarnation of the container that we did not start (an operator's `docker
    /// restart`, Docker's restart policy) boots just like ours and looks just as hung: it gets
    /// the same cooldown marker, and any timer of the previous incarnation is dropped.
    /// True when anything was written (the marks read before are stale then).
    pub(super) async fn track_incarnation(
        &mut self,
        c: &Container,
        now: Millis,
        read: &marks::Decoded,
    ) -> Result<bool> {
        let marks::Decoded { incarnation: prev, cooldown: cooling, locked, .. } = read;
        let (w, seen) = (c.worker.as_str(), marks::incarnation(c));
        if prev.as_deref() == Some(seen.as_str()) {
            // NB: its TTL refreshed with the cycle's batch (no round trip of its own): an
            // incarnation that runs for days must not lapse from the record and read as a new
            // one a day after it was recorded (what this agent learned of its rhythm started
            // over, and a restart by someone else at that moment taken for none). Its TTL only:
            // a value written back late would undo an HA partner's record of a newer one.
            self.deferred.push(Op::Expire { key: self.ctx.keys.incarnation(w), ttl: MARK_TTL });
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
        if unfinished && *locked {
            // NB: the instance that claimed it most likely still holds the lock and is
            // verifying its restart right now: leave the new incarnation to it (its marker
            // stands meanwhile). If it died, the lock expires and the next cycle records it.
            return Ok(false);
        }
        if external {
            // Anyone else's restart (an operator's, Docker's restart policy, kubelet's) gets a
            // full cooldown from its own start, even one that lands inside our cooldown, and the
            // previous incarnation's timers and alerts go.
            // NB: before the incarnation is recorded: a write that fails (or a crash) in between
            // must leave the next cycle to find the new incarnation again, never a recorded
            // incarnation without its cooldown.
            let (k, marker) = (&self.ctx.keys, format!("{now}{}", marks::EXTERNAL));
            self.ctx.coord.set(&k.cooldown(w), &marker, self.ctx.cfg.policy.cooldown).await?;
            self.ctx.coord.del(&[k.incident(w), k.suspect(w), k.error_since(w)]).await?;
            self.pager().resolve_alerts(w, Resolve::IncidentCleared).await;
        }
        self.ctx.coord.set(&self.ctx.keys.incarnation(w), &seen, MARK_TTL).await?;
        if !external {
            return Ok(true);
        }
        let claim = cooling.as_deref().filter(|_| unfinished);
        if let Some(claim) = claim {
            // Our restart, finished by whoever sees it: its fruitless run counts from here (a
            // worker's own, or its line in its gang's: whichever the claim drew).
            let line = Line::At(now);
            settle_fruitless(self.ctx, w, line, false).await;
            let at = Stamp::parse(claim).map_or(Millis::MAX, |s| s.at);
            settle_gang_line(self.ctx, w, line, at).await;
        }
        self.note_new_incarnation(c, now, claim).await?;
        Ok(true)
    }

    /// The trail entry for a new incarnation we did not verify ourselves: the restart of an
    /// instance that died mid-command (`claim`: its unfinished claim), or someone else's.
    async fn note_new_incarnation(
        &mut self,
        c: &Container,
        now: Millis,
        claim: Option<&str>,
    ) -> Result<()> {
        let cooldown = humantime::format_duration(self.ctx.cfg.policy.cooldown);
        let (id, about) = (short(&c.id), About::worker(&c.worker, Verdict::Booting));
        let Some(claim) = claim else {
            let detail = format!(
                "container {id} restarted outside Vigil; treated as booting for {cooldown}"
            );
            return self.journal.note(now, about, Code::ExternalRestart, detail).await;
        };
        // NB: ours, finished by the survivor: the incident the claim names is kept, so the trail
        // reads as one restart of one incident, never as "outside Vigil".
        let about = marks::claimed_incident(claim).map_or(about, |id| about.incident(id));
        let detail = format!("container {id} runs a new incarnation after a restart claimed by an instance that did not record its outcome (it stopped mid-command; its restart ran); recorded for it, treated as booting for {cooldown}");
        self.journal.note(now, about, Code::Restarted, detail).await
    }
}
