//! What the agent concluded and did: verdicts, decision trail entries, restarts and alerts.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Labels;

#[derive(Default)]
pub(crate) struct DecisionMetrics {
    pub(crate) verdicts: Family<Labels<1>, Counter>,
    pub(crate) decisions: Family<Labels<1>, Counter>,
    /// A restart attempt: why (hung, errored) and how it went (restarted, failed, would-restart).
    pub(crate) restarts: Family<Labels<2>, Counter>,
    /// An alert's kind and how its delivery went (sent, failed, logged).
    pub(crate) alerts: Family<Labels<2>, Counter>,
}

impl DecisionMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = DecisionMetrics::default();
        // NB: at 0 from the start, so that the first failed restart of an agent's life is an
        // increase (the restart-failed alert rule takes `increase()`).
        for reason in ["hung", "errored"] {
            for outcome in ["restarted", "failed", "would-restart"] {
                let _ = m.restarts.get_or_create(&[("reason", reason), ("outcome", outcome)]);
            }
        }
        register!(reg;
            "verdicts" => m.verdicts, "Worker verdicts computed, by verdict";
            "decisions" => m.decisions, "Decision trail entries written, by decision";
            "restarts" => m.restarts,
                "Restart attempts by reason (hung, errored) and outcome (restarted, failed, would-restart)";
            "alerts" => m.alerts, "Alerts by kind and delivery outcome (sent, failed, logged)";
        );
        m
    }

    pub(crate) fn verdict(&self, verdict: &'static str) {
        self.verdicts.get_or_create(&[("verdict", verdict)]).inc();
    }
    pub(crate) fn decision(&self, decision: &'static str) {
        self.decisions.get_or_create(&[("decision", decision)]).inc();
    }
    pub(crate) fn restart(&self, reason: &'static str, outcome: &'static str) {
        self.restarts.get_or_create(&[("reason", reason), ("outcome", outcome)]).inc();
    }
    pub(crate) fn alert(&self, kind: &'static str, outcome: &'static str) {
        self.alerts.get_or_create(&[("kind", kind), ("outcome", outcome)]).inc();
    }
}
