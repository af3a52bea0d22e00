//! The restart pipeline: carries out the pure plan against the coordinator, the runtime and the
//! alert sinks, with every safeguard of the brief, in the brief's order:
//!
//! 1. persistence before action — the incident timer lives in the coordinator (SET NX);
//! 2. per-node lock with a random token, compare-and-delete release;
//! 3. revalidation right before the command, lock TTL check, compare-and-restart;
//! 4. one breaker per node per UTC day, incremented immediately before the command;
//! 5. escalation page once if still broken after `escalate_after`;
//! 6. cooldown marker written before the command;
//! 7. all durations from the coordinator's clock;
//! 8. a failed restart releases the dedup key and pages at once;
//!
//! plus the fleet-wide budget, fail-closed behaviour and the decision trail.

use std::time::Duration;

use crate::actions::alert::{Alert, AlertKind};
use crate::agent::Agent;
use crate::clock::{human, ms, utc_day, Millis};
use crate::config::LOCK_MARGIN;
use crate::coord::CoordError;
use crate::policy::{
    self, is_stale, restart_due, Episode, Incident, Marks, Verdict, WorkerState, WorkerStatus,
};
use crate::runtime::Container;
use crate::trail::code;

/// Marks are garbage-collected after a day even if nobody clears them.
pub const MARK_TTL: Duration = Duration::from_secs(24 * 3600);
/// The breaker key outlives its UTC day so the count is readable the morning after.
const BREAKER_TTL: Duration = Duration::from_secs(48 * 3600);

/// How one pass of the restart path ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Restarted,
    WouldRestart,
    Failed,
    Skipped(&'static str),
}

fn split_pair(s: &str) -> Option<(Millis, String)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.to_string()))
}

fn random_token() -> String {
    format!("{:016x}", rand::random::<u64>())
}

impl Agent {
    /// Read every mark of a worker in one round trip.
    pub async fn read_marks(&self, worker: &str) -> Result<Marks, CoordError> {
        let k = &self.keys;
        let mut keys = vec![
            k.suspect(worker),
            k.incident(worker),
            k.error_since(worker),
            k.progress(worker),
            k.cooldown(worker),
            k.restarted(worker),
            k.escalated(worker),
        ];
        for e in Episode::ALL {
            keys.push(k.episode(worker, e.as_str()));
        }
        let v = self.coord.get_many(&keys).await?;
        let get = |i: usize| v.get(i).cloned().flatten();
        let suspect = get(0).and_then(|s| {
            let (hb, seen) = split_pair(&s)?;
            Some((hb, seen.parse().ok()?))
        });
        let incident = get(1)
            .and_then(|s| split_pair(&s))
            .map(|(started, id)| Incident { started, id });
        let progress = get(3)
            .and_then(|s| split_pair(&s))
            .map(|(since, value)| (value, since));
        let episodes = Episode::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| get(7 + i).is_some())
            .map(|(_, e)| *e)
            .collect();
        Ok(Marks {
            suspect,
            incident,
            error_since: get(2).and_then(|s| s.parse().ok()),
            progress,
            cooldown: get(4).is_some(),
            restarted_at: get(5).and_then(|s| s.parse().ok()),
            escalated: get(6).is_some(),
            episodes,
        })
    }

    pub async fn read_status(&self, worker: &str) -> Result<Option<WorkerStatus>, CoordError> {
        let fields = self.coord.hgetall(&self.keys.status(worker)).await?;
        Ok(WorkerStatus::from_fields(&fields))
    }

    #[allow(clippy::too_many_arguments)]
    fn alert_for(
        &self,
        kind: AlertKind,
        c: &Container,
        v: Verdict,
        status: Option<&WorkerStatus>,
        since: Option<Millis>,
        now: Millis,
        detail: impl Into<String>,
    ) -> Alert {
        let mut a = Alert::new(kind, self.keys.node(), detail);
        a.worker = Some(c.worker.clone());
        a.verdict = Some(v.as_str());
        a.job = status.and_then(|s| s.job.clone());
        a.duration = since.map(|t| human(now - t));
        a.dry_run = self.cfg.dry_run;
        a
    }

    /// Evaluate one worker and act on the verdict. Coordinator errors abort the evaluation
    /// (fail closed): nothing after a failed read or write is done on stale knowledge.
    pub async fn evaluate(&mut self, c: &Container, now: Millis) -> Result<Verdict, CoordError> {
        let cfg = self.cfg.policy.clone();
        self.track_incarnation(c, now).await?;
        let status = self.read_status(&c.worker).await?;
        let marks = self.read_marks(&c.worker).await?;
        let v = policy::verdict(status.as_ref(), &marks, self.node, now, &cfg);
        self.metrics.verdict(v.as_str());
        let p = policy::plan(v, status.as_ref(), &marks, now, &cfg);
        let k = self.keys.clone();
        let w = c.worker.as_str();

        if let Some(hb) = p.record_suspect {
            self.coord
                .set(&k.suspect(w), &format!("{hb}:{now}"), MARK_TTL)
                .await?;
            self.note(
                now,
                w,
                v,
                code::SUSPECT,
                format!(
                    "heartbeat {} old; waiting for a second observation",
                    human(now - hb)
                ),
                None,
                false,
            )
            .await?;
        }
        if p.clear_suspect {
            self.coord.del(&[k.suspect(w)]).await?;
        }
        if p.mark_error_since {
            self.coord
                .set_nx(&k.error_since(w), &now.to_string(), MARK_TTL)
                .await?;
        }
        if p.clear_error_since {
            self.coord.del(&[k.error_since(w)]).await?;
        }
        if let Some(value) = &p.record_progress {
            self.coord
                .set(&k.progress(w), &format!("{now}:{value}"), MARK_TTL)
                .await?;
        }
        if p.clear_progress {
            self.coord.del(&[k.progress(w)]).await?;
        }
        if p.clear_incident {
            self.coord.del(&[k.incident(w)]).await?;
            let (decision, why) = match v {
                Verdict::Booting => (
                    code::TIMER_CLEARED,
                    "cooldown marker present: this is our own restart booting",
                ),
                Verdict::InMaintenance => (code::TIMER_CLEARED, "node in maintenance: no restarts"),
                _ => (code::RECOVERED, "heartbeat fresh again; incident closed"),
            };
            let id = marks.incident.as_ref().map(|i| i.id.as_str());
            self.note(now, w, v, decision, why.to_string(), id, false)
                .await?;
        }
        if p.clear_restarted {
            self.coord.del(&[k.restarted(w), k.escalated(w)]).await?;
            self.note(
                now,
                w,
                v,
                code::RECOVERED,
                "worker healthy after our restart".into(),
                None,
                false,
            )
            .await?;
        }
        for e in &p.close_episodes {
            self.coord.del(&[k.episode(w, e.as_str())]).await?;
            self.note(
                now,
                w,
                v,
                code::EPISODE_CLOSED,
                format!("{} condition ended", e.as_str()),
                None,
                false,
            )
            .await?;
        }
        for e in &p.open_episodes {
            // The SET NX is the de-duplication: only the first observer alerts.
            if self
                .coord
                .set_nx(&k.episode(w, e.as_str()), &now.to_string(), MARK_TTL)
                .await?
            {
                let (kind, detail) = match e {
                    Episode::Unreachable => (AlertKind::Unreachable, "status record missing or unreadable; alert only (the machine may be rebooting, partitioned or off on purpose)"),
                    Episode::Stalled => (AlertKind::Stalled, "heartbeat fresh but progress unchanged; alert only (long jobs legitimately look like this)"),
                    Episode::GpuFailed => (AlertKind::GpuFailed, "the GPU under this worker has failed; a restart cannot fix hardware"),
                };
                let since = marks
                    .progress
                    .as_ref()
                    .map(|(_, t)| *t)
                    .filter(|_| *e == Episode::Stalled);
                let alert = self.alert_for(kind, c, v, status.as_ref(), since, now, detail);
                self.notifier.send(&alert).await;
                self.note(
                    now,
                    w,
                    v,
                    code::ALERTED,
                    format!("{} alert sent", kind.as_str()),
                    None,
                    false,
                )
                .await?;
            }
        }

        let mut incident = marks.incident.clone();
        if p.open_incident {
            let id = format!("{now:x}-{}", &random_token()[..6]);
            let won = self
                .coord
                .set_nx(&k.incident(w), &format!("{now}:{id}"), MARK_TTL)
                .await?;
            // Whoever won, everyone reads the same start time back.
            incident = self
                .coord
                .get_many(&[k.incident(w)])
                .await?
                .pop()
                .flatten()
                .and_then(|s| split_pair(&s))
                .map(|(started, id)| Incident { started, id });
            if won {
                let id = incident.as_ref().map(|i| i.id.as_str());
                self.note(
                    now,
                    w,
                    v,
                    code::TIMER_STARTED,
                    format!(
                        "{} confirmed; restart due in {}",
                        v.as_str(),
                        human(ms(self.restart_wait(v)))
                    ),
                    id,
                    false,
                )
                .await?;
            }
        }

        if p.escalate
            && self
                .coord
                .set_nx(&k.escalated(w), &now.to_string(), MARK_TTL)
                .await?
        {
            let restarted = marks.restarted_at.unwrap_or(now);
            let alert = self.alert_for(
                AlertKind::Escalation,
                c,
                v,
                status.as_ref(),
                Some(restarted),
                now,
                format!(
                    "still broken {} after our restart; the restart did not fix it, a person is needed",
                    human(now - restarted)
                ),
            );
            self.notifier.send(&alert).await;
            self.note(
                now,
                w,
                v,
                code::ESCALATED,
                "paged: restart did not recover the worker".into(),
                None,
                false,
            )
            .await?;
        }

        let Some(inc) = incident else {
            return Ok(v);
        };
        if p.incident_alert
            && self
                .coord
                .set_nx(
                    &k.alert_dedup(&inc.id, v.as_str()),
                    &now.to_string(),
                    MARK_TTL,
                )
                .await?
        {
            let kind = if v == Verdict::Errored {
                AlertKind::Errored
            } else {
                AlertKind::Hung
            };
            let mut alert = self.alert_for(
                kind,
                c,
                v,
                status.as_ref(),
                Some(self.condition_since(v, &inc, &marks, status.as_ref())),
                now,
                format!(
                    "restart due in {}",
                    human((inc.started + ms(self.restart_wait(v)) - now).max(0))
                ),
            );
            alert.incident = Some(inc.id.clone());
            if !self.gpu_evidence.is_empty() {
                // Application XIDs on the worker's GPU do not make the hardware unhealthy, but
                // they are the first thing a person wants to see next to a hang.
                alert
                    .detail
                    .push_str(&format!("; GPU evidence: {}", self.gpu_evidence.join("; ")));
            }
            self.notifier.send(&alert).await;
            self.note(
                now,
                w,
                v,
                code::ALERTED,
                format!("{} alert sent", kind.as_str()),
                Some(&inc.id),
                false,
            )
            .await?;
        }
        if p.restart_candidate && restart_due(v, inc.started, now, &cfg) {
            let since = self.condition_since(v, &inc, &marks, status.as_ref());
            self.restart_path(c, v, status.as_ref(), &inc, since, now)
                .await?;
        }
        Ok(v)
    }

    /// A new incarnation of the container that we did not start (an operator's `docker
    /// restart`, Docker's restart policy) boots just like ours and looks just as hung: it gets
    /// the same cooldown marker, and any timer of the previous incarnation is dropped.
    async fn track_incarnation(&mut self, c: &Container, now: Millis) -> Result<(), CoordError> {
        let k = self.keys.clone();
        let w = c.worker.as_str();
        let seen = format!("{}:{}", c.id, c.started_at);
        let prev = self
            .coord
            .get_many(&[k.incarnation(w)])
            .await?
            .pop()
            .flatten();
        if prev.as_deref() == Some(seen.as_str()) {
            return Ok(());
        }
        self.coord.set(&k.incarnation(w), &seen, MARK_TTL).await?;
        if prev.is_none() {
            return Ok(());
        }
        // Our own restart already left its marker; SET NX keeps it.
        if self
            .coord
            .set_nx(
                &k.cooldown(w),
                &format!("{now}:external"),
                self.cfg.policy.cooldown,
            )
            .await?
        {
            self.coord
                .del(&[k.incident(w), k.suspect(w), k.error_since(w)])
                .await?;
            self.note(
                now,
                w,
                Verdict::Booting,
                code::EXTERNAL_RESTART,
                format!(
                    "container {} restarted outside Vigil; treated as booting for {}",
                    short(&c.id),
                    humantime::format_duration(self.cfg.policy.cooldown)
                ),
                None,
                false,
            )
            .await?;
        }
        Ok(())
    }

    fn restart_wait(&self, v: Verdict) -> Duration {
        if v == Verdict::Hung {
            self.cfg.policy.restart_delay
        } else {
            Duration::ZERO
        }
    }

    /// When the broken condition began, for "how long" in alerts.
    fn condition_since(
        &self,
        v: Verdict,
        inc: &Incident,
        marks: &Marks,
        status: Option<&WorkerStatus>,
    ) -> Millis {
        match v {
            Verdict::Errored => marks.error_since.unwrap_or(inc.started),
            _ => status.and_then(|s| s.heartbeat).unwrap_or(inc.started),
        }
    }

    /// Steps 2–8 of the pipeline. Always releases the lock it took.
    async fn restart_path(
        &mut self,
        c: &Container,
        v: Verdict,
        status: Option<&WorkerStatus>,
        inc: &Incident,
        since: Millis,
        now: Millis,
    ) -> Result<Outcome, CoordError> {
        let k = self.keys.clone();
        let day = utc_day(now);
        let w = c.worker.as_str();

        // Cheap early checks, so an open breaker does not collect logs and post a restart alert.
        // The authoritative check is the atomic increment right before the command.
        if let Some(outcome) = self
            .blocked_by_caps(c, v, status, inc, now, &day, true)
            .await?
        {
            return Ok(outcome);
        }

        let token = random_token();
        let took = match self
            .coord
            .set_nx(&k.lock(), &token, self.cfg.safety.lock_ttl)
            .await
        {
            Ok(took) => took,
            Err(e) => {
                // NB: the SET may have been applied with its reply lost: release by token.
                let _ = self.coord.del_if_owner(&k.lock(), &token).await;
                return Err(e);
            }
        };
        if !took {
            self.note(
                now,
                w,
                v,
                code::SKIP_LOCK_HELD,
                "another instance holds this node's lock; it acts, we skip".into(),
                Some(&inc.id),
                true,
            )
            .await?;
            return Ok(Outcome::Skipped(code::SKIP_LOCK_HELD));
        }
        let result = self.locked_restart(c, v, status, inc, since, &token).await;
        // Release only our own lock (compare-and-delete), whatever happened above.
        if let Err(e) = self.coord.del_if_owner(&k.lock(), &token).await {
            tracing::warn!(error = %e, "could not release the node lock; it expires by its TTL");
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn blocked_by_caps(
        &mut self,
        c: &Container,
        v: Verdict,
        status: Option<&WorkerStatus>,
        inc: &Incident,
        now: Millis,
        day: &str,
        peek: bool,
    ) -> Result<Option<Outcome>, CoordError> {
        let k = self.keys.clone();
        let s = &self.cfg.safety;
        let w = c.worker.as_str();
        let breaker_cap = u64::from(s.breaker_per_day);
        let breaker_open = if s.breaker_disabled {
            false
        } else if peek || self.cfg.dry_run {
            self.coord.counter(&k.breaker(day)).await? >= breaker_cap
        } else {
            self.coord
                .incr_capped(&k.breaker(day), breaker_cap, BREAKER_TTL)
                .await?
                .is_none()
        };
        if breaker_open {
            if self
                .coord
                .set_nx(&k.breaker_alert(day), &now.to_string(), BREAKER_TTL)
                .await?
            {
                let alert = self.alert_for(AlertKind::BreakerOpen, c, v, status, None, now, format!(
                    "circuit breaker open: {} restart(s) already on this node today (UTC {day}); automation stopped, alert only until tomorrow",
                    s.breaker_per_day
                ));
                self.notifier.send(&alert).await;
            }
            self.note(
                now,
                w,
                v,
                code::SKIP_BREAKER_OPEN,
                format!(
                    "breaker open: {} restarts used today ({day})",
                    s.breaker_per_day
                ),
                Some(&inc.id),
                true,
            )
            .await?;
            return Ok(Some(Outcome::Skipped(code::SKIP_BREAKER_OPEN)));
        }
        if s.fleet_budget == 0 {
            return Ok(None);
        }
        let window = now.div_euclid(ms(s.fleet_window).max(1));
        let budget = u64::from(s.fleet_budget);
        let exhausted = if peek || self.cfg.dry_run {
            self.coord.counter(&k.fleet_budget(window)).await? >= budget
        } else {
            self.coord
                .incr_capped(&k.fleet_budget(window), budget, s.fleet_window * 2)
                .await?
                .is_none()
        };
        if !exhausted {
            return Ok(None);
        }
        if !peek && !s.breaker_disabled && !self.cfg.dry_run {
            // The breaker unit was taken just above for a restart that will not run: give it back.
            self.coord.decr(&k.breaker(day)).await?;
        }
        if self
            .coord
            .set_nx(
                &k.fleet_budget_alert(window),
                &now.to_string(),
                s.fleet_window * 2,
            )
            .await?
        {
            let alert = self.alert_for(AlertKind::BudgetExhausted, c, v, status, None, now, format!(
                "fleet restart budget exhausted: {} restart(s) across the fleet in this {} window; no restart anywhere until it ends (a systemic cause is likely)",
                s.fleet_budget, humantime::format_duration(s.fleet_window)
            ));
            self.notifier.send(&alert).await;
        }
        self.note(
            now,
            w,
            v,
            code::SKIP_BUDGET_EXHAUSTED,
            format!(
                "fleet budget of {} per {} exhausted",
                s.fleet_budget,
                humantime::format_duration(s.fleet_window)
            ),
            Some(&inc.id),
            true,
        )
        .await?;
        Ok(Some(Outcome::Skipped(code::SKIP_BUDGET_EXHAUSTED)))
    }

    /// Release the restart alert's dedup key after a skip, so the restart that eventually runs
    /// for this incident alerts (with its logs) again.
    async fn release_restart_alert(&self, inc: &Incident) {
        let _ = self
            .coord
            .del(&[self.keys.alert_dedup(&inc.id, "restart")])
            .await;
    }

    async fn locked_restart(
        &mut self,
        c: &Container,
        v: Verdict,
        status: Option<&WorkerStatus>,
        inc: &Incident,
        since: Millis,
        token: &str,
    ) -> Result<Outcome, CoordError> {
        let k = self.keys.clone();
        let w = c.worker.as_str();
        let reason = v.as_str();
        let dcfg = self.cfg.docker.clone();
        let now = self.coord.time().await?;

        // Logs first: a run that fails here must not consume the breaker.
        let logs = match tokio::time::timeout(
            dcfg.log_timeout,
            self.runtime.logs(&c.id, dcfg.log_lines),
        )
        .await
        {
            Ok(Ok(l)) => l,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!(
                        "no answer within {}",
                        humantime::format_duration(dcfg.log_timeout)
                    ),
                };
                self.metrics.runtime_errors.inc();
                if self
                    .coord
                    .set_nx(
                        &k.alert_dedup(&inc.id, "logs-failed"),
                        &now.to_string(),
                        MARK_TTL,
                    )
                    .await?
                {
                    let alert = self.alert_for(AlertKind::LogsFailed, c, v, status, Some(since), now, format!("log collection failed ({why}); restart not attempted, retrying next cycle; breaker not consumed"));
                    self.notifier.send(&alert).await;
                }
                self.note(
                    now,
                    w,
                    v,
                    code::ABORTED_LOGS_FAILED,
                    format!("log collection failed: {why}"),
                    Some(&inc.id),
                    false,
                )
                .await?;
                return Ok(Outcome::Skipped(code::ABORTED_LOGS_FAILED));
            }
        };

        let kind = if self.cfg.dry_run {
            AlertKind::WouldRestart
        } else {
            AlertKind::Restarting
        };
        if self
            .coord
            .set_nx(
                &k.alert_dedup(&inc.id, "restart"),
                &now.to_string(),
                MARK_TTL,
            )
            .await?
        {
            let verb = if self.cfg.dry_run {
                "would restart"
            } else {
                "restarting"
            };
            let mut alert = self.alert_for(
                kind,
                c,
                v,
                status,
                Some(since),
                now,
                format!("{verb} container {} ({})", c.name, short(&c.id)),
            );
            alert.logs = Some(logs);
            alert.incident = Some(inc.id.clone());
            self.notifier.send(&alert).await;
        }

        // Revalidate at the last moment, from fresh data and a fresh clock.
        let now2 = self.coord.time().await?;
        let fresh_status = self.read_status(w).await?;
        let fresh_marks = self.read_marks(w).await?;
        let still_broken = match v {
            Verdict::Errored => fresh_status
                .as_ref()
                .is_some_and(|s| s.state == WorkerState::Error),
            _ => fresh_status
                .as_ref()
                .is_some_and(|s| is_stale(s, now2, &self.cfg.policy)),
        };
        if !still_broken || fresh_marks.cooldown {
            self.coord.del(&[k.incident(w), k.suspect(w)]).await?;
            let why = if fresh_marks.cooldown {
                "a cooldown marker appeared: another instance already restarted it"
            } else {
                "heartbeat fresh again between decision and command; incident closed"
            };
            self.note(
                now2,
                w,
                v,
                code::CANCELLED_RECOVERED,
                why.into(),
                Some(&inc.id),
                false,
            )
            .await?;
            return Ok(Outcome::Skipped(code::CANCELLED_RECOVERED));
        }

        if let Some(why) = self.stand_down(c) {
            self.release_restart_alert(inc).await;
            self.note(
                now2,
                w,
                v,
                code::CANCELLED_NODE_STATE,
                format!("{why} between decision and command; not restarting"),
                Some(&inc.id),
                false,
            )
            .await?;
            return Ok(Outcome::Skipped(code::CANCELLED_NODE_STATE));
        }

        // Compare-and-restart: only the incarnation we observed.
        let current = match self.runtime.inspect(&c.id).await {
            Ok(cur) => cur,
            Err(e) => {
                self.metrics.runtime_errors.inc();
                tracing::warn!(error = %e, worker = w, "inspect before restart failed; not restarting");
                None
            }
        };
        if current.as_ref().map(|x| (&x.id, &x.started_at)) != Some((&c.id, &c.started_at)) {
            self.release_restart_alert(inc).await;
            self.note(
                now2,
                w,
                v,
                code::SKIP_CONTAINER_CHANGED,
                format!(
                    "container {} is not the incarnation observed at decision time",
                    short(&c.id)
                ),
                Some(&inc.id),
                false,
            )
            .await?;
            return Ok(Outcome::Skipped(code::SKIP_CONTAINER_CHANGED));
        }

        if self.cfg.dry_run {
            if let Some(outcome) = self
                .blocked_by_caps(c, v, status, inc, now2, &utc_day(now2), true)
                .await?
            {
                return Ok(outcome);
            }
            // Observe mode leaves the same "this is me" cooldown, so its timeline is the one a
            // real restart would produce; but no restart record, so it never pages an escalation
            // for a restart that did not happen.
            self.coord
                .set(
                    &k.cooldown(w),
                    &format!("{now2}:{}", inc.id),
                    self.cfg.policy.cooldown,
                )
                .await?;
            self.coord.del(&[k.incident(w), k.suspect(w)]).await?;
            self.metrics.restart(reason, "would-restart");
            self.note(
                now2,
                w,
                v,
                code::WOULD_RESTART,
                format!(
                    "would restart container {} ({}) now; observe mode",
                    c.name,
                    short(&c.id)
                ),
                Some(&inc.id),
                false,
            )
            .await?;
            return Ok(Outcome::WouldRestart);
        }

        // NB: the breaker (and fleet budget) are incremented here, immediately before the
        // command, never at pipeline start: a run that failed earlier must not consume budget.
        let now3 = self.coord.time().await?;
        let day = utc_day(now3);
        if let Some(outcome) = self
            .blocked_by_caps(c, v, status, inc, now3, &day, false)
            .await?
        {
            self.release_restart_alert(inc).await;
            return Ok(outcome);
        }

        // The lock must still be ours, with room for the whole restart; checked after every
        // slow step so the margin covers only the writes below.
        let needed = ms(dcfg.restart_timeout + LOCK_MARGIN);
        let lock_left = self.coord.owner_ttl(&k.lock(), token).await;
        let lock_ok = matches!(lock_left, Ok(Some(ttl)) if ttl >= needed);
        // NB: the cooldown marker goes in *before* the command: the booting container will look
        // hung for a minute or more, and the detector must know that this is us.
        let markers = if lock_ok {
            self.write_restart_markers(w, inc, now3).await
        } else {
            Ok(())
        };
        if !lock_ok || markers.is_err() {
            // Nothing will run: give back the units taken just above (best-effort).
            self.refund_caps(&day, now3).await;
            self.release_restart_alert(inc).await;
            markers?;
            let detail = match lock_left? {
                Some(t) => format!("lock has {} left, {} needed", human(t), human(needed)),
                None => "lock lost (expired or taken over)".into(),
            };
            self.note(
                now3,
                w,
                v,
                code::SKIP_LOCK_EXPIRING,
                detail,
                Some(&inc.id),
                false,
            )
            .await?;
            return Ok(Outcome::Skipped(code::SKIP_LOCK_EXPIRING));
        }

        let result = tokio::time::timeout(
            dcfg.restart_timeout,
            self.runtime.restart(&c.id, dcfg.stop_grace),
        )
        .await;
        let call = match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(dcfg.restart_timeout)
            )),
        };
        // NB: verify by the container's start time even when the call failed: a restart whose
        // reply was lost did happen, and treating it as failed would drop the cooldown and let
        // the next cycle restart the booting container again.
        let after = self.runtime.inspect(&c.id).await;
        let restarted = matches!(&after, Ok(Some(a)) if a.started_at != c.started_at && a.running);
        let done = self.coord.time().await.unwrap_or(now3);
        if restarted {
            self.coord.del(&[k.incident(w), k.suspect(w)]).await?;
            self.metrics.restart(reason, "restarted");
            let mut detail = format!(
                "restarted container {} ({}) after {}; cooldown {}",
                c.name,
                short(&c.id),
                human(now3 - since),
                humantime::format_duration(self.cfg.policy.cooldown)
            );
            if let Err(e) = &call {
                detail.push_str(&format!(" (the restart call reported: {e})"));
            }
            self.note(done, w, v, code::RESTARTED, detail, Some(&inc.id), false)
                .await?;
            return Ok(Outcome::Restarted);
        }
        let why = match (call, after) {
            (Err(e), _) => e,
            (Ok(()), Ok(Some(_))) => "the container's start time did not change".to_string(),
            (Ok(()), Ok(None)) => "the container disappeared".to_string(),
            (Ok(()), Err(e)) => format!("could not verify: {e}"),
        };
        self.metrics.runtime_errors.inc();
        self.metrics.restart(reason, "failed");
        // Page first: the deletes below need the coordinator, the page must not.
        let mut alert = self.alert_for(
            AlertKind::RestartFailed,
            c,
            v,
            status,
            Some(since),
            done,
            format!(
                "restart of container {} failed: {why}; will retry next cycle",
                c.name
            ),
        );
        alert.incident = Some(inc.id.clone());
        self.notifier.send(&alert).await;
        // Release the dedup key and the markers so the next cycle retries at once.
        self.coord
            .del(&[
                k.alert_dedup(&inc.id, "restart"),
                k.cooldown(w),
                k.restarted(w),
            ])
            .await?;
        self.note(done, w, v, code::RESTART_FAILED, why, Some(&inc.id), false)
            .await?;
        Ok(Outcome::Failed)
    }

    /// Give back one breaker and one fleet unit taken for a restart that will not run.
    async fn refund_caps(&self, day: &str, now: Millis) {
        let s = &self.cfg.safety;
        if !s.breaker_disabled {
            let _ = self.coord.decr(&self.keys.breaker(day)).await;
        }
        if s.fleet_budget > 0 {
            let window = now.div_euclid(ms(s.fleet_window).max(1));
            let _ = self.coord.decr(&self.keys.fleet_budget(window)).await;
        }
    }

    async fn write_restart_markers(
        &self,
        w: &str,
        inc: &Incident,
        now: Millis,
    ) -> Result<(), CoordError> {
        let k = &self.keys;
        self.coord
            .set(
                &k.cooldown(w),
                &format!("{now}:{}", inc.id),
                self.cfg.policy.cooldown,
            )
            .await?;
        self.coord
            .set(&k.restarted(w), &now.to_string(), MARK_TTL)
            .await?;
        // The error timer must not survive our restart, or a record still saying `error` after
        // the cooldown would count as errored at once instead of after `error_for`.
        self.coord.del(&[k.escalated(w), k.error_since(w)]).await
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}
