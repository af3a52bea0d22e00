//! The decision trail: every decision (acted, skipped and why, recovered) appended to a bounded
//! per-node stream, so an operator can ask "why did / didn't it restart node X?" (`vigil explain`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::{rfc3339, Millis};
use crate::coord::{CoordError, Coordinator, Keys, TrailEntry};
use crate::metrics::Metrics;

/// Decision codes written to the trail (and the `decision` label of `vigil_decisions_total`).
pub mod code {
    pub const SUSPECT: &str = "suspect";
    pub const TIMER_STARTED: &str = "timer-started";
    pub const TIMER_CLEARED: &str = "timer-cleared";
    pub const RECOVERED: &str = "recovered";
    pub const RESTARTED: &str = "restarted";
    pub const WOULD_RESTART: &str = "would-restart";
    pub const RESTART_FAILED: &str = "restart-failed";
    pub const ESCALATED: &str = "escalated";
    pub const ALERTED: &str = "alerted";
    pub const EPISODE_CLOSED: &str = "episode-closed";
    pub const SKIP_LOCK_HELD: &str = "skipped-lock-held";
    pub const SKIP_BREAKER_OPEN: &str = "skipped-breaker-open";
    pub const SKIP_BUDGET_EXHAUSTED: &str = "skipped-budget-exhausted";
    pub const SKIP_LOCK_EXPIRING: &str = "skipped-lock-expiring";
    pub const SKIP_CONTAINER_CHANGED: &str = "skipped-container-changed";
    pub const SKIP_AMBIGUOUS: &str = "skipped-ambiguous";
    pub const CANCELLED_RECOVERED: &str = "cancelled-recovered";
    pub const CANCELLED_NODE_STATE: &str = "cancelled-node-state";
    pub const ABORTED_LOGS_FAILED: &str = "aborted-logs-failed";
    pub const AGENT_STARTED: &str = "agent-started";
    pub const EXTERNAL_RESTART: &str = "external-restart";
    pub const MAINTENANCE: &str = "maintenance";
    pub const CHECKPOINT_ACKED: &str = "checkpoint-acked";
    pub const CHECKPOINT_TIMED_OUT: &str = "checkpoint-timed-out";
    pub const CHECKPOINT_FAILED: &str = "checkpoint-failed";
    pub const PERFORM_MAINTENANCE: &str = "perform-maintenance";
    pub const CONFIG_RELOADED: &str = "config-reloaded";
    pub const GPU_HEALTH: &str = "gpu-health";

    /// Every code, for the README drift check.
    pub const ALL: &[&str] = &[
        SUSPECT,
        TIMER_STARTED,
        TIMER_CLEARED,
        RECOVERED,
        RESTARTED,
        WOULD_RESTART,
        RESTART_FAILED,
        ESCALATED,
        ALERTED,
        EPISODE_CLOSED,
        SKIP_LOCK_HELD,
        SKIP_BREAKER_OPEN,
        SKIP_BUDGET_EXHAUSTED,
        SKIP_LOCK_EXPIRING,
        SKIP_CONTAINER_CHANGED,
        SKIP_AMBIGUOUS,
        CANCELLED_RECOVERED,
        CANCELLED_NODE_STATE,
        ABORTED_LOGS_FAILED,
        AGENT_STARTED,
        EXTERNAL_RESTART,
        MAINTENANCE,
        CHECKPOINT_ACKED,
        CHECKPOINT_TIMED_OUT,
        CHECKPOINT_FAILED,
        PERFORM_MAINTENANCE,
        CONFIG_RELOADED,
        GPU_HEALTH,
    ];
}

/// One decision, before it is stored.
#[derive(Debug, Clone)]
pub struct Decision<'a> {
    pub at: Millis,
    pub worker: &'a str,
    pub verdict: &'a str,
    pub decision: &'static str,
    pub detail: String,
    pub incident: Option<&'a str>,
    pub agent: &'a str,
    pub dry_run: bool,
}

impl Decision<'_> {
    pub fn fields(&self) -> Vec<(String, String)> {
        let mut f = vec![
            ("at".to_string(), self.at.to_string()),
            ("worker".to_string(), self.worker.to_string()),
            ("verdict".to_string(), self.verdict.to_string()),
            ("decision".to_string(), self.decision.to_string()),
            ("detail".to_string(), self.detail.clone()),
            ("agent".to_string(), self.agent.to_string()),
        ];
        if let Some(i) = self.incident {
            f.push(("incident".into(), i.to_string()));
        }
        if self.dry_run {
            f.push(("dry_run".into(), "true".into()));
        }
        f
    }
}

/// Writes decisions: the stream, the log line and the metric, for every part of the agent.
#[derive(Clone)]
pub struct Trail {
    pub coord: Arc<dyn Coordinator>,
    pub keys: Keys,
    /// Identifies this process in the trail (two agents on one node are told apart).
    pub instance: String,
    pub max_len: usize,
    pub metrics: Arc<Metrics>,
    pub dry_run: bool,
}

impl Trail {
    pub async fn record(
        &self,
        at: Millis,
        worker: &str,
        verdict: &str,
        decision: &'static str,
        detail: String,
        incident: Option<&str>,
    ) -> Result<(), CoordError> {
        tracing::info!(
            node = %self.keys.node(),
            worker,
            verdict,
            decision,
            incident,
            dry_run = self.dry_run,
            "{detail}"
        );
        self.metrics.decision(decision);
        let d = Decision {
            at,
            worker,
            verdict,
            decision,
            detail,
            incident,
            agent: &self.instance,
            dry_run: self.dry_run,
        };
        self.coord
            .append(&self.keys.trail(), &d.fields(), self.max_len)
            .await
    }
}

/// Render stored entries (newest first, as read) as an oldest-first timeline.
pub fn render(node: &str, entries: &[TrailEntry]) -> String {
    if entries.is_empty() {
        return format!("no decisions recorded for node {node}\n");
    }
    let get = |m: &HashMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
    let mut out = format!("decision trail of node {node} (oldest first)\n");
    for (_, e) in entries.iter().rev() {
        let at = get(e, "at")
            .parse::<Millis>()
            .map(rfc3339)
            .unwrap_or_else(|_| "?".into());
        let dry = if e.get("dry_run").is_some() {
            " [dry run]"
        } else {
            ""
        };
        let incident = e
            .get("incident")
            .map(|i| format!(" incident={i}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{at}  {:<14} {:<14} {:<26} {}{incident}{dry}  (agent {})\n",
            get(e, "worker"),
            get(e, "verdict"),
            get(e, "decision"),
            get(e, "detail"),
            get(e, "agent"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_oldest_first_with_incident_and_dry_run() {
        let d = |at: Millis, code: &'static str, dry| {
            let fields = Decision {
                at,
                worker: "trainer-0",
                verdict: "hung",
                decision: code,
                detail: "because".into(),
                incident: Some("i-1"),
                agent: "a1",
                dry_run: dry,
            }
            .fields();
            (
                at.to_string(),
                fields.into_iter().collect::<HashMap<_, _>>(),
            )
        };
        let entries = vec![
            d(1_800_000_060_000, code::WOULD_RESTART, true),
            d(1_800_000_000_000, code::TIMER_STARTED, false),
        ];
        let text = render("gpu-7", &entries);
        let first = text.find("timer-started").unwrap();
        let second = text.find("would-restart").unwrap();
        assert!(first < second, "{text}");
        assert!(text.contains("incident=i-1 [dry run]"));
        assert!(text.contains("2027-01-15T08:00:00.000Z"));
        assert!(render("n", &[]).contains("no decisions"));
    }
}
