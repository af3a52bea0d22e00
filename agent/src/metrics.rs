//! Prometheus metrics, one struct registered once. Labels are fixed `&'static str` values (verdict
//! names, decision codes, alert kinds): never ids, jobs or error text, so cardinality is bounded.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, &'static str)>;

pub struct Metrics {
    registry: Registry,
    pub verdicts: Family<Labels, Counter>,
    pub decisions: Family<Labels, Counter>,
    pub restarts: Family<Labels, Counter>,
    pub alerts: Family<Labels, Counter>,
    pub coordinator_errors: Counter,
    pub runtime_errors: Counter,
    pub coordinator_up: Gauge,
    pub runtime_up: Gauge,
    pub workers: Gauge,
    pub dry_run: Gauge,
    pub cycle_seconds: Histogram,
    pub metadata_errors: Family<Labels, Counter>,
    pub interruptions: Family<Labels, Counter>,
    pub maintenance: Family<Labels, Gauge>,
    pub checkpoints: Family<Labels, Counter>,
    pub checkpoint_seconds: Histogram,
    pub kube_errors: Family<Labels, Counter>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("vigil");
        let m = Metrics {
            verdicts: Family::default(),
            decisions: Family::default(),
            restarts: Family::default(),
            alerts: Family::default(),
            coordinator_errors: Counter::default(),
            runtime_errors: Counter::default(),
            coordinator_up: Gauge::default(),
            runtime_up: Gauge::default(),
            workers: Gauge::default(),
            dry_run: Gauge::default(),
            cycle_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            metadata_errors: Family::default(),
            interruptions: Family::default(),
            maintenance: Family::default(),
            checkpoints: Family::default(),
            checkpoint_seconds: Histogram::new(exponential_buckets(0.25, 2.0, 10)),
            kube_errors: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "verdicts",
            "Worker verdicts computed, by verdict",
            m.verdicts.clone(),
        );
        registry.register(
            "decisions",
            "Decision trail entries written, by decision",
            m.decisions.clone(),
        );
        registry.register(
            "restarts",
            "Restart attempts by reason (hung, errored) and outcome (restarted, failed, would-restart)",
            m.restarts.clone(),
        );
        registry.register(
            "alerts",
            "Alerts by kind and delivery outcome (sent, failed, logged)",
            m.alerts.clone(),
        );
        registry.register(
            "coordinator_errors",
            "Coordinator (Redis) errors; restarts pause while it is unreachable",
            m.coordinator_errors.clone(),
        );
        registry.register(
            "runtime_errors",
            "Container runtime (Docker) errors",
            m.runtime_errors.clone(),
        );
        registry.register(
            "coordinator_up",
            "1 when the last coordinator call succeeded",
            m.coordinator_up.clone(),
        );
        registry.register(
            "runtime_up",
            "1 when the last container runtime call succeeded",
            m.runtime_up.clone(),
        );
        registry.register(
            "workers",
            "Opted-in worker containers seen in the last cycle",
            m.workers.clone(),
        );
        registry.register(
            "dry_run",
            "1 when the agent runs in observe mode (restarts never run)",
            m.dry_run.clone(),
        );
        registry.register_with_unit(
            "cycle_duration",
            "Duration of one evaluation cycle",
            prometheus_client::registry::Unit::Seconds,
            m.cycle_seconds.clone(),
        );
        registry.register(
            "metadata_errors",
            "GCE metadata server errors by key and kind (unavailable, rate-limited, not-found, timeout, malformed, transport)",
            m.metadata_errors.clone(),
        );
        registry.register(
            "interruptions",
            "Interruptions seen, by type (preemption, host-maintenance) and reason, as GKE's interruption_count",
            m.interruptions.clone(),
        );
        registry.register(
            "maintenance_phase",
            "1 for the node's current maintenance phase (none, pending, ongoing, terminating)",
            m.maintenance.clone(),
        );
        registry.register(
            "checkpoints",
            "Checkpoint requests by method (signal, http, redis) and outcome (acked, timed-out, failed)",
            m.checkpoints.clone(),
        );
        registry.register_with_unit(
            "checkpoint_duration",
            "Time from checkpoint request to acknowledgement (or give-up)",
            prometheus_client::registry::Unit::Seconds,
            m.checkpoint_seconds.clone(),
        );
        registry.register(
            "kube_errors",
            "Kubernetes API errors by operation (get, patch, event)",
            m.kube_errors.clone(),
        );
        registry.register(
            "build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Metrics { registry, ..m }
    }

    pub fn verdict(&self, v: &'static str) {
        self.verdicts.get_or_create(&vec![("verdict", v)]).inc();
    }
    pub fn decision(&self, d: &'static str) {
        self.decisions.get_or_create(&vec![("decision", d)]).inc();
    }
    pub fn restart(&self, reason: &'static str, outcome: &'static str) {
        self.restarts
            .get_or_create(&vec![("reason", reason), ("outcome", outcome)])
            .inc();
    }
    pub fn alert(&self, kind: &'static str, outcome: &'static str) {
        self.alerts
            .get_or_create(&vec![("kind", kind), ("outcome", outcome)])
            .inc();
    }

    pub fn metadata_error(&self, key: &'static str, kind: &'static str) {
        self.metadata_errors
            .get_or_create(&vec![("key", key), ("kind", kind)])
            .inc();
    }
    pub fn kube_error(&self, op: &'static str) {
        self.kube_errors.get_or_create(&vec![("op", op)]).inc();
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_suffixes_do_not_drift() {
        let m = Metrics::new();
        m.verdict("hung");
        m.decision("restarted");
        m.restart("hung", "restarted");
        m.alert("hung", "sent");
        m.coordinator_errors.inc();
        m.cycle_seconds.observe(0.01);
        let text = m.encode();
        for want in [
            "# TYPE vigil_verdicts counter",
            "vigil_verdicts_total{verdict=\"hung\"} 1",
            "vigil_decisions_total{decision=\"restarted\"} 1",
            "vigil_restarts_total{reason=\"hung\",outcome=\"restarted\"} 1",
            "vigil_alerts_total{kind=\"hung\",outcome=\"sent\"} 1",
            "vigil_coordinator_errors_total 1",
            "vigil_runtime_errors_total 0",
            "# TYPE vigil_coordinator_up gauge",
            "# TYPE vigil_cycle_duration_seconds histogram",
            "# UNIT vigil_cycle_duration_seconds seconds",
            "vigil_build_info{version=",
            "# EOF",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
