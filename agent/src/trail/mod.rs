//! The decision trail: every decision (acted, skipped and why, recovered) appended to a bounded
//! per-node stream, so an operator can ask "why did / didn't it restart node X?" (`vigil explain`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::{rfc3339, Millis};
use crate::coord::{CoordError, Coordinator, Keys, TrailEntry};
use crate::metrics::Metrics;

/// Decision codes written to the trail (and the `decision` label of `vigil_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub enum Code {
    /// A stale heartbeat was seen once; waiting for the confirming observation.
    Suspect,
    /// A hang or error was confirmed: the persistence timer started.
    TimerStarted,
    /// The timer was cleared by our own restart booting or by maintenance.
    TimerCleared,
    /// The worker is fine again: incident closed, or healthy after our restart.
    Recovered,
    /// A restarted worker beat for the first time: its cooldown (booting) ends, and a new hang
    /// from now on is a new incident.
    Booted,
    /// An incident ended in a restart is over: the time it lost, phase by phase
    /// (`crate::hang::policy_lost`); or a maintenance or preemption ended, with its own.
    TimeLost,
    /// The agent was asked to stop: whether it asked the workers to checkpoint, and why.
    AgentStopping,
    /// The container was restarted (verified by its start time).
    Restarted,
    /// Observe mode: the restart would have run now.
    WouldRestart,
    /// The restart did not happen or could not be verified: a page went out.
    RestartFailed,
    /// Still broken after our restart: a person was paged.
    Escalated,
    /// An alert was sent.
    Alerted,
    /// An alert-only condition (unreachable, stalled, GPU failed) ended.
    EpisodeClosed,
    /// Another instance holds the node lock; it acts.
    SkippedLockHeld,
    /// The daily circuit breaker is open.
    SkippedBreakerOpen,
    /// The fleet restart budget of this window is used up.
    SkippedBudgetExhausted,
    /// The lock was lost or had too little TTL left for the restart.
    SkippedLockExpiring,
    /// The container is not the incarnation observed at decision time.
    SkippedContainerChanged,
    /// The container decided on is no longer running (stopped, exited, replaced).
    SkippedNotRunning,
    /// Several containers claim the worker id.
    SkippedAmbiguous,
    /// The runtime says this worker must not be restarted (e.g. a pod with restartPolicy Never).
    SkippedNotRestartable,
    /// Another instance's restart of this incident failed after our decision: its retry waits
    /// for the backoff.
    SkippedRetryPending,
    /// The worker's restarts belong to another controller (`alert-only`): reported, not
    /// restarted.
    SkippedAlertOnly,
    /// Revalidation found the worker fresh (or a cooldown) right before the command.
    CancelledRecovered,
    /// Shutdown, maintenance or a GPU failure arrived before the command.
    CancelledNodeState,
    /// Log collection failed: no restart, no budget consumed.
    AbortedLogsFailed,
    /// An agent started.
    AgentStarted,
    /// A restart outside Vigil was seen: treated as booting.
    ExternalRestart,
    /// The maintenance phase changed.
    Maintenance,
    /// A worker acknowledged its checkpoint request.
    CheckpointAcked,
    /// A worker did not acknowledge within the budget.
    CheckpointTimedOut,
    /// A checkpoint request could not be delivered.
    CheckpointFailed,
    /// Opportunistic maintenance: the pool claim was taken or released.
    PerformMaintenance,
    /// Opportunistic maintenance: the idle check's verdict changed (idle, or why not).
    IdleCheck,
    /// A SIGHUP's configuration was accepted: the keys that changed, and those kept until a
    /// restart (names only, never a value).
    ConfigReloaded,
    /// The node's GPU health changed.
    GpuHealth,
    /// The node's TPU health changed.
    TpuHealth,
    /// A GPU's standing failure was cleared: the node rebooted, the driver reloaded, or the GPU
    /// was reset (the detail says which evidence).
    GpuFailureCleared,
    /// The node's description from its Node (pool, slice, provisioning, accelerator, TPU
    /// topology) was read for the first time or changed.
    NodeInfo,
    /// A gang (a distributed job's collective) stopped as a whole: its incident opened.
    GangHung,
    /// The gang's one restart decision was taken: every member is restarted by its own node.
    GangDecided,
    /// A hung gang cannot be restarted as a whole: the detail names every blocking member.
    GangBlocked,
    /// The gang's incident is over (its restart took, or the collective moves again).
    GangClosed,
    /// A gang member stopped while its peers progress.
    Straggler,
    /// A checkpoint drill (`vigil drill checkpoint`) asked this node's workers: its verdict.
    CheckpointDrill,
    /// Restarts in a row brought no progress past where the worker stopped: no more.
    SkippedFruitless,
}

#[cfg(any(test, feature = "bench"))]
impl Code {
    /// Every code, for the docs drift check (docs/trail.md).
    pub const ALL: &'static [Code] = <Code as strum::VariantArray>::VARIANTS;
}
as_str!(pub Code);

/// One decision, before it is stored.
#[derive(Debug, Clone)]
pub(crate) struct Decision<'a> {
    pub(crate) at: Millis,
    pub(crate) worker: &'a str,
    pub(crate) verdict: &'a str,
    pub(crate) decision: Code,
    pub(crate) detail: String,
    pub(crate) incident: Option<&'a str>,
    pub(crate) agent: &'a str,
    pub(crate) dry_run: bool,
}

impl Decision<'_> {
    pub(crate) fn fields(&self) -> Vec<(String, String)> {
        let mut f = vec![
            ("at".to_string(), self.at.to_string()),
            ("worker".to_string(), self.worker.to_string()),
            ("verdict".to_string(), self.verdict.to_string()),
            ("decision".to_string(), self.decision.as_str().to_string()),
            ("detail".to_string(), self.detail.clone()),
            ("agent".to_string(), self.agent.to_string()),
        ];
        f.extend(self.incident.map(|i| ("incident".to_string(), i.to_string())));
        f.extend(self.dry_run.then(|| ("dry_run".to_string(), "true".to_string())));
        f
    }
}

/// Writes decisions: the stream, the log line and the metric, for every part of the agent.
#[derive(Clone)]
pub struct Trail {
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) keys: Keys,
    /// Identifies this process in the trail (two agents on one node are told apart).
    pub(crate) instance: String,
    pub(crate) max_len: usize,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) dry_run: bool,
}

impl Trail {
    pub(crate) async fn record(
        &self,
        at: Millis,
        worker: &str,
        verdict: &str,
        decision: Code,
        detail: String,
        incident: Option<&str>,
    ) -> Result<(), CoordError> {
        tracing::info!(
            node = %self.keys.node(),
            worker,
            verdict,
            decision = decision.as_str(),
            incident,
            dry_run = self.dry_run,
            "{detail}"
        );
        self.metrics.decisions.decision(decision.as_str());
        let (agent, dry_run) = (&self.instance, self.dry_run);
        let d = Decision { at, worker, verdict, decision, detail, incident, agent, dry_run };
        self.coord.append(&self.keys.trail(), &d.fields(), self.max_len).await
    }
}

/// Render stored entries (newest first, as read) as an oldest-first timeline and, under it, the
/// `time-lost` entries again, one line each: what each incident (and each maintenance or
/// preemption) cost.
pub(crate) fn render(node: &str, entries: &[TrailEntry]) -> String {
    if entries.is_empty() {
        return format!("no decisions recorded for node {node}\n");
    }
    let get = |m: &HashMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
    let mut out = format!("decision trail of node {node} (oldest first)\n");
    let mut lost = String::new();
    for (_, e) in entries.iter().rev() {
        let at = get(e, "at").parse::<Millis>().map(rfc3339).unwrap_or_else(|_| "?".into());
        let dry = if e.get("dry_run").is_some() { " [dry run]" } else { "" };
        let incident = e.get("incident").map(|i| format!(" incident={i}")).unwrap_or_default();
        let [worker, verdict, decision, detail, agent] =
            ["worker", "verdict", "decision", "detail", "agent"].map(|k| get(e, k));
        out.push_str(&format!(
            "{at}  {worker:<14} {verdict:<14} {decision:<26} {detail}{incident}{dry}  (agent {agent})\n"
        ));
        if decision == Code::TimeLost.as_str() {
            // The summary's row: a field the entry lacks shows as `-`.
            let field = |k: &str| e.get(k).map_or("-", String::as_str);
            let [inc, who, what] = ["incident", "worker", "detail"].map(field);
            lost.push_str(&format!("{inc:<28} {who:<14} {what}\n"));
        }
    }
    if !lost.is_empty() {
        out.push_str(&format!("\ntime lost, by incident (oldest first)\n{lost}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_oldest_first_with_incident_and_dry_run() {
        let d = |at: Millis, code: Code, dry| {
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
            (at.to_string(), fields.into_iter().collect::<HashMap<_, _>>())
        };
        let entries = vec![
            d(1_800_000_060_000, Code::WouldRestart, true),
            d(1_800_000_000_000, Code::TimerStarted, false),
        ];
        let text = render("gpu-7", &entries);
        assert!(!text.contains("time lost"), "no time-lost entry, no summary");
        let first = text.find("timer-started").unwrap();
        let second = text.find("would-restart").unwrap();
        assert!(first < second, "{text}");
        assert!(text.contains("incident=i-1 [dry run]"));
        assert!(text.contains("2027-01-15T08:00:00.000Z"));
        assert!(render("n", &[]).contains("no decisions"));
        let lost = Decision {
            at: 1_800_000_120_000,
            worker: "trainer-0",
            verdict: "booting",
            decision: Code::TimeLost,
            detail: "lost 5m = detection …".into(),
            incident: Some("i-1"),
            agent: "a1",
            dry_run: false,
        }
        .fields();
        let mut with = entries.clone();
        with.insert(0, ("x".into(), lost.into_iter().collect()));
        let text = render("gpu-7", &with);
        let summary = text.split("time lost, by incident").nth(1).expect(&text);
        assert!(summary.contains("i-1") && summary.contains("lost 5m = detection"), "{summary}");
    }
}
