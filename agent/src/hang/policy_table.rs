//! The verdict → action table. `vigil policy` prints it from here, and the planner branches on
//! [`Verdict::action`] (defined beside the verdicts in `hang::policy`, with each action's words),
//! so the printed table cannot disagree with what the agent does.
use crate::config::PolicyConfig;
use crate::hang::policy::Verdict;
use strum::EnumMessage;

impl Verdict {
    /// The predicate, in words, with the configured thresholds.
    pub(crate) fn predicate(self, cfg: &PolicyConfig) -> String {
        let d = |d: std::time::Duration| humantime::format_duration(d).to_string();
        let [stale_after, max_grace, stalled_after, cooldown, start_grace] =
            [cfg.stale_after, cfg.max_grace, cfg.stalled_after, cfg.cooldown, cfg.start_grace]
                .map(d);
        // What a suspect and a hung worker both show.
        let stale = format!("state not idle/error, heartbeat older than {stale_after} or its grace (at most {max_grace})");
        match self {
            Verdict::Healthy => "heartbeat fresh (within its grace), or state idle".into(),
            Verdict::Suspect => format!("{stale} (first observation)"),
            Verdict::Hung => format!("{stale}, seen again >= {} later", d(cfg.confirm_after)),
            Verdict::ErrorPending => format!("state = error for less than {}", d(cfg.error_for)),
            Verdict::Errored => format!("state = error for at least {}", d(cfg.error_for)),
            Verdict::Unreachable => "status record missing, or no readable heartbeat".into(),
            Verdict::Stalled => {
                format!("processing, heartbeat fresh but progress unchanged for {stalled_after}")
            }
            Verdict::Booting => format!("cooldown marker present (restarted less than {cooldown} ago) and no beat since the restart; or started less than {start_grace} ago with no record of its own yet"),
            Verdict::InMaintenance => "node has a maintenance or preemption notice".into(),
            Verdict::GpuFailed => "hung or errored on a GPU that NVML reports failed".into(),
            Verdict::TpuFailed => "hung or errored on a node whose TPU health is failed".into(),
            Verdict::Paused => "the container is paused by someone (docker pause)".into(),
            Verdict::Exited => "the container has exited (and no running one replaced it)".into(),
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TableRow {
    pub(crate) verdict: &'static str,
    pub(crate) predicate: String,
    pub(crate) action: &'static str,
}

/// The whole table, in the brief's order.
pub(crate) fn table(cfg: &PolicyConfig) -> Vec<TableRow> {
    let row = |v: &Verdict| {
        // Every action has its message (`crate::hang::policy::Action`).
        let action = v.action().get_message().unwrap_or_default();
        TableRow { verdict: v.as_str(), predicate: v.predicate(cfg), action }
    };
    Verdict::ALL.iter().map(row).collect()
}
