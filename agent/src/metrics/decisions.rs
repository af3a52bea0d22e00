//! What the agent concluded and did: verdicts, decision trail entries, restarts and alerts.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub decision: &'static str,
}

/// A restart attempt: why (hung, errored) and how it went (restarted, failed, would-restart).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestartLabels {
    pub reason: &'static str,
    pub outcome: &'static str,
}

/// An alert: its kind and how its delivery went (sent, failed, logged).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlertLabels {
    pub kind: &'static str,
    pub outcome: &'static str,
}

pub struct DecisionMetrics {
    pub verdicts: Family<VerdictLabels, Counter>,
    pub decisions: Family<DecisionLabels, Counter>,
    pub restarts: Family<RestartLabels, Counter>,
    pub alerts: Family<AlertLabels, Counter>,
}

impl DecisionMetrics {
    pub fn register(reg: &mut Registry) -> Self {
        let m = DecisionMetrics {
            verdicts: Family::default(),
            decisions: Family::default(),
            restarts: Family::default(),
            alerts: Family::default(),
        };
        // NB: at 0 from the start, so that the first failed restart of an agent's life is an
        // increase (the restart-failed alert rule takes `increase()`).
        for reason in ["hung", "errored"] {
            for outcome in ["restarted", "failed", "would-restart"] {
                let _ = m.restarts.get_or_create(&RestartLabels { reason, outcome });
            }
        }
        reg.register(
            "verdicts",
            "Worker verdicts computed, by verdict",
            m.verdicts.clone(),
        );
        reg.register(
            "decisions",
            "Decision trail entries written, by decision",
            m.decisions.clone(),
        );
        reg.register(
            "restarts",
            "Restart attempts by reason (hung, errored) and outcome (restarted, failed, would-restart)",
            m.restarts.clone(),
        );
        reg.register(
            "alerts",
            "Alerts by kind and delivery outcome (sent, failed, logged)",
            m.alerts.clone(),
        );
        m
    }

    pub fn verdict(&self, verdict: &'static str) {
        self.verdicts
            .get_or_create(&VerdictLabels { verdict })
            .inc();
    }
    pub fn decision(&self, decision: &'static str) {
        self.decisions
            .get_or_create(&DecisionLabels { decision })
            .inc();
    }
    pub fn restart(&self, reason: &'static str, outcome: &'static str) {
        self.restarts
            .get_or_create(&RestartLabels { reason, outcome })
            .inc();
    }
    pub fn alert(&self, kind: &'static str, outcome: &'static str) {
        self.alerts
            .get_or_create(&AlertLabels { kind, outcome })
            .inc();
    }
}
