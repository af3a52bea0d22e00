//! What the agent concluded and did: verdicts, decision trail entries, restarts and alerts.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VerdictLabels {
    pub(crate) verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DecisionLabels {
    pub(crate) decision: &'static str,
}

/// A restart attempt: why (hung, errored) and how it went (restarted, failed, would-restart).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RestartLabels {
    pub(crate) reason: &'static str,
    pub(crate) outcome: &'static str,
}

/// An alert: its kind and how its delivery went (sent, failed, logged).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AlertLabels {
    pub(crate) kind: &'static str,
    pub(crate) outcome: &'static str,
}

#[derive(Default)]
pub(crate) struct DecisionMetrics {
    pub(crate) verdicts: Family<VerdictLabels, Counter>,
    pub(crate) decisions: Family<DecisionLabels, Counter>,
    pub(crate) restarts: Family<RestartLabels, Counter>,
    pub(crate) alerts: Family<AlertLabels, Counter>,
}

impl DecisionMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = DecisionMetrics::default();
        // NB: at 0 from the start, so that the first failed restart of an agent's life is an
        // increase (the restart-failed alert rule takes `increase()`).
        for reason in ["hung", "errored"] {
            for outcome in ["restarted", "failed", "would-restart"] {
                let _ = m.restarts.get_or_create(&RestartLabels { reason, outcome });
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
        self.verdicts.get_or_create(&VerdictLabels { verdict }).inc();
    }
    pub(crate) fn decision(&self, decision: &'static str) {
        self.decisions.get_or_create(&DecisionLabels { decision }).inc();
    }
    pub(crate) fn restart(&self, reason: &'static str, outcome: &'static str) {
        self.restarts.get_or_create(&RestartLabels { reason, outcome }).inc();
    }
    pub(crate) fn alert(&self, kind: &'static str, outcome: &'static str) {
        self.alerts.get_or_create(&AlertLabels { kind, outcome }).inc();
    }
}
