//! The restart decision: `(worker record, shared marks, node context, now) -> verdict -> plan`.
//!
//! No I/O and no clock reads: `now` is the coordinator's clock (Redis `TIME`), handed in. Every rule
//! of the restart pipeline that can be decided from data lives here, so it is a table-driven test.
//! The engine (`crate::hang::restart`) carries the plan out against the coordinator, the container
//! runtime and the alert sinks.
//!
//! NB: detection and remediation are bound to the *same* predicate. The verdict that raises the
//! "hung" alert is the verdict that makes the restart due; there is no second definition of a hang.

use strum::VariantArray;

use crate::clock::{ms, Millis};
use crate::config::PolicyConfig;
pub use crate::hang::model::Verdict;
use crate::hang::model::{Episode, Fruitless, Marks, WorkerState, WorkerStatus};
use crate::hang::policy_due::retry_open;
use crate::hang::policy_fruitless::{progressed, same_job, Beat};
use crate::hang::policy_record::{heartbeat_from_future, is_stale, watched, MAX_FUTURE};

/// Who acts on a verdict; its message is the action column of `vigil policy`
/// (`crate::hang::policy_table`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumMessage)]
pub enum Action {
    /// Nothing to do.
    #[strum(message = "nothing")]
    None,
    /// Record the sighting and wait for confirmation.
    #[strum(message = "record the sighting; wait for the confirming observation")]
    Observe,
    /// The restart pipeline, behind every safeguard.
    #[strum(message = "restart pipeline (timer, lock, revalidate, breaker, budget, cooldown)")]
    RestartPipeline,
    /// Alert once; never restart.
    #[strum(message = "alert once per episode; never restart")]
    AlertOnly,
    /// Alert once; never restart; the hardware needs a person (optional taint).
    #[strum(message = "alert once; never restart (a restart cannot fix hardware)")]
    AlertNoRestart,
    /// Suppress: clear any persistence timer, act on nothing.
    #[strum(message = "nobody: clear the persistence timer (this is us)")]
    SuppressAndClear,
    /// Checkpoint path (maintenance issue); restarts suppressed, timers cleared.
    #[strum(message = "checkpoint path; no restart; timers cleared")]
    Checkpoint,
}

impl Verdict {
    pub fn action(self) -> Action {
        use Verdict::*;
        match self {
            Healthy | ErrorPending => Action::None,
            Suspect => Action::Observe,
            Hung | Errored => Action::RestartPipeline,
            Unreachable | Stalled | Paused | Exited => Action::AlertOnly,
            GpuFailed | TpuFailed => Action::AlertNoRestart,
            Booting => Action::SuppressAndClear,
            InMaintenance => Action::Checkpoint,
        }
    }
}

/// What the node itself says, from other sources (metadata server, NVML).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct NodeContext {
    pub(crate) in_maintenance: bool,
    pub(crate) gpu_failed: bool,
    /// The node's TPU health is `failed` (a chip gone, a fatal device error): a TPU worker needs
    /// every chip of its host, so no worker of the node can be fixed by a restart.
    pub(crate) tpu_failed: bool,
    /// The worker's container is paused by someone: an operator's decision.
    pub(crate) container_paused: bool,
    /// The worker's container has exited (stopped by someone, or crashed with no restart
    /// policy): reported, never started by Vigil.
    pub(crate) container_exited: bool,
    /// When the worker's container started (ms, the node's clock), when the runtime says.
    pub(crate) container_started: Option<Millis>,
}

/// The verdict, from the shared record and shared marks only.
pub(crate) fn verdict(
    status: Option<&WorkerStatus>,
    marks: &Marks,
    node: NodeContext,
    now: Millis,
    cfg: &PolicyConfig,
) -> Verdict {
    // NB: a new container has `start_grace` to write its first record; a record older than the
    // container is its predecessor's, not its own. The start is the node's clock: one far ahead
    // of the store's (beyond `MAX_FUTURE`) is not believed.
    let starting = node.container_started.is_some_and(|t| {
        (-ms(MAX_FUTURE)..ms(cfg.start_grace)).contains(&(now - t))
            && status.and_then(|s| s.heartbeat).is_none_or(|hb| hb < t)
    });
    // What the marks and the node say wins over the record, the first that holds.
    let overrides = [
        (marks.cooldown, Verdict::Booting),
        (node.in_maintenance, Verdict::InMaintenance),
        // NB: a paused container is someone's decision: its stale heartbeat is not a hang.
        (node.container_paused, Verdict::Paused),
        (node.container_exited, Verdict::Exited),
        (starting, Verdict::Booting),
    ];
    if let Some((_, v)) = overrides.into_iter().find(|&(on, _)| on) {
        return v;
    }
    // NB: a heartbeat far in the future makes the record invalid: it would look fresh for ever.
    let valid = status.filter(|s| heartbeat_from_future(s, now).is_none());
    let Some(status) = valid else { return Verdict::Unreachable };
    match status.state {
        WorkerState::Processing | WorkerState::Other(_) => working(status, marks, node, now, cfg),
        WorkerState::Error => match marks.error_since {
            Some(t) if now - t >= ms(cfg.error_for) => hardware(node).unwrap_or(Verdict::Errored),
            _ => Verdict::ErrorPending,
        },
        WorkerState::Idle => Verdict::Healthy,
    }
}

/// The verdict on a working record (`processing`, or any state but `idle` and `error`): its
/// silence and its progress.
fn working(
    status: &WorkerStatus,
    marks: &Marks,
    node: NodeContext,
    now: Millis,
    cfg: &PolicyConfig,
) -> Verdict {
    let Some(hb) = status.heartbeat else { return Verdict::Unreachable };
    if is_stale(status, now, cfg) {
        // Confirmed only by a second observation of the *same* stale heartbeat, made at least
        // `confirm_after` after the first (by this or any other instance).
        let confirmed = matches!(marks.suspect,
            Some((seen_hb, seen_at)) if seen_hb == hb && now - seen_at >= ms(cfg.confirm_after));
        let hang = if confirmed { Verdict::Hung } else { Verdict::Suspect };
        return hardware(node).unwrap_or(hang);
    }
    // NB: a frozen marker is a stall only while processing: a long `compile` moves none.
    let frozen = status.state == WorkerState::Processing
        && matches!((&status.progress, &marks.progress),
        (Some(p), Some((seen, since))) if p == seen && now - since >= ms(cfg.stalled_after));
    if frozen {
        Verdict::Stalled
    } else {
        Verdict::Healthy
    }
}

/// The accelerator under a hung or errored worker has failed (its GPU, or the node's TPU): a
/// restart cannot fix hardware.
fn hardware(node: NodeContext) -> Option<Verdict> {
    node.gpu_failed.then_some(Verdict::GpuFailed).or(node.tpu_failed.then_some(Verdict::TpuFailed))
}

/// Why an incident timer is closed (the trail says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimerEnd {
    /// Our own restart is booting: the cooldown marker stands.
    Booting,
    /// The node is in maintenance: no restarts, and no timer may survive it.
    Maintenance,
    /// The data says the worker is fine again.
    Recovered,
    /// The container is paused: someone's decision; a new timer starts if it hangs once running.
    Paused,
}

/// One step of a cycle's bookkeeping or action. [`plan`] returns them in the order the engine
/// carries them out; each is one small function there (`crate::hang::restart`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Record this stale heartbeat as the first sighting (SET, with when it was seen).
    RecordSuspect { heartbeat: Millis },
    /// Forget the recorded sighting: the record is not stale and the silence is broken (the
    /// worker beat again, or there is no record at all, or one without a heartbeat or in a state
    /// not watched: `idle`, `error`), or the timer is suppressed (our restart, maintenance, or a
    /// `paused` or `exited` verdict).
    ClearSuspect,
    /// Record the start of an error state (SET NX: the first observer's time stands).
    MarkErrorSince,
    /// Forget when the error state began: the record is no longer in `error`.
    ClearErrorSince,
    /// Record a new progress marker value (it changed or was never seen).
    RecordProgress(String),
    /// Forget the progress marker: the record is not a fresh `processing` one with a marker.
    ClearProgress,
    /// Close the incident timer.
    ClearIncident(TimerEnd),
    /// The worker recovered after our restart: forget the restart (and its escalation).
    ForgetRestart,
    /// The worker got past where it stopped, or its record names another job: its run of
    /// fruitless restarts is over (`crate::hang::policy_fruitless`).
    ClearFruitless,
    /// An alert-only condition ended.
    CloseEpisode(Episode),
    /// An alert-only condition began: alert once (SET NX de-duplicates across instances).
    OpenEpisode(Episode),
    /// Start the incident timer (SET NX: an existing timer is never reset).
    OpenIncident,
    /// Page once: the last restart did not fix it.
    Escalate,
    /// The incident alert (once per incident, de-duplicated in the coordinator).
    AlertIncident,
    /// Run the restart pipeline if the incident is old enough (see `crate::hang::policy_due::restart_due`).
    ConsiderRestart,
    /// A gang member: the gang decides (`crate::hang::policy_gang`), not the member alone.
    Gang,
}

/// The cycle's effects for one worker, in execution order.
pub(crate) fn plan(
    v: Verdict,
    status: Option<&WorkerStatus>,
    marks: &Marks,
    now: Millis,
    cfg: &PolicyConfig,
) -> Vec<Effect> {
    let stale = status.is_some_and(|s| is_stale(s, now, cfg));
    let in_error = status.is_some_and(|s| s.state == WorkerState::Error);
    let action = v.action();
    // Our own restart or maintenance make healthy workers look hung: the persistence timer
    // must not survive them, or the first cycle after would restart at once.
    let suppress = matches!(action, Action::SuppressAndClear | Action::Checkpoint)
        || matches!(v, Verdict::Paused | Verdict::Exited);

    let mut fx = Vec::from_iter(suspect_effects(stale, status, marks, suppress));
    match (in_error, marks.error_since) {
        // Not while booting: our restart cleared it, and the new incarnation gets its own clock.
        (true, None) if v != Verdict::Booting => fx.push(Effect::MarkErrorSince),
        (false, Some(_)) => fx.push(Effect::ClearErrorSince),
        _ => {}
    }
    fx.extend(progress_effect(stale, status, marks));
    let still_broken = stale || in_error;
    // Timers are cleared only when the *data* says the worker is fine, never because this
    // instance has not confirmed yet: another instance may be one observation ahead.
    let readable =
        status.is_some_and(|s| s.state != WorkerState::Processing || s.heartbeat.is_some());
    let fine = !still_broken && readable && !silence_unbroken(status, marks);
    fx.extend(timer_end(v, fine, marks).map(Effect::ClearIncident));
    // Escalation looks at the data, not at the verdict: a worker still broken after our restart
    // is a page even while its cooldown marker stands.
    let escalate = marks.restarted_at.is_some_and(|restarted| {
        still_broken && !marks.escalated && now - restarted >= ms(cfg.escalate_after)
    });
    if marks.restarted_at.is_some() && !still_broken && beating(v, status, now) {
        fx.push(Effect::ForgetRestart);
    }
    // NB: not while our restart boots: until its first beat after the verification, the
    // record may still be the old incarnation's (beats between the claim and the command).
    // A record of another job ends the run too: the run was the old job's.
    let moved =
        |f: &Fruitless| progressed(f, Beat::of_worker(status).as_slice()) || !same_job(f, status);
    if !marks.cooldown && marks.fruitless.as_ref().is_some_and(moved) {
        fx.push(Effect::ClearFruitless);
    }
    fx.extend(episode_effects(v, marks));
    let pipeline = action == Action::RestartPipeline;
    if pipeline && marks.incident.is_none() {
        fx.push(Effect::OpenIncident);
    }
    if escalate {
        fx.push(Effect::Escalate);
    }
    if pipeline {
        fx.extend([Effect::AlertIncident, Effect::ConsiderRestart]);
    }
    fx
}

/// The plan of a gang member: the member's own bookkeeping stands (sightings, timers,
/// episodes), but its incident page, its restart and its escalation are the gang's — one
/// [`Effect::Gang`] instead, while the member is stale, in error or booting (its gang may be
/// hung, deciding, or done).
pub(crate) fn for_gang(
    mut fx: Vec<Effect>,
    status: Option<&WorkerStatus>,
    marks: &Marks,
    now: Millis,
    cfg: &PolicyConfig,
) -> Vec<Effect> {
    let broken = status.is_some_and(|s| is_stale(s, now, cfg) || s.state == WorkerState::Error);
    fx.retain(|e| !matches!(e, Effect::AlertIncident | Effect::ConsiderRestart | Effect::Escalate));
    if broken || marks.cooldown {
        fx.push(Effect::Gang);
    }
    fx
}

/// Suspect sighting: recorded on every stale observation of a new heartbeat value; cleared when
/// the heartbeat is fresh or when our restart / maintenance suppress the timer.
fn suspect_effects(
    stale: bool,
    status: Option<&WorkerStatus>,
    marks: &Marks,
    suppress: bool,
) -> Option<Effect> {
    if suppress {
        return marks.suspect.is_some().then_some(Effect::ClearSuspect);
    }
    match (stale, status.and_then(|s| s.heartbeat), marks.suspect) {
        (true, Some(hb), Some((seen, _))) if seen == hb => None,
        (true, Some(hb), _) => Some(Effect::RecordSuspect { heartbeat: hb }),
        (false, _, Some(_)) if !silence_unbroken(status, marks) => Some(Effect::ClearSuspect),
        _ => None,
    }
}

/// The worker has not beaten since the stale sighting recorded (by this or another instance):
/// its silence is unbroken, so the sighting and the incident timer stand whatever this
/// instance's own threshold says — instances may judge by different learned rhythms
/// (`crate::hang::policy_rhythm`: one that has not learned, or an agent just restarted, judges
/// by `stale_after`), and only the worker's data may end them.
pub(crate) fn silence_unbroken(status: Option<&WorkerStatus>, marks: &Marks) -> bool {
    let Some(s) = status.filter(|s| watched(&s.state)) else { return false };
    matches!((s.heartbeat, marks.suspect), (Some(hb), Some((seen, _))) if hb == seen)
}

/// The progress marker follows a fresh, processing record; anything else forgets it.
fn progress_effect(stale: bool, status: Option<&WorkerStatus>, marks: &Marks) -> Option<Effect> {
    let followed = status.filter(|s| s.state == WorkerState::Processing && !stale);
    match (followed.and_then(|s| s.progress.as_ref()), &marks.progress) {
        (Some(cur), Some((seen, _))) if cur == seen => None,
        (Some(cur), _) => Some(Effect::RecordProgress(cur.clone())),
        (None, Some(_)) => Some(Effect::ClearProgress),
        (None, None) => None,
    }
}

/// Whether (and why) an open incident timer closes this cycle (`fine`: the data says the worker
/// is fine: neither stale nor in error, readable, its silence broken).
fn timer_end(v: Verdict, fine: bool, marks: &Marks) -> Option<TimerEnd> {
    marks.incident.as_ref()?;
    match v.action() {
        _ if matches!(v, Verdict::Paused | Verdict::Exited) => Some(TimerEnd::Paused),
        Action::RestartPipeline => None,
        Action::SuppressAndClear => Some(TimerEnd::Booting),
        Action::Checkpoint => Some(TimerEnd::Maintenance),
        Action::Observe | Action::AlertOnly | Action::AlertNoRestart | Action::None => {
            fine.then_some(TimerEnd::Recovered)
        }
    }
}

/// Whether the record shows the worker beating after our restart, which is then forgotten:
/// healthy, or invalid only for a heartbeat from the future. NB: a rank writing milliseconds
/// beside healthy ones is invalid, not broken; kept, our restart made a hang hours later an
/// escalation at its first sighting.
fn beating(v: Verdict, status: Option<&WorkerStatus>, now: Millis) -> bool {
    let from_future = status.is_some_and(|s| heartbeat_from_future(s, now).is_some());
    v == Verdict::Healthy || (v == Verdict::Unreachable && from_future)
}

/// Episodes to close (the condition ended) and to open (it began), closes first.
fn episode_effects(v: Verdict, marks: &Marks) -> Vec<Effect> {
    // Each alert-only condition's episode is named as its verdict (`unreachable`, `gpu-failed`…).
    let wanted = Episode::VARIANTS.iter().copied().find(|e| e.as_str() == v.as_str());
    let open = |e: &Episode| marks.episodes.contains(e);
    let closes = Episode::VARIANTS.iter().copied().filter(|e| open(e) && Some(*e) != wanted);
    let opens = wanted.filter(|e| !open(e)).map(Effect::OpenEpisode);
    closes.map(Effect::CloseEpisode).chain(opens).collect()
}

/// Why a restart decided a moment ago is called off at the last moment (safeguard 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancel {
    /// The fresh record no longer shows the condition the restart was decided on.
    Recovered,
    /// A cooldown marker appeared: another instance already restarted it.
    CooldownAppeared,
    /// A restart of this incident failed after the decision (another instance's): the next
    /// try waits for its backoff. The incident stands.
    RetryPending,
}

/// Revalidate right before the command, from a fresh record, fresh marks and a fresh clock:
/// the *same* predicate as the verdict (stale while working, or in state `error`).
pub(crate) fn revalidate(
    v: Verdict,
    fresh: Option<&WorkerStatus>,
    marks: &Marks,
    now: Millis,
    cfg: &PolicyConfig,
) -> Result<(), Cancel> {
    if marks.cooldown {
        return Err(Cancel::CooldownAppeared);
    }
    if !retry_open(marks, now) {
        return Err(Cancel::RetryPending);
    }
    let still_broken = match v {
        Verdict::Errored => fresh.is_some_and(|s| s.state == WorkerState::Error),
        _ => fresh.is_some_and(|s| is_stale(s, now, cfg)),
    };
    still_broken.then_some(()).ok_or(Cancel::Recovered)
}

#[cfg(test)]
#[path = "policy_tests.rs"]
pub(crate) mod tests;
