//! Prometheus metrics, registered once and grouped by concern: each group registers its own
//! families (`register(&mut Registry) -> Self`) and owns its label sets (a struct, or a `Labels`
//! array where one method writes the family's series). Label values are fixed `&'static str`
//! values (verdict names, decision codes, alert kinds), a GPU's index and UUID, or the id of a
//! worker this node watches now (`workers`: series removed when the worker goes): never jobs,
//! containers or error text, so cardinality is bounded by the node's GPUs and workers.
//!
//! Counters that alert rules take `increase()` of are created at 0 when registered (a series
//! that first appears at 1 has no increase to Prometheus).
//!
//! The groups register in a fixed order, and an encoding lists families in that order.

/// Register metrics in the order given (a scrape lists the families in registration order):
/// `register!(reg; "name" => m.field, "help"; "name" in Unit::Seconds => m.field, "help";)`.
macro_rules! register {
    ($reg:expr; $($name:literal $(in $unit:expr)? => $metric:expr, $help:expr;)+) => {
        $(register!(@one $reg, $name, $help, $metric.clone() $(, $unit)?);)+
    };
    (@one $reg:expr, $name:expr, $help:expr, $metric:expr) => {
        $reg.register($name, $help, $metric)
    };
    (@one $reg:expr, $name:expr, $help:expr, $metric:expr, $unit:expr) => {
        $reg.register_with_unit($name, $help, $unit, $metric)
    };
}

mod classic;
mod cycle;
mod decisions;
pub(crate) mod gpu;
mod lost;
mod node;
mod pace;
pub(crate) mod tpu;
mod worker_api;
mod workers;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use classic::to_classic_text;
pub(crate) use cycle::{BackendMetrics, BudgetMetrics, CycleMetrics};
pub(crate) use decisions::DecisionMetrics;
pub(crate) use gpu::GpuMetrics;
pub(crate) use lost::LostMetrics;
pub use lost::{Ledger as LostLedger, CAUSES as LOST_CAUSES};
pub(crate) use node::{
    CheckpointMetrics, DrillMetrics, KubeMetrics, MaintenanceMetrics, NodeInfoLabels,
    NodeInfoMetrics,
};
pub(crate) use pace::PaceMetrics;
pub(crate) use tpu::TpuMetrics;
pub(crate) use worker_api::WorkerApiMetrics;
pub(crate) use workers::{WorkerMetrics, WorkerSample};

/// A label set of fixed names, in the order encoded: `[("reason", reason), ("outcome", outcome)]`.
type Labels<const N: usize, V = &'static str> = [(&'static str, V); N];
/// A gauge of floating-point values.
type F64Gauge = Gauge<f64, std::sync::atomic::AtomicU64>;

pub struct Metrics {
    registry: Registry,
    /// Verdicts, decision trail entries, restarts and alerts.
    pub(crate) decisions: DecisionMetrics,
    /// The coordinator's and the container runtime's health.
    pub(crate) backends: BackendMetrics,
    /// One evaluation cycle: workers seen, observe mode, duration.
    pub(crate) cycle: CycleMetrics,
    /// Each watched worker's verdict, heartbeat age and last restart.
    pub(crate) workers: WorkerMetrics,
    /// Gangs' pace: step rates, baselines, slow episodes.
    pub(crate) pace: PaceMetrics,
    /// Time lost, by cause, and the time to recovery.
    pub(crate) lost: LostMetrics,
    /// GCE metadata errors, interruptions and the maintenance phase.
    pub(crate) maintenance: MaintenanceMetrics,
    /// The node as its Node's labels describe it, and which maintenance sources report.
    pub(crate) node_info: NodeInfoMetrics,
    /// Checkpoint requests and how long they took.
    pub(crate) checkpoints: CheckpointMetrics,
    /// The last checkpoint drill of each target whose first node this is.
    pub(crate) drills: DrillMetrics,
    /// Kubernetes API errors.
    pub(crate) kube: KubeMetrics,
    /// The node's circuit breaker and the fleet budget.
    pub(crate) budgets: BudgetMetrics,
    /// NVML monitoring and per-GPU health, samples, memory errors, throttling and XIDs.
    pub(crate) gpu: GpuMetrics,
    /// TPU monitoring, health, chips and device errors.
    pub(crate) tpu: TpuMetrics,
    /// Writes to the worker API, by outcome.
    pub(crate) worker_api: WorkerApiMetrics,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut reg = Registry::with_prefix("vigil");
        // NB: the order of these fields is the order of the families in a scrape (a struct
        // literal's fields are evaluated in the order written), `build_info` last.
        let mut m = Metrics {
            decisions: DecisionMetrics::register(&mut reg),
            backends: BackendMetrics::register(&mut reg),
            cycle: CycleMetrics::register(&mut reg),
            workers: WorkerMetrics::register(&mut reg),
            pace: PaceMetrics::register(&mut reg),
            lost: LostMetrics::register(&mut reg),
            maintenance: MaintenanceMetrics::register(&mut reg),
            node_info: NodeInfoMetrics::register(&mut reg),
            checkpoints: CheckpointMetrics::register(&mut reg),
            drills: DrillMetrics::register(&mut reg),
            kube: KubeMetrics::register(&mut reg),
            budgets: BudgetMetrics::register(&mut reg),
            gpu: GpuMetrics::register(&mut reg),
            tpu: TpuMetrics::register(&mut reg),
            worker_api: WorkerApiMetrics::register(&mut reg),
            registry: reg,
        };
        // NB: a gauge fixed at 1 rather than an OpenMetrics `info`, so that parsers of the
        // classic text format (promtool, older scrapers) read it too.
        let build: Family<Labels<1>, Gauge> = Family::default();
        build.get_or_create(&[("version", env!("CARGO_PKG_VERSION"))]).set(1);
        m.registry.register("build_info", "Build information (always 1)", build);
        m
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(any(test, feature = "bench"))]
impl Metrics {
    /// Create one series in every family, so an encoding lists them all (the docs drift
    /// check and `promtool` see every name, not only those that happened to be touched).
    pub fn touch_all(&self) {
        self.decisions.verdict("healthy");
        self.decisions.decision("agent-started");
        self.decisions.restart("hung", "restarted");
        self.decisions.alert("hung", "logged");
        self.maintenance.metadata_error("preempted", "timeout");
        self.kube.error("get");
        self.maintenance.interruption("preemption", "preempted");
        self.maintenance.phase("none", true);
        self.maintenance.busy("accelerator-pod", false);
        self.node_info.set_info(NodeInfoLabels {
            pool: "touched".into(),
            provisioning: "standard",
            accelerator: String::new(),
            tpu_topology: String::new(),
        });
        self.checkpoints.record("record", "acked", 1.0);
        self.drills.touch();
        self.gpu.touch();
        self.tpu.touch();
        self.worker_api.write("tcp", "accepted");
        self.workers.observe(WorkerSample {
            worker: "touched",
            state: "healthy",
            stage: "quiet",
            now: 1_000,
            heartbeat: Some(0),
            restarted: Some(0),
            silence: Some(120_000),
        });
        self.pace.observe("touched", "touched", Some(1.0), Some(1.0), false);
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
    fn classic_text_names_counters_with_their_suffix() {
        let m = Metrics::new();
        m.decisions.decision("restarted");
        let classic = to_classic_text(&m.encode());
        assert!(classic.contains("# TYPE vigil_decisions_total counter"));
        assert!(classic.contains("# HELP vigil_decisions_total "));
        assert!(classic.contains("vigil_decisions_total{decision=\"restarted\"} 1"));
        assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"));
        assert!(classic.contains("# TYPE vigil_cycle_duration_seconds histogram"));
    }

    #[test]
    fn names_and_suffixes_do_not_drift() {
        let m = Metrics::new();
        m.decisions.verdict("hung");
        m.decisions.decision("restarted");
        m.decisions.restart("hung", "restarted");
        m.decisions.alert("hung", "sent");
        m.backends.coordinator_error();
        m.cycle.observe(0.01);
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

    #[test]
    fn families_keep_their_order() {
        let m = Metrics::new();
        m.touch_all();
        let names: Vec<_> = m
            .encode()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(n, _)| n.trim_start_matches("vigil_").to_string())
            .collect();
        let want = [
            "verdicts",
            "decisions",
            "restarts",
            "alerts",
            "coordinator_errors",
            "runtime_errors",
            "coordinator_up",
            "runtime_up",
            "workers",
            "dry_run",
            "cycle_duration_seconds",
            "worker_state",
            "worker_incident_stage",
            "worker_heartbeat_age_seconds",
            "worker_allowed_silence_seconds",
            "worker_last_restart_timestamp_seconds",
            "gang_step_rate",
            "gang_step_rate_baseline",
            "gang_slow",
            "gang_slow_episodes",
            "lost_seconds",
            "time_to_recovery_seconds",
            "metadata_errors",
            "interruptions",
            "maintenance_phase",
            "maintenance_window_start_timestamp_seconds",
            "opportunistic_busy",
            "node_info",
            "maintenance_source",
            "checkpoints",
            "checkpoint_duration_seconds",
            "checkpoint_drill_seconds",
            "checkpoint_drill_fits",
            "checkpoint_drill_timestamp_seconds",
            "kube_errors",
            "breaker_used",
            "breaker_open",
            "breaker_limit",
            "fleet_budget_used",
            "fleet_budget_limit",
            "fleet_budget_exhausted",
            "gpu_monitoring",
            "gpu_monitor_state",
            "gpu_health",
            "gpu_temperature_celsius",
            "gpu_power_watts",
            "gpu_utilization_ratio",
            "gpu_memory_used_bytes",
            "gpu_memory_total_bytes",
            "gpu_ecc_errors",
            "gpu_retired_pages",
            "gpu_retired_pages_pending",
            "gpu_remapped_rows",
            "gpu_remap_pending",
            "gpu_remap_failure",
            "gpu_throttle",
            "gpu_xid_events",
            "tpu_monitoring",
            "tpu_health",
            "tpu_chips",
            "tpu_device_errors",
            "worker_api_writes",
            "build_info",
        ];
        assert_eq!(names, want);
    }
}
