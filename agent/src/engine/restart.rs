//! The restart path: carries out the policy's effects against the coordinator, the runtime and
//! the alert sinks, with every safeguard of the brief, in the brief's order:
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
//! plus the fleet-wide budget, fail-closed behaviour and the decision trail. The decisions are
//! the policy's (`crate::policy::restart`, `crate::policy::caps`); this module only executes them,
//! one small step per effect.

use std::time::Duration;

use crate::actions::alert::{Alert, AlertKind};
use crate::clock::{human, ms, Millis};
use crate::config::LOCK_MARGIN;
use crate::coord::{CoordError, Keys, WorkerRead};
use crate::engine::agent::{About, Agent};
use crate::engine::mutant::Mutant;
use crate::model::container::Container;
use crate::model::worker::{Episode, Incident, Marks, Retry, WorkerStatus};
use crate::observe::trail::Code;
use crate::policy::caps;
use crate::policy::restart::{self as policy, restart_due, Cancel, Effect, TimerEnd, Verdict};

/// Marks are garbage-collected after a day even if nobody clears them.
pub(crate) const MARK_TTL: Duration = Duration::from_secs(24 * 3600);
/// The breaker key outlives its UTC day so the count is readable the morning after.
const BREAKER_TTL: Duration = Duration::from_secs(48 * 3600);

/// How one pass of the restart path ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Restarted,
    WouldRestart,
    Failed,
    Skipped(Skip),
}

/// Why the restart path stopped short of the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    LockHeld,
    BreakerOpen,
    BudgetExhausted,
    LockExpiring,
    ContainerChanged,
    /// The container decided on is not running any more (stopped by a person, crashed, or on
    /// CRI replaced by kubelet's next attempt): a restart would start what someone stopped.
    NotRunning,
    Cancelled(Cancel),
    NodeState,
    LogsFailed,
    NotRestartable,
    /// Another instance's restart of this incident failed after our decision: the retry
    /// waits for its backoff.
    RetryPending,
}

impl Skip {
    /// The trail's code for this skip.
    fn code(self) -> Code {
        match self {
            Skip::LockHeld => Code::SkipLockHeld,
            Skip::BreakerOpen => Code::SkipBreakerOpen,
            Skip::BudgetExhausted => Code::SkipBudgetExhausted,
            Skip::LockExpiring => Code::SkipLockExpiring,
            Skip::ContainerChanged => Code::SkipContainerChanged,
            Skip::NotRunning => Code::SkipNotRunning,
            Skip::Cancelled(_) => Code::CancelledRecovered,
            Skip::NodeState => Code::CancelledNodeState,
            Skip::LogsFailed => Code::AbortedLogsFailed,
            Skip::NotRestartable => Code::SkipNotRestartable,
            Skip::RetryPending => Code::SkipRetryPending,
        }
    }
}

/// The worker under evaluation and what this cycle read about it.
pub(crate) struct Case<'a> {
    pub c: &'a Container,
    pub v: Verdict,
    pub status: Option<&'a WorkerStatus>,
    pub marks: &'a Marks,
    /// Why the record could not be read, when it exists but is not a readable hash.
    pub invalid: Option<&'a str>,
}

impl Case<'_> {
    fn worker(&self) -> &str {
        &self.c.worker
    }
    fn about(&self) -> About<'_> {
        About::worker(&self.c.worker, self.v)
    }
}

/// An incident the restart path acts on.
struct Act<'a> {
    case: &'a Case<'a>,
    inc: &'a Incident,
    /// When the broken condition began.
    since: Millis,
}

impl Act<'_> {
    fn about(&self) -> About<'_> {
        self.case.about().incident(&self.inc.id)
    }
}

/// Where the cooldown marker is in [`worker_keys`].
const COOLDOWN_SLOT: usize = 4;
/// Where the incarnation is in [`worker_keys`]; the node lock and the retry record follow it.
const INCARNATION_SLOT: usize = 7 + Episode::ALL.len();
const LOCK_SLOT: usize = INCARNATION_SLOT + 1;
const RETRY_SLOT: usize = INCARNATION_SLOT + 2;

/// The keys a worker's verdict reads besides its record, in one round trip: its marks, then
/// its incarnation, the node lock and the retry record of failed restarts. Public for the
/// fleet benchmark, which replays exactly this read.
pub fn worker_keys(k: &Keys, worker: &str) -> Vec<String> {
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
    keys.push(k.incarnation(worker));
    keys.push(k.lock());
    keys.push(k.retry(worker));
    keys
}

/// The marks of a worker from the values of [`worker_keys`].
fn marks_from(v: &[Option<String>]) -> Marks {
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
    Marks {
        suspect,
        incident,
        error_since: get(2).and_then(|s| s.parse().ok()),
        progress,
        cooldown: get(COOLDOWN_SLOT).is_some(),
        restarted_at: get(5).and_then(|s| s.parse().ok()),
        escalated: get(6).is_some(),
        episodes,
        retry: get(RETRY_SLOT).and_then(|s| parse_retry(&s)),
    }
}

/// `"<incident_id>:<failures>:<not_before_ms>"`.
fn parse_retry(s: &str) -> Option<Retry> {
    let mut parts = s.splitn(3, ':');
    let incident = parts.next()?.to_string();
    let failures = parts.next()?.parse().ok()?;
    let not_before = parts.next()?.parse().ok()?;
    Some(Retry {
        incident,
        failures,
        not_before,
    })
}

fn split_pair(s: &str) -> Option<(Millis, String)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.to_string()))
}

fn random_token() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// What was observed of a restart that did not leave a running new incarnation: the call's
/// answer and what the container looked like afterwards, for the page and the trail.
fn restart_failure(
    call: Result<(), String>,
    after: Result<Option<Container>, crate::runtime::RuntimeError>,
    decided: &Container,
) -> String {
    let observed = match &after {
        Ok(Some(a)) if a.id != decided.id || a.started_at != decided.started_at => {
            "the container started again and exited at once (it is not running)".to_string()
        }
        Ok(Some(_)) => "its start time did not change (it was not restarted)".to_string(),
        Ok(None) => "the container disappeared".to_string(),
        Err(e) => format!("it could not be inspected afterwards ({e})"),
    };
    match call {
        Err(e) => format!("the restart call failed ({e}) and {observed}"),
        Ok(()) => format!("the restart call returned, but {observed}"),
    }
}

/// What the worker read says about its incarnation: the one recorded, the cooldown marker, and
/// whether the node lock is held (by anyone).
struct Seen {
    prev: Option<String>,
    cooling: Option<String>,
    locked: bool,
}

/// Appended to the cooldown marker once our restart is verified.
const DONE: &str = ":done";

/// The cooldown marker of our restart. The incarnation restarted is in it: the next one is
/// ours (see `track_incarnation`).
fn restart_marker(act: &Act<'_>, now: Millis) -> String {
    format!("{now}:{}:{}", act.inc.id, incarnation(act.case.c))
}

/// The incident a restart claim (`"<ms>:<incident>:<incarnation>"`) was made for.
fn claimed_incident(marker: &str) -> Option<&str> {
    marker.split(':').nth(1).filter(|id| !id.is_empty())
}

/// The key of an incarnation: the container id and its start time.
fn incarnation(c: &Container) -> String {
    format!("{}:{}", c.id, c.started_at)
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

impl Agent {
    /// The clock, the record and every mark of a worker, in one round trip.
    pub(crate) async fn read_worker(&self, worker: &str) -> Result<WorkerRead, CoordError> {
        let keys = worker_keys(&self.keys, worker);
        self.coord
            .read_worker(&self.keys.status(worker), &keys)
            .await
    }

    /// The record of a read, or why it cannot be read.
    fn status_of(&self, worker: &str, read: &WorkerRead) -> (Option<WorkerStatus>, Option<String>) {
        // NB: a record Redis refuses to read as a hash (a key of another type, bytes that are
        // not UTF-8) is that worker's problem only: no record (unreachable, one alert naming the
        // key and the problem), and the cycle goes on. Only a transport failure fails closed.
        match &read.record {
            Ok(fields) => (WorkerStatus::from_fields(fields), None),
            Err(detail) => {
                let key = self.keys.status(worker);
                let why = format!("the status record {key} cannot be read: {detail}");
                (None, Some(why))
            }
        }
    }

    fn alert_for(
        &self,
        kind: AlertKind,
        case: &Case<'_>,
        since: Option<Millis>,
        now: Millis,
        detail: impl Into<String>,
    ) -> Alert {
        let mut a = Alert::new(kind, self.keys.node(), detail);
        a.worker = Some(case.c.worker.clone());
        a.container = Some(case.c.display());
        a.verdict = Some(case.v.as_str());
        a.job = case.status.and_then(|s| s.job.clone());
        a.duration = since.map(|t| human(now - t));
        a.dry_run = self.cfg.dry_run;
        a
    }

    /// Evaluate one worker and carry out the policy's effects in order. Coordinator errors abort
    /// the evaluation (fail closed): nothing after a failed read or write is done on stale
    /// knowledge.
    pub(crate) async fn evaluate(
        &mut self,
        c: &Container,
        read: WorkerRead,
    ) -> Result<Verdict, CoordError> {
        let prev = read.values.get(INCARNATION_SLOT).cloned().flatten();
        let cooling = read.values.get(COOLDOWN_SLOT).cloned().flatten();
        let locked = read.values.get(LOCK_SLOT).is_some_and(Option::is_some);
        // A new incarnation changes the marks (its cooldown, dropped timers): read them again
        // (one more round trip, only then).
        let seen = Seen {
            prev,
            cooling,
            locked,
        };
        let read = match self.track_incarnation(c, read.now, seen).await? {
            true => self.read_worker(&c.worker).await?,
            false => read,
        };
        let now = read.now;
        let (status, invalid) = self.status_of(&c.worker, &read);
        let marks = marks_from(&read.values);
        let cfg = &self.cfg.policy;
        let v = policy::verdict(status.as_ref(), &marks, self.node, now, cfg);
        let effects = policy::plan(v, status.as_ref(), &marks, now, cfg);
        self.metrics.verdict(v.as_str());
        let case = Case {
            c,
            v,
            status: status.as_ref(),
            marks: &marks,
            invalid: invalid.as_deref(),
        };
        let mut incident = marks.incident.clone();
        for effect in effects {
            self.apply(&case, effect, &mut incident, now).await?;
        }
        Ok(v)
    }

    /// One effect of the plan. `incident` is the shared timer as this cycle knows it (opened by
    /// `OpenIncident`, read by the alert and the restart).
    async fn apply(
        &mut self,
        case: &Case<'_>,
        effect: Effect,
        incident: &mut Option<Incident>,
        now: Millis,
    ) -> Result<(), CoordError> {
        let k = self.keys.clone();
        let w = case.worker();
        match effect {
            Effect::RecordSuspect { heartbeat } => self.record_suspect(case, heartbeat, now).await,
            Effect::ClearSuspect => self.coord.del(&[k.suspect(w)]).await,
            Effect::MarkErrorSince => self
                .coord
                .set_nx(&k.error_since(w), &now.to_string(), MARK_TTL)
                .await
                .map(drop),
            Effect::ClearErrorSince => self.coord.del(&[k.error_since(w)]).await,
            Effect::RecordProgress(value) => {
                // NB: written with the node's once-per-cycle batch, not a round trip per worker
                // per cycle: progress feeds the stalled alert only, and a cycle that fails
                // before the batch records it on the next.
                let v = format!("{now}:{value}");
                self.deferred.push((k.progress(w), v));
                Ok(())
            }
            Effect::ClearProgress => self.coord.del(&[k.progress(w)]).await,
            Effect::ClearIncident(end) => self.clear_incident(case, end, now).await,
            Effect::ForgetRestart => self.forget_restart(case, now).await,
            Effect::CloseEpisode(e) => self.close_episode(case, e, now).await,
            Effect::OpenEpisode(e) => self.open_episode(case, e, now).await,
            Effect::OpenIncident => {
                *incident = self.open_incident(case, now).await?;
                Ok(())
            }
            Effect::Escalate => self.escalate(case, now).await,
            Effect::AlertIncident => match incident {
                Some(inc) => self.alert_incident(case, inc, now).await,
                None => Ok(()),
            },
            Effect::ConsiderRestart => match incident {
                // NB: a failed restart of this incident is retried only after its backoff.
                Some(inc)
                    if restart_due(case.v, inc.started, now, &self.cfg.policy)
                        && (policy::retry_open(inc, case.marks, now)
                            || self.planted(Mutant::NoRetryBackoff)) =>
                {
                    let since =
                        policy::condition_since(case.v, inc.started, case.marks, case.status);
                    let act = Act { case, inc, since };
                    self.restart_path(&act, now).await.map(drop)
                }
                _ => Ok(()),
            },
        }
    }

    async fn record_suspect(
        &mut self,
        case: &Case<'_>,
        hb: Millis,
        now: Millis,
    ) -> Result<(), CoordError> {
        let key = self.keys.suspect(case.worker());
        self.coord
            .set(&key, &format!("{hb}:{now}"), MARK_TTL)
            .await?;
        let detail = format!(
            "heartbeat {} old; waiting for a second observation",
            human(now - hb)
        );
        self.note(now, case.about(), Code::Suspect, detail).await
    }

    async fn clear_incident(
        &mut self,
        case: &Case<'_>,
        end: TimerEnd,
        now: Millis,
    ) -> Result<(), CoordError> {
        self.coord.del(&[self.keys.incident(case.worker())]).await?;
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
        self.note(now, about, code, why.to_string()).await
    }

    async fn forget_restart(&mut self, case: &Case<'_>, now: Millis) -> Result<(), CoordError> {
        let w = case.worker();
        self.coord
            .del(&[self.keys.restarted(w), self.keys.escalated(w)])
            .await?;
        let detail = "worker healthy after our restart".to_string();
        self.note(now, case.about(), Code::Recovered, detail).await
    }

    async fn close_episode(
        &mut self,
        case: &Case<'_>,
        e: Episode,
        now: Millis,
    ) -> Result<(), CoordError> {
        self.coord
            .del(&[self.keys.episode(case.worker(), e.as_str())])
            .await?;
        let detail = format!("{} condition ended", e.as_str());
        self.note(now, case.about(), Code::EpisodeClosed, detail)
            .await
    }

    async fn open_episode(
        &mut self,
        case: &Case<'_>,
        e: Episode,
        now: Millis,
    ) -> Result<(), CoordError> {
        // The SET NX is the de-duplication: only the first observer alerts.
        let key = self.keys.episode(case.worker(), e.as_str());
        if !self.claim_alert(&key, now, MARK_TTL).await? {
            return Ok(());
        }
        let ahead = case
            .status
            .and_then(|s| policy::heartbeat_from_future(s, now));
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
        self.notifier.send(&alert).await;
        let detail = format!("{} alert sent", kind.as_str());
        self.note(now, case.about(), Code::Alerted, detail).await
    }

    /// Start the incident timer (first observer wins) and read back whoever's start time stands.
    async fn open_incident(
        &mut self,
        case: &Case<'_>,
        now: Millis,
    ) -> Result<Option<Incident>, CoordError> {
        let key = self.keys.incident(case.worker());
        let id = format!("{now:x}-{}", &random_token()[..6]);
        let won = self
            .coord
            .set_nx(&key, &format!("{now}:{id}"), MARK_TTL)
            .await?;
        // Whoever won, everyone reads the same start time back.
        let incident = self
            .coord
            .get_many(&[key])
            .await?
            .pop()
            .flatten()
            .and_then(|s| split_pair(&s))
            .map(|(started, id)| Incident { started, id });
        if let (true, Some(inc)) = (won, &incident) {
            let wait = policy::restart_wait(case.v, &self.cfg.policy);
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

    async fn escalate(&mut self, case: &Case<'_>, now: Millis) -> Result<(), CoordError> {
        let key = self.keys.escalated(case.worker());
        if !self.claim_alert(&key, now, MARK_TTL).await? {
            return Ok(());
        }
        let restarted = case.marks.restarted_at.unwrap_or(now);
        let detail = format!(
            "still broken {} after our restart; the restart did not fix it, a person is needed",
            human(now - restarted)
        );
        let alert = self.alert_for(AlertKind::Escalation, case, Some(restarted), now, detail);
        self.notifier.send(&alert).await;
        let detail = "paged: restart did not recover the worker".to_string();
        self.note(now, case.about(), Code::Escalated, detail).await
    }

    /// The hung / errored alert, once per incident (de-duplicated in the coordinator).
    async fn alert_incident(
        &mut self,
        case: &Case<'_>,
        inc: &Incident,
        now: Millis,
    ) -> Result<(), CoordError> {
        let key = self.keys.alert_dedup(&inc.id, case.v.as_str());
        if !self.claim_alert(&key, now, MARK_TTL).await? {
            return Ok(());
        }
        let kind = if case.v == Verdict::Errored {
            AlertKind::Errored
        } else {
            AlertKind::Hung
        };
        let wait = policy::restart_wait(case.v, &self.cfg.policy);
        let since = policy::condition_since(case.v, inc.started, case.marks, case.status);
        let detail = format!(
            "restart due in {}",
            human((inc.started + ms(wait) - now).max(0))
        );
        let mut alert = self.alert_for(kind, case, Some(since), now, detail);
        alert.incident = Some(inc.id.clone());
        if !self.gpu_evidence.is_empty() {
            // Application XIDs on the worker's GPU do not make the hardware unhealthy, but
            // they are the first thing a person wants to see next to a hang.
            alert
                .detail
                .push_str(&format!("; GPU evidence: {}", self.gpu_evidence.join("; ")));
        }
        self.notifier.send(&alert).await;
        let detail = format!("{} alert sent", kind.as_str());
        let about = case.about().incident(&inc.id);
        self.note(now, about, Code::Alerted, detail).await
    }

    /// A new incarnation of the container that we did not start (an operator's `docker
    /// restart`, Docker's restart policy) boots just like ours and looks just as hung: it gets
    /// the same cooldown marker, and any timer of the previous incarnation is dropped.
    /// True when anything was written (the marks read before are stale then).
    async fn track_incarnation(
        &mut self,
        c: &Container,
        now: Millis,
        read: Seen,
    ) -> Result<bool, CoordError> {
        let Seen {
            prev,
            cooling,
            locked,
        } = read;
        let k = self.keys.clone();
        let w = c.worker.as_str();
        let seen = incarnation(c);
        if prev.as_deref() == Some(seen.as_str()) {
            return Ok(false);
        }
        // Our own restart of exactly the previous incarnation left a marker saying so: the new
        // incarnation is ours, and its cooldown began with the command.
        // Ours: a restart of exactly the previous incarnation, seen through (`:done`). Claimed:
        // an instance claimed that restart and never recorded its outcome (it died, or failed
        // closed, mid-command): its command may have run, or someone else's restart came
        // instead. Either way the new incarnation gets a full cooldown of its own.
        let marked = |suffix: String| cooling.as_ref().is_some_and(|m| m.ends_with(&suffix));
        let ours = |p: &str| marked(format!(":{p}{DONE}"));
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
            // NB: anyone else's restart (an operator's, Docker's restart policy, kubelet's) gets
            // a full cooldown from its own start, even one that lands inside our cooldown. The
            // marker goes in *before* the incarnation is recorded: a write that fails (or a
            // crash) in between must leave the next cycle to find the new incarnation again,
            // never a recorded incarnation without its cooldown.
            let cooldown = self.cfg.policy.cooldown;
            let marker = format!("{now}:external");
            self.coord.set(&k.cooldown(w), &marker, cooldown).await?;
            self.coord
                .del(&[k.incident(w), k.suspect(w), k.error_since(w)])
                .await?;
        }
        self.coord.set(&k.incarnation(w), &seen, MARK_TTL).await?;
        if !external {
            return Ok(true);
        }
        let cooldown = humantime::format_duration(self.cfg.policy.cooldown);
        let about = About::worker(w, Verdict::Booting);
        if unfinished {
            // NB: ours, finished by the survivor: the incident the claim names is kept, so
            // the trail reads as one restart of one incident, never as "outside Vigil".
            let incident = cooling.as_deref().and_then(claimed_incident);
            let about = match incident {
                Some(id) => about.incident(id),
                None => about,
            };
            let detail = format!(
                "container {} runs a new incarnation after a restart claimed by an instance that did not record its outcome (it stopped mid-command; its restart ran); recorded for it, treated as booting for {cooldown}",
                short(&c.id)
            );
            self.note(now, about, Code::Restarted, detail).await?;
            return Ok(true);
        }
        let detail = format!(
            "container {} restarted outside Vigil; treated as booting for {cooldown}",
            short(&c.id)
        );
        self.note(now, about, Code::ExternalRestart, detail).await?;
        Ok(true)
    }

    /// Steps 2–8 of the pipeline. Always releases the lock it took.
    async fn restart_path(&mut self, act: &Act<'_>, now: Millis) -> Result<Outcome, CoordError> {
        if let Err(why) = self.runtime.restartable(act.case.c).await {
            self.not_restartable(act, now, why).await?;
            return Ok(Outcome::Skipped(Skip::NotRestartable));
        }
        // Cheap early checks, so an open breaker does not collect logs and post a restart alert.
        // The authoritative check is the atomic increment right before the command.
        if let Some(skip) = self.blocked_by_caps(act, now, true).await? {
            return Ok(Outcome::Skipped(skip));
        }
        let lock = self.keys.lock();
        let token = random_token();
        let took = match self
            .coord
            .set_nx(&lock, &token, self.cfg.safety.lock_ttl)
            .await
        {
            Ok(took) => took,
            Err(e) => {
                // NB: the SET may have been applied with its reply lost: release by token.
                let _ = self.coord.del_if_owner(&lock, &token).await;
                return Err(e);
            }
        };
        if !took && !self.planted(Mutant::NoLock) {
            let detail = "another instance holds this node's lock; it acts, we skip".to_string();
            self.skip(now, act, Skip::LockHeld, detail, true).await?;
            return Ok(Outcome::Skipped(Skip::LockHeld));
        }
        let result = self.locked_restart(act, &token).await;
        // Release only our own lock (compare-and-delete), whatever happened above.
        if let Err(e) = self.coord.del_if_owner(&lock, &token).await {
            tracing::warn!(error = %e, "could not release the node lock; it expires by its TTL");
        }
        result
    }

    /// The runtime refuses this worker: page once per incident, say so in the trail once.
    async fn not_restartable(
        &mut self,
        act: &Act<'_>,
        now: Millis,
        why: String,
    ) -> Result<(), CoordError> {
        let key = self.keys.alert_dedup(&act.inc.id, "not-restartable");
        if self.claim_alert(&key, now, MARK_TTL).await? {
            let detail = format!("{why}; not restarting, a person must decide");
            let mut alert = self.alert_for(
                AlertKind::NotRestartable,
                act.case,
                Some(act.since),
                now,
                detail,
            );
            alert.incident = Some(act.inc.id.clone());
            self.notifier.send(&alert).await;
        }
        self.skip(now, act, Skip::NotRestartable, why, true).await
    }

    /// Write a skip to the trail (with `once`, the first time per incident only).
    async fn skip(
        &mut self,
        at: Millis,
        act: &Act<'_>,
        skip: Skip,
        detail: String,
        once: bool,
    ) -> Result<(), CoordError> {
        let about = if once {
            act.about().once()
        } else {
            act.about()
        };
        self.note(at, about, skip.code(), detail).await
    }

    /// The breaker, then the fleet budget. With `peek` (or in observe mode) only reads them;
    /// otherwise takes one unit of each atomically (and gives the breaker's back when the budget
    /// refuses).
    async fn blocked_by_caps(
        &mut self,
        act: &Act<'_>,
        now: Millis,
        peek: bool,
    ) -> Result<Option<Skip>, CoordError> {
        let read_only = peek || self.cfg.dry_run;
        if self.breaker_refuses(now, read_only).await? {
            self.breaker_open(act, now).await?;
            return Ok(Some(Skip::BreakerOpen));
        }
        if !self.budget_refuses(now, read_only).await? {
            return Ok(None);
        }
        if !read_only && !self.cfg.safety.breaker_disabled {
            // The breaker unit was taken just above for a restart that will not run: give it back.
            let day = caps::breaker_day(now);
            self.coord.decr(&self.keys.breaker(&day)).await?;
        }
        self.budget_exhausted(act, now).await?;
        Ok(Some(Skip::BudgetExhausted))
    }

    /// Whether the breaker refuses a restart now (taking a unit unless `read_only`).
    async fn breaker_refuses(&self, now: Millis, read_only: bool) -> Result<bool, CoordError> {
        let s = &self.cfg.safety;
        if s.breaker_disabled {
            return Ok(false);
        }
        let key = self.keys.breaker(&caps::breaker_day(now));
        let refused = if read_only {
            let used = self.coord.counter(&key).await?;
            caps::breaker_open(used, s)
        } else {
            let cap = u64::from(s.breaker_per_day);
            let taken = self.coord.incr_capped(&key, cap, BREAKER_TTL).await?;
            taken.is_none()
        };
        Ok(refused && !self.planted(Mutant::BreakerIgnored))
    }

    /// Whether the fleet budget refuses a restart now (taking a unit unless `read_only`).
    async fn budget_refuses(&self, now: Millis, read_only: bool) -> Result<bool, CoordError> {
        let s = &self.cfg.safety;
        if s.fleet_budget == 0 {
            return Ok(false);
        }
        let key = self
            .keys
            .fleet_budget(caps::fleet_window(now, s.fleet_window));
        if read_only {
            let used = self.coord.counter(&key).await?;
            return Ok(caps::budget_exhausted(used, s));
        }
        let cap = u64::from(s.fleet_budget);
        Ok(self
            .coord
            .incr_capped(&key, cap, s.fleet_window * 2)
            .await?
            .is_none())
    }

    async fn breaker_open(&mut self, act: &Act<'_>, now: Millis) -> Result<(), CoordError> {
        let per_day = self.cfg.safety.breaker_per_day;
        let day = caps::breaker_day(now);
        let key = self.keys.breaker_alert(&day);
        if self.claim_alert(&key, now, BREAKER_TTL).await? {
            let alert = self.alert_for(AlertKind::BreakerOpen, act.case, None, now, format!(
                "circuit breaker open: {per_day} restart(s) already on this node today (UTC {day}); automation stopped, alert only until tomorrow"
            ));
            self.notifier.send(&alert).await;
        }
        let detail = format!("breaker open: {per_day} restarts used today ({day})");
        self.skip(now, act, Skip::BreakerOpen, detail, true).await
    }

    async fn budget_exhausted(&mut self, act: &Act<'_>, now: Millis) -> Result<(), CoordError> {
        let s = &self.cfg.safety;
        let (budget, window) = (s.fleet_budget, s.fleet_window);
        let key = self
            .keys
            .fleet_budget_alert(caps::fleet_window(now, window));
        if self.claim_alert(&key, now, window * 2).await? {
            let alert = self.alert_for(AlertKind::BudgetExhausted, act.case, None, now, format!(
                "fleet restart budget exhausted: {budget} restart(s) across the fleet in this {} window; no restart anywhere until it ends (a systemic cause is likely)",
                humantime::format_duration(window)
            ));
            self.notifier.send(&alert).await;
        }
        let detail = format!(
            "fleet budget of {budget} per {} exhausted",
            humantime::format_duration(window)
        );
        self.skip(now, act, Skip::BudgetExhausted, detail, true)
            .await
    }

    /// Release the restart alert's dedup key after a skip, so the restart that eventually runs
    /// for this incident alerts (with its logs) again.
    async fn release_restart_alert(&self, inc: &Incident) {
        let _ = self
            .coord
            .del(&[self.keys.alert_dedup(&inc.id, "restart")])
            .await;
    }

    /// Under the lock: logs, alert, revalidation, compare, caps, lock check, command. Each step
    /// either lets the next run or ends the pass with its outcome (and says why in the trail).
    async fn locked_restart(&mut self, act: &Act<'_>, token: &str) -> Result<Outcome, CoordError> {
        let now = self.coord.time().await?;
        // Logs first: a run that fails here must not consume the breaker.
        let logs = match self.collect_logs(act, now).await? {
            Ok(logs) => logs,
            Err(skip) => return Ok(Outcome::Skipped(skip)),
        };
        self.announce_restart(act, logs, now).await?;
        if let Some(skip) = self.last_moment_checks(act).await? {
            return Ok(Outcome::Skipped(skip));
        }
        if self.cfg.dry_run {
            return self.observe_only(act).await;
        }
        // NB: the breaker (and fleet budget) are incremented here, immediately before the
        // command, never at pipeline start: a run that failed earlier must not consume budget.
        let now = self.coord.time().await?;
        if let Some(skip) = self.blocked_by_caps(act, now, false).await? {
            self.release_restart_alert(act.inc).await;
            return Ok(Outcome::Skipped(skip));
        }
        if let Some(skip) = self.hold_lock_and_mark(act, token, now).await? {
            return Ok(Outcome::Skipped(skip));
        }
        // NB: once more right before the command: the increments and marker writes above are
        // round trips, and a person's restart, stop or pause (or a maintenance notice) in that
        // time must stop us. What is left is the window between this inspect and the command.
        if let Some(skip) = self.node_and_container_checks(act, now).await? {
            self.unclaim(act, now).await;
            return Ok(Outcome::Skipped(skip));
        }
        self.run_restart(act, now).await
    }

    /// Undo `hold_lock_and_mark` for a restart that will not run: our cooldown claim and
    /// restart record go, and the breaker and budget units come back (best-effort).
    async fn unclaim(&self, act: &Act<'_>, now: Millis) {
        let (k, w) = (&self.keys, act.case.worker());
        let _ = self.coord.del(&[k.cooldown(w), k.restarted(w)]).await;
        self.refund_caps(now).await;
    }

    /// The container's last lines for the alert. `Err(skip)`: collection failed, so there is
    /// no restart this cycle (and no budget consumed).
    async fn collect_logs(
        &mut self,
        act: &Act<'_>,
        now: Millis,
    ) -> Result<Result<String, Skip>, CoordError> {
        let d = &self.cfg.runtime;
        let call = tokio::time::timeout(
            d.log_timeout,
            self.runtime.logs(&act.case.c.id, d.log_lines),
        );
        let why = match call.await {
            Ok(Ok(logs)) => return Ok(Ok(logs)),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!(
                "no answer within {}",
                humantime::format_duration(d.log_timeout)
            ),
        };
        self.metrics.backends.runtime_error();
        let key = self.keys.alert_dedup(&act.inc.id, "logs-failed");
        if self.claim_alert(&key, now, MARK_TTL).await? {
            let alert = self.alert_for(AlertKind::LogsFailed, act.case, Some(act.since), now, format!("log collection failed ({why}); restart not attempted, retrying next cycle; breaker not consumed"));
            self.notifier.send(&alert).await;
        }
        let detail = format!("log collection failed: {why}");
        self.skip(now, act, Skip::LogsFailed, detail, false).await?;
        Ok(Err(Skip::LogsFailed))
    }

    /// The restart (or would-restart) alert with the logs, once per incident.
    async fn announce_restart(
        &mut self,
        act: &Act<'_>,
        logs: String,
        now: Millis,
    ) -> Result<(), CoordError> {
        let key = self.keys.alert_dedup(&act.inc.id, "restart");
        if !self.claim_alert(&key, now, MARK_TTL).await? {
            return Ok(());
        }
        let (kind, verb) = if self.cfg.dry_run {
            (AlertKind::WouldRestart, "would restart")
        } else {
            (AlertKind::Restarting, "restarting")
        };
        let c = act.case.c;
        let detail = format!("{verb} container {} ({})", c.name, short(&c.id));
        let mut alert = self.alert_for(kind, act.case, Some(act.since), now, detail);
        alert.logs = Some(logs);
        alert.incident = Some(act.inc.id.clone());
        self.notifier.send(&alert).await;
        Ok(())
    }

    /// Revalidate at the last moment, from fresh data and a fresh clock; then the node's state
    /// (shutdown, maintenance, GPU) and the incarnation. `Some(skip)` ends the pass.
    async fn last_moment_checks(&mut self, act: &Act<'_>) -> Result<Option<Skip>, CoordError> {
        let w = act.case.worker();
        let (now, checked) = if self.planted(Mutant::NoRevalidation) {
            (self.coord.time().await?, Ok(()))
        } else {
            // A fresh clock, record and marks, in one round trip.
            let fresh = self.read_worker(w).await?;
            let (status, _) = self.status_of(w, &fresh);
            let marks = marks_from(&fresh.values);
            let cfg = &self.cfg.policy;
            let checked =
                policy::revalidate(act.case.v, act.inc, status.as_ref(), &marks, fresh.now, cfg);
            (fresh.now, checked)
        };
        let (cancel, why) = match checked {
            Ok(()) => return self.node_and_container_checks(act, now).await,
            Err(Cancel::RetryPending) => {
                // NB: the incident stands (it is still hung): only this pass ends, and the
                // retry alerts again with its logs.
                self.release_restart_alert(act.inc).await;
                let why = "a restart of this incident failed after our decision (another instance's); the retry waits for its backoff".to_string();
                self.skip(now, act, Skip::RetryPending, why, false).await?;
                return Ok(Some(Skip::RetryPending));
            }
            Err(c @ Cancel::CooldownAppeared) => (
                c,
                "a cooldown marker appeared: another instance already restarted it",
            ),
            Err(c @ Cancel::Recovered) => (
                c,
                "heartbeat fresh again between decision and command; incident closed",
            ),
        };
        let k = &self.keys;
        self.coord.del(&[k.incident(w), k.suspect(w)]).await?;
        let skip = Skip::Cancelled(cancel);
        self.skip(now, act, skip, why.into(), false).await?;
        Ok(Some(skip))
    }

    /// The node's state (shutdown, maintenance, GPU) and compare-and-restart: checked after
    /// revalidation, and again right before the command. `Some(skip)` ends the pass.
    async fn node_and_container_checks(
        &mut self,
        act: &Act<'_>,
        now: Millis,
    ) -> Result<Option<Skip>, CoordError> {
        if let Some(why) = self.stand_down(act.case.c, now) {
            self.release_restart_alert(act.inc).await;
            let detail = format!("{why} between decision and command; not restarting");
            self.skip(now, act, Skip::NodeState, detail, false).await?;
            return Ok(Some(Skip::NodeState));
        }
        if let Some(skip) = self.compare(act.case.c).await {
            self.release_restart_alert(act.inc).await;
            let c = act.case.c;
            let detail = match skip {
                Skip::NotRunning => format!(
                    "container {} ({}) is not running any more; not starting what someone stopped",
                    c.display(),
                    short(&c.id)
                ),
                _ => format!(
                    "container {} is not the incarnation observed at decision time",
                    short(&c.id)
                ),
            };
            self.skip(now, act, skip, detail, false).await?;
            return Ok(Some(skip));
        }
        Ok(None)
    }

    /// Compare-and-restart: the container is still the incarnation we decided on, and it is
    /// running (a stopped or paused one is someone's decision). `Some(skip)` when it is not.
    async fn compare(&self, c: &Container) -> Option<Skip> {
        if self.planted(Mutant::NoCompare) {
            return None;
        }
        match self.runtime.inspect(&c.id).await {
            Ok(Some(cur)) if cur.id == c.id && cur.started_at == c.started_at => {
                (!cur.running).then_some(Skip::NotRunning)
            }
            Ok(_) => Some(Skip::ContainerChanged),
            Err(e) => {
                self.metrics.backends.runtime_error();
                tracing::warn!(error = %e, worker = %c.worker, "inspect before restart failed; not restarting");
                Some(Skip::ContainerChanged)
            }
        }
    }

    /// Observe mode: everything a real restart would do except the command and the restart
    /// record.
    async fn observe_only(&mut self, act: &Act<'_>) -> Result<Outcome, CoordError> {
        let now = self.coord.time().await?;
        if let Some(skip) = self.blocked_by_caps(act, now, true).await? {
            return Ok(Outcome::Skipped(skip));
        }
        // Observe mode leaves the same "this is me" cooldown, so its timeline is the one a
        // real restart would produce; but no restart record, so it never pages an escalation
        // for a restart that did not happen.
        let (k, w) = (&self.keys, act.case.worker());
        let marker = format!("{now}:{}", act.inc.id);
        self.coord
            .set(&k.cooldown(w), &marker, self.cfg.policy.cooldown)
            .await?;
        self.coord.del(&[k.incident(w), k.suspect(w)]).await?;
        self.metrics.restart(act.case.v.as_str(), "would-restart");
        let c = act.case.c;
        let detail = format!(
            "would restart container {} ({}) now; observe mode",
            c.name,
            short(&c.id)
        );
        self.note(now, act.about(), Code::WouldRestart, detail)
            .await?;
        Ok(Outcome::WouldRestart)
    }

    /// The lock must still be ours, with room for the whole restart; checked after every slow
    /// step so the margin covers only the writes below. Then the markers go in — *before* the
    /// command: the booting container will look hung for a minute or more, and the detector
    /// must know that this is us. `Some(skip)`: nothing will run, and the units are given back.
    async fn hold_lock_and_mark(
        &mut self,
        act: &Act<'_>,
        token: &str,
        now: Millis,
    ) -> Result<Option<Skip>, CoordError> {
        let needed = self.cfg.runtime.restart_timeout + LOCK_MARGIN;
        let left = self.coord.owner_ttl(&self.keys.lock(), token).await;
        let lock_ok =
            self.planted(Mutant::NoLock) || matches!(left, Ok(l) if caps::lock_covers(l, needed));
        let claimed = match lock_ok {
            true => Some(self.write_restart_markers(act, now).await),
            false => None,
        };
        if matches!(claimed, Some(Ok(true))) {
            return Ok(None);
        }
        // Nothing will run: give back the units taken just above (best-effort).
        self.refund_caps(now).await;
        self.release_restart_alert(act.inc).await;
        if let Some(claim) = claimed {
            claim?;
            // The claim failed: another instance's marker appeared after our revalidation.
            let skip = Skip::Cancelled(Cancel::CooldownAppeared);
            let detail = "another instance's cooldown marker appeared after revalidation (it restarted this worker past a lost lock); not restarting".to_string();
            self.skip(now, act, skip, detail, false).await?;
            return Ok(Some(skip));
        }
        let detail = match left? {
            Some(t) => format!("lock has {} left, {} needed", human(t), human(ms(needed))),
            None => "lock lost (expired or taken over)".into(),
        };
        self.skip(now, act, Skip::LockExpiring, detail, false)
            .await?;
        Ok(Some(Skip::LockExpiring))
    }

    /// The command, then its verification by the container's start time.
    async fn run_restart(&mut self, act: &Act<'_>, now: Millis) -> Result<Outcome, CoordError> {
        let d = &self.cfg.runtime;
        let c = act.case.c;
        let result =
            tokio::time::timeout(d.restart_timeout, self.runtime.restart(c, d.stop_grace)).await;
        let call = match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(d.restart_timeout)
            )),
        };
        // NB: verify by the container's start time even when the call failed: a restart whose
        // reply was lost did happen, and treating it as failed would drop the cooldown and let
        // the next cycle restart the booting container again.
        let after = self.runtime.successor(c).await;
        let restarted = matches!(&after, Ok(Some(a))
            if (a.id != c.id || a.started_at != c.started_at) && a.running);
        let done = self.coord.time().await.unwrap_or(now);
        if restarted {
            return self.restarted(act, call.err(), now, done).await;
        }
        let why = restart_failure(call, after, c);
        self.restart_failed(act, why, done).await
    }

    async fn restarted(
        &mut self,
        act: &Act<'_>,
        call_error: Option<String>,
        started: Millis,
        done: Millis,
    ) -> Result<Outcome, CoordError> {
        let (k, w, c) = (&self.keys, act.case.worker(), act.case.c);
        self.coord.del(&[k.incident(w), k.suspect(w)]).await?;
        // NB: the cooldown runs from the restart, not from the claim before it: a pause between
        // the two, or a slow restart, must not shorten it. Same marker, fresh TTL.
        let cooldown = self.cfg.policy.cooldown;
        let marker = format!("{}{DONE}", restart_marker(act, started));
        self.coord.set(&k.cooldown(w), &marker, cooldown).await?;
        self.metrics.restart(act.case.v.as_str(), "restarted");
        let mut detail = format!(
            "restarted container {} ({}) after {}; cooldown {}",
            c.name,
            short(&c.id),
            human(started - act.since),
            humantime::format_duration(self.cfg.policy.cooldown)
        );
        if let Some(e) = call_error {
            detail.push_str(&format!(" (the restart call reported: {e})"));
        }
        self.note(done, act.about(), Code::Restarted, detail)
            .await?;
        Ok(Outcome::Restarted)
    }

    /// A failed restart pages at once — the first of its incident; later ones update that
    /// page without paging again — and releases the dedup key and markers so that a later
    /// cycle retries, after a backoff from the stop grace (see [`policy::retry_backoff`]).
    async fn restart_failed(
        &mut self,
        act: &Act<'_>,
        why: String,
        done: Millis,
    ) -> Result<Outcome, CoordError> {
        self.metrics.backends.runtime_error();
        self.metrics.restart(act.case.v.as_str(), "failed");
        let (k, w) = (self.keys.clone(), act.case.worker());
        let failures = match &act.case.marks.retry {
            Some(r) if r.incident == act.inc.id => r.failures.saturating_add(1),
            _ => 1,
        };
        let p = &self.cfg.policy;
        let wait = policy::retry_backoff(failures, self.cfg.runtime.stop_grace, p.cooldown);
        let retry = Retry {
            incident: act.inc.id.clone(),
            failures,
            not_before: done + ms(wait),
        };
        let detail = format!(
            "restart of container {} failed (attempt {failures} of this incident): {why}; retried in {} while it is hung and running",
            act.case.c.name,
            human(ms(wait))
        );
        // NB: the page goes out even when the coordinator fails below: a failed restart is a
        // person's business at once. Only the first failure of an incident pages; a failed
        // claim (the coordinator is down) pages too, since a repeat beats silence.
        let first = self
            .claim_alert(
                &k.alert_dedup(&act.inc.id, "restart-failed"),
                done,
                MARK_TTL,
            )
            .await
            .unwrap_or(true);
        let mut alert = self.alert_for(
            AlertKind::RestartFailed,
            act.case,
            Some(act.since),
            done,
            detail,
        );
        alert.incident = Some(act.inc.id.clone());
        alert.attempt = Some(failures);
        if !first {
            alert.page = false;
            alert.update = true;
        }
        self.notifier.send(&alert).await;
        let value = format!("{}:{}:{}", retry.incident, retry.failures, retry.not_before);
        self.coord.set(&k.retry(w), &value, MARK_TTL).await?;
        self.coord
            .del(&[
                k.alert_dedup(&act.inc.id, "restart"),
                k.cooldown(w),
                k.restarted(w),
            ])
            .await?;
        let why = format!(
            "{why}; attempt {failures}, next not before {}",
            human(ms(wait))
        );
        self.note(done, act.about(), Code::RestartFailed, why)
            .await?;
        Ok(Outcome::Failed)
    }

    /// Give back one breaker and one fleet unit taken for a restart that will not run.
    async fn refund_caps(&self, now: Millis) {
        let s = &self.cfg.safety;
        if !s.breaker_disabled {
            let day = caps::breaker_day(now);
            let _ = self.coord.decr(&self.keys.breaker(&day)).await;
        }
        if s.fleet_budget > 0 {
            let window = caps::fleet_window(now, s.fleet_window);
            let _ = self.coord.decr(&self.keys.fleet_budget(window)).await;
        }
    }

    /// Claim the restart with the cooldown marker and record it. `false`: the claim failed.
    async fn write_restart_markers(&self, act: &Act<'_>, now: Millis) -> Result<bool, CoordError> {
        let (k, w) = (&self.keys, act.case.worker());
        let marker = restart_marker(act, now);
        // NB: a claim (SET NX), not a plain write. Revalidation saw no marker, so one here now
        // is another instance's restart that got past a lost lock (TTL expiry in a pause, a
        // failover that forgot it): the first claim wins, and at most one restart runs per
        // cooldown whatever happened to the lock.
        // NB: the claim outlives our lock. Should we die mid-command, the instance that finds
        // the new incarnation once our lock has expired must still find the claim, or it would
        // record our restart as someone else's. The cooldown proper runs from the verification,
        // which rewrites the marker with the cooldown as its TTL.
        let claim_ttl = self.cfg.policy.cooldown + self.cfg.safety.lock_ttl;
        if !self
            .coord
            .set_nx(&k.cooldown(w), &marker, claim_ttl)
            .await?
        {
            return Ok(false);
        }
        self.coord
            .set(&k.restarted(w), &now.to_string(), MARK_TTL)
            .await?;
        // The error timer must not survive our restart, or a record still saying `error` after
        // the cooldown would count as errored at once instead of after `error_for`.
        self.coord.del(&[k.escalated(w), k.error_since(w)]).await?;
        Ok(true)
    }
}
