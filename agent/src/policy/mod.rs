//! The decision core: `(worker record, shared marks, node context, now) -> verdict -> plan`.
//!
//! No I/O and no clock reads: `now` is the coordinator's clock (Redis `TIME`), handed in. Every rule
//! of the restart pipeline that can be decided from data lives here, so it is a table-driven test.
//! The executor (`crate::pipeline`) carries the plan out against the coordinator, the container
//! runtime and the alert sinks.
//!
//! NB: detection and remediation are bound to the *same* predicate. The verdict that raises the
//! "hung" alert is the verdict that makes the restart due; there is no second definition of a hang.

pub mod gpu;
mod table;

pub use table::{table, Action, TableRow};

use std::collections::HashMap;

use crate::clock::{ms, Millis};
use crate::config::PolicyConfig;

/// What a worker says about itself: its status record (Redis hash or local status API).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerStatus {
    pub state: WorkerState,
    /// Last beat, on the coordinator's clock. `None` when the field is missing or unreadable.
    pub heartbeat: Option<Millis>,
    pub job: Option<String>,
    pub progress: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState {
    Idle,
    Processing,
    Error,
    /// Any other state a worker reports (e.g. `loading`): never hung, never errored.
    Other(String),
}

impl WorkerState {
    pub fn parse(s: &str) -> WorkerState {
        match s.trim().to_ascii_lowercase().as_str() {
            "idle" => WorkerState::Idle,
            "processing" => WorkerState::Processing,
            "error" => WorkerState::Error,
            other => WorkerState::Other(other.to_string()),
        }
    }
    pub fn as_str(&self) -> &str {
        match self {
            WorkerState::Idle => "idle",
            WorkerState::Processing => "processing",
            WorkerState::Error => "error",
            WorkerState::Other(s) => s,
        }
    }
}

impl WorkerStatus {
    /// Read the record's fields. `heartbeat` is seconds since the epoch (decimals allowed) on the
    /// coordinator's clock; an unreadable heartbeat is kept as `None` so the verdict can say so.
    pub fn from_fields(fields: &HashMap<String, String>) -> Option<WorkerStatus> {
        // NB: a record holding only the agent's checkpoint fields (a worker that never
        // published) is still "no record": the worker has said nothing about itself.
        if !fields.contains_key("state") && !fields.contains_key("heartbeat") {
            return None;
        }
        let state = WorkerState::parse(fields.get("state").map(String::as_str).unwrap_or(""));
        let heartbeat = fields
            .get("heartbeat")
            .and_then(|h| h.trim().parse::<f64>().ok())
            .filter(|h| h.is_finite() && *h > 0.0)
            .map(|h| (h * 1000.0).round() as Millis);
        let nonempty = |k: &str| fields.get(k).filter(|v| !v.is_empty()).cloned();
        Some(WorkerStatus {
            state,
            heartbeat,
            job: nonempty("job"),
            progress: nonempty("progress"),
        })
    }
}

/// The shared marks Vigil keeps per worker in the coordinator (never in process memory).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Marks {
    /// First observation of a stale heartbeat: (the heartbeat seen, when it was seen).
    pub suspect: Option<(Millis, Millis)>,
    /// The incident timer: start time and id, set once with SET NX (first observer wins).
    pub incident: Option<Incident>,
    /// When the record was first seen in state `error`.
    pub error_since: Option<Millis>,
    /// Last progress marker seen and when it last changed.
    pub progress: Option<(String, Millis)>,
    /// A cooldown marker exists: we restarted this worker recently.
    pub cooldown: bool,
    /// When we last restarted it (kept past the cooldown, for escalation).
    pub restarted_at: Option<Millis>,
    /// The "restart did not help" page has been sent for the last restart.
    pub escalated: bool,
    /// Alert-only episodes currently open (their alert has been sent).
    pub episodes: Vec<Episode>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Incident {
    pub started: Millis,
    pub id: String,
}

/// Alert-only conditions: each alerts once when it begins and closes when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Episode {
    Unreachable,
    Stalled,
    GpuFailed,
}

impl Episode {
    pub const ALL: [Episode; 3] = [Episode::Unreachable, Episode::Stalled, Episode::GpuFailed];
    pub fn as_str(self) -> &'static str {
        match self {
            Episode::Unreachable => "unreachable",
            Episode::Stalled => "stalled",
            Episode::GpuFailed => "gpu-failed",
        }
    }
}

/// What the node itself says, from other sources (metadata server, NVML).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodeContext {
    pub in_maintenance: bool,
    pub gpu_failed: bool,
}

/// The verdict on one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Fresh heartbeat, or not processing: nothing to do.
    Healthy,
    /// Stale heartbeat seen once: wait for the confirming observation.
    Suspect,
    /// Stale heartbeat while processing, confirmed by a second observation.
    Hung,
    /// In state `error`, not yet for `error_for`.
    ErrorPending,
    /// In state `error` for at least `error_for`.
    Errored,
    /// No usable status record: alert only (the machine may be rebooting or off on purpose).
    Unreachable,
    /// Fresh heartbeat but the progress marker has not moved for `stalled_after`: alert only.
    Stalled,
    /// A cooldown marker exists: this is our own restart booting, not a new incident.
    Booting,
    /// The node has a maintenance or preemption notice: checkpoint path, never a restart.
    InMaintenance,
    /// Would be hung or errored, but the GPU under it has failed: a restart cannot fix hardware.
    GpuFailed,
}

impl Verdict {
    pub const ALL: [Verdict; 10] = [
        Verdict::Healthy,
        Verdict::Suspect,
        Verdict::Hung,
        Verdict::ErrorPending,
        Verdict::Errored,
        Verdict::Unreachable,
        Verdict::Stalled,
        Verdict::Booting,
        Verdict::InMaintenance,
        Verdict::GpuFailed,
    ];

    /// Stable name for logs, the trail and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Suspect => "suspect",
            Verdict::Hung => "hung",
            Verdict::ErrorPending => "error-pending",
            Verdict::Errored => "errored",
            Verdict::Unreachable => "unreachable",
            Verdict::Stalled => "stalled",
            Verdict::Booting => "booting",
            Verdict::InMaintenance => "in-maintenance",
            Verdict::GpuFailed => "gpu-failed",
        }
    }
}

/// True when the record shows a processing worker whose heartbeat is older than `stale_after`.
/// NB: "older than" is strict — a heartbeat exactly `stale_after` old is still fresh.
pub fn is_stale(status: &WorkerStatus, now: Millis, cfg: &PolicyConfig) -> bool {
    status.state == WorkerState::Processing
        && matches!(status.heartbeat, Some(hb) if now - hb > ms(cfg.stale_after))
}

/// The verdict, from the shared record and shared marks only.
pub fn verdict(
    status: Option<&WorkerStatus>,
    marks: &Marks,
    node: NodeContext,
    now: Millis,
    cfg: &PolicyConfig,
) -> Verdict {
    if marks.cooldown {
        return Verdict::Booting;
    }
    if node.in_maintenance {
        return Verdict::InMaintenance;
    }
    let Some(status) = status else {
        return Verdict::Unreachable;
    };
    match status.state {
        WorkerState::Processing => {
            let Some(hb) = status.heartbeat else {
                return Verdict::Unreachable;
            };
            if is_stale(status, now, cfg) {
                if node.gpu_failed {
                    return Verdict::GpuFailed;
                }
                // Confirmed only by a second observation of the *same* stale heartbeat, made at
                // least `confirm_after` after the first (by this or any other instance).
                let confirmed = matches!(marks.suspect,
                    Some((seen_hb, seen_at)) if seen_hb == hb && now - seen_at >= ms(cfg.confirm_after));
                return if confirmed {
                    Verdict::Hung
                } else {
                    Verdict::Suspect
                };
            }
            let frozen = matches!((&status.progress, &marks.progress),
                (Some(p), Some((seen, since))) if p == seen && now - since >= ms(cfg.stalled_after));
            if frozen {
                Verdict::Stalled
            } else {
                Verdict::Healthy
            }
        }
        WorkerState::Error => {
            let errored = matches!(marks.error_since, Some(t) if now - t >= ms(cfg.error_for));
            match (errored, node.gpu_failed) {
                (true, true) => Verdict::GpuFailed,
                (true, false) => Verdict::Errored,
                (false, _) => Verdict::ErrorPending,
            }
        }
        WorkerState::Idle | WorkerState::Other(_) => Verdict::Healthy,
    }
}

/// Bookkeeping and actions for one cycle, derived from the verdict and the data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Record this stale heartbeat as the first sighting (SET NX).
    pub record_suspect: Option<Millis>,
    pub clear_suspect: bool,
    /// Start the incident timer (SET NX: an existing timer is never reset).
    pub open_incident: bool,
    pub clear_incident: bool,
    /// Record the start of an error state (SET NX).
    pub mark_error_since: bool,
    pub clear_error_since: bool,
    /// Record a new progress marker value (it changed or was never seen).
    pub record_progress: Option<String>,
    pub clear_progress: bool,
    /// Episodes to open (alert once) and to close.
    pub open_episodes: Vec<Episode>,
    pub close_episodes: Vec<Episode>,
    /// The incident alert (once per incident).
    pub incident_alert: bool,
    /// The restart pipeline may run if the incident is old enough (see [`restart_due`]).
    pub restart_candidate: bool,
    /// Page once: the last restart did not fix it.
    pub escalate: bool,
    /// The worker recovered after our restart: forget the restart.
    pub clear_restarted: bool,
}

pub fn plan(
    v: Verdict,
    status: Option<&WorkerStatus>,
    marks: &Marks,
    now: Millis,
    cfg: &PolicyConfig,
) -> Plan {
    let mut p = Plan::default();
    let stale = status.is_some_and(|s| is_stale(s, now, cfg));
    let in_error = status.is_some_and(|s| s.state == WorkerState::Error);

    // Suspect sighting: recorded on every stale observation of a new heartbeat value.
    match (stale, status.and_then(|s| s.heartbeat), marks.suspect) {
        (true, Some(hb), Some((seen, _))) if seen == hb => {}
        (true, Some(hb), _) => p.record_suspect = Some(hb),
        (false, _, Some(_)) => p.clear_suspect = true,
        _ => {}
    }
    match (in_error, marks.error_since) {
        // Not while booting: our restart cleared it, and the new incarnation gets its own clock.
        (true, None) if v != Verdict::Booting => p.mark_error_since = true,
        (false, Some(_)) => p.clear_error_since = true,
        _ => {}
    }
    match status {
        Some(s) if s.state == WorkerState::Processing && !stale => {
            match (&s.progress, &marks.progress) {
                (Some(cur), Some((seen, _))) if cur == seen => {}
                (Some(cur), _) => p.record_progress = Some(cur.clone()),
                (None, Some(_)) => p.clear_progress = true,
                (None, None) => {}
            }
        }
        _ if marks.progress.is_some() => p.clear_progress = true,
        _ => {}
    }

    // Escalation looks at the data, not at the verdict: a worker still broken after our restart
    // is a page even while its cooldown marker stands.
    if let Some(restarted) = marks.restarted_at {
        let still_broken = stale || in_error;
        if still_broken && !marks.escalated && now - restarted >= ms(cfg.escalate_after) {
            p.escalate = true;
        }
        if !still_broken && v == Verdict::Healthy {
            p.clear_restarted = true;
        }
    }

    let wanted_episode = match v {
        Verdict::Unreachable => Some(Episode::Unreachable),
        Verdict::Stalled => Some(Episode::Stalled),
        Verdict::GpuFailed => Some(Episode::GpuFailed),
        _ => None,
    };
    for e in Episode::ALL {
        let open = marks.episodes.contains(&e);
        if Some(e) == wanted_episode && !open {
            p.open_episodes.push(e);
        } else if Some(e) != wanted_episode && open {
            p.close_episodes.push(e);
        }
    }

    match v.action() {
        Action::RestartPipeline => {
            p.open_incident = marks.incident.is_none();
            p.incident_alert = true;
            p.restart_candidate = true;
        }
        // Our own restart or maintenance make healthy workers look hung: the persistence timer
        // must not survive them, or the first cycle after would restart at once.
        Action::SuppressAndClear | Action::Checkpoint => {
            p.clear_incident = marks.incident.is_some();
            p.clear_suspect = marks.suspect.is_some();
            p.record_suspect = None;
        }
        Action::Observe | Action::AlertOnly | Action::AlertNoRestart | Action::None => {
            // Timers are cleared only when the *data* says the worker is fine, never because this
            // instance has not confirmed yet: another instance may be one observation ahead.
            let readable =
                status.is_some_and(|s| s.state != WorkerState::Processing || s.heartbeat.is_some());
            if marks.incident.is_some() && !stale && !in_error && readable {
                p.clear_incident = true;
            }
        }
    }
    p
}

/// Whether the restart pipeline should run now for an incident that started at `started`.
/// Hangs wait `restart_delay` (persistence before action); an errored worker has already
/// persisted for `error_for`.
pub fn restart_due(v: Verdict, started: Millis, now: Millis, cfg: &PolicyConfig) -> bool {
    match v {
        Verdict::Hung => now - started >= ms(cfg.restart_delay),
        Verdict::Errored => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
