//! The node's life: GCE metadata errors, interruptions and the maintenance phase, the checkpoint
//! rounds they start, and the Kubernetes API the node record is published through.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use super::{F64Gauge, Labels};
use crate::vocab::maintenance::DrillResult;

#[derive(Default)]
pub(crate) struct MaintenanceMetrics {
    /// A metadata server error: the key read and the kind of error.
    pub(crate) metadata_errors: Family<Labels<2>, Counter>,
    /// An interruption: its type (preemption, host-maintenance) and reason.
    pub(crate) interruptions: Family<Labels<2>, Counter>,
    pub(crate) phases: Family<Labels<1>, Gauge>,
    pub(crate) window_start: Gauge,
    /// Why the node is not idle for opportunistic maintenance
    /// (`crate::maintenance::policy_idle::BusyReason`).
    pub(crate) busy: Family<Labels<1>, Gauge>,
}

impl MaintenanceMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = MaintenanceMetrics::default();
        register!(reg;
            "metadata_errors" => m.metadata_errors,
                "GCE metadata server errors by key and kind (unavailable, rate-limited, not-found, timeout, malformed, transport)";
            "interruptions" => m.interruptions,
                "Interruptions seen, by type (preemption, host-maintenance) and reason, as GKE's interruption_count";
            "maintenance_phase" => m.phases,
                "1 for the node's current maintenance phase (none, pending, ongoing, terminating)";
            "maintenance_window_start_timestamp" in Unit::Seconds => m.window_start,
                "Unix time the node's scheduled maintenance window starts (upcoming-maintenance); 0 when none is scheduled";
            "opportunistic_busy" => m.busy,
                "1 for each reason the node was not idle at the last opportunistic-maintenance idle check (worker-not-idle, accelerator-pod, gpu-compute-process, and the *-unknown witnesses); checked only while a rescheduleable maintenance is pending";
        );
        m
    }

    /// Set one idle-check reason's series.
    pub(crate) fn busy(&self, reason: &'static str, present: bool) {
        self.busy.get_or_create(&[("reason", reason)]).set(i64::from(present));
    }

    pub(crate) fn metadata_error(&self, key: &'static str, kind: &'static str) {
        self.metadata_errors.get_or_create(&[("key", key), ("kind", kind)]).inc();
    }
    pub(crate) fn interruption(&self, r#type: &'static str, reason: &'static str) {
        self.interruptions.get_or_create(&[("type", r#type), ("reason", reason)]).inc();
    }
    /// The scheduled window's start (ms since the epoch), `None` when nothing is scheduled.
    pub(crate) fn window_start(&self, at: Option<crate::clock::Millis>) {
        self.window_start.set(at.map_or(0, |ms| ms / 1000));
    }
    /// Set one phase's series: 1 for the current phase, 0 for the others.
    pub(crate) fn phase(&self, phase: &'static str, current: bool) {
        self.phases.get_or_create(&[("phase", phase)]).set(i64::from(current));
    }
}

pub(crate) struct CheckpointMetrics {
    /// A checkpoint request: its method (record, signal, http, invalid, gang, none) and outcome
    /// (acked, timed-out, failed).
    pub(crate) checkpoints: Family<Labels<2>, Counter>,
    pub(crate) checkpoint_seconds: Histogram,
}

impl CheckpointMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let checkpoint_seconds = Histogram::new(exponential_buckets(0.25, 2.0, 10));
        let m = CheckpointMetrics { checkpoints: Family::default(), checkpoint_seconds };
        // NB: at 0 from the start, so that the first cut-short round of an agent's life is an
        // increase (the checkpoint alert rules take `increase()`): every method's outcomes, the
        // round cut short at the grace period (`none`) and the worker whose method is invalid.
        for method in ["record", "signal", "http", "gang"] {
            for outcome in ["acked", "timed-out", "failed"] {
                let _ = m.checkpoints.get_or_create(&[("method", method), ("outcome", outcome)]);
            }
        }
        for (method, outcome) in [("none", "timed-out"), ("invalid", "failed")] {
            let _ = m.checkpoints.get_or_create(&[("method", method), ("outcome", outcome)]);
        }
        register!(reg;
            "checkpoints" => m.checkpoints,
                "Checkpoint requests by method (record, signal, http, invalid, gang, none) and outcome (acked, timed-out, failed)";
            "checkpoint_duration" in Unit::Seconds => m.checkpoint_seconds,
                "Time from checkpoint request to acknowledgement (or give-up)";
        );
        m
    }

    /// One request, counted by method and outcome, and the `seconds` it waited.
    pub(crate) fn record(&self, method: &'static str, outcome: &'static str, seconds: f64) {
        self.checkpoints.get_or_create(&[("method", method), ("outcome", outcome)]).inc();
        self.checkpoint_seconds.observe(seconds);
    }
}

#[derive(Default)]
pub(crate) struct KubeMetrics {
    /// By Kubernetes API operation (get, patch, event).
    pub(crate) kube_errors: Family<Labels<1>, Counter>,
}

impl KubeMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = KubeMetrics::default();
        register!(reg;
            "kube_errors" => m.kube_errors,
                "Kubernetes API errors by operation (get, patch, event)";
        );
        m
    }

    pub(crate) fn error(&self, op: &'static str) {
        self.kube_errors.get_or_create(&[("op", op)]).inc();
    }
}

/// The node as GKE's labels describe it (one series: the last read).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NodeInfoLabels {
    /// The pool the node counts in (`fleet.pool`, else `cloud.google.com/gke-nodepool`).
    pub(crate) pool: String,
    /// `standard`, `spot`, `preemptible`, `flex-start`, `other`, or empty when unknown.
    pub(crate) provisioning: &'static str,
    /// `cloud.google.com/gke-accelerator`, else `cloud.google.com/gke-tpu-accelerator`.
    pub(crate) accelerator: String,
    /// `cloud.google.com/gke-tpu-topology`.
    pub(crate) tpu_topology: String,
}

#[derive(Default)]
pub(crate) struct NodeInfoMetrics {
    pub(crate) info: Family<NodeInfoLabels, Gauge>,
    /// By maintenance source: `metadata` or `node-labels`.
    pub(crate) sources: Family<Labels<1>, Gauge>,
    /// The labels of the `info` series now exported, to remove it when they change.
    current: std::sync::Mutex<Option<NodeInfoLabels>>,
}

impl NodeInfoMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = NodeInfoMetrics::default();
        for source in ["metadata", "node-labels"] {
            m.source(source, false);
        }
        register!(reg;
            "node_info" => m.info,
                "Always 1: the node's pool, provisioning model, accelerator and TPU topology, as its Node's labels (or fleet.pool) say";
            "maintenance_source" => m.sources,
                "1 while that source (metadata, node-labels) reports maintenance (a phase other than none)";
        );
        m
    }

    /// Export `labels` as the node's one info series (the previous one, if different, goes).
    pub(crate) fn set_info(&self, labels: NodeInfoLabels) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = current.take().filter(|old| *old != labels) {
            self.info.remove(&old);
        }
        self.info.get_or_create(&labels).set(1);
        *current = Some(labels);
    }

    /// Whether `source` reports maintenance now.
    pub(crate) fn source(&self, source: &'static str, reporting: bool) {
        self.sources.get_or_create(&[("source", source)]).set(i64::from(reporting));
    }
}

/// The last checkpoint drill of each target whose first node this is (`vigil drill
/// checkpoint`): as many series as targets drilled in the last 30 days. Labelled by the target
/// (`gang:<id>`, `worker:<node>/<id>` or `node:<name>`).
#[derive(Default)]
pub(crate) struct DrillMetrics {
    /// By `quantile`: `0.5` (the median member's acknowledgement) or `1` (the last one's).
    seconds: Family<Labels<2, String>, F64Gauge>,
    /// By the `budget` measured against (`preemption`, `maintenance`).
    fits: Family<Labels<2, String>, Gauge>,
    at: Family<Labels<1, String>, Gauge>,
}

impl DrillMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = DrillMetrics::default();
        register!(reg;
            "checkpoint_drill" in Unit::Seconds => m.seconds,
                "The last checkpoint drill of a target: seconds to the acknowledgements of the median member (quantile 0.5) and of the last (quantile 1; the drill's whole wait when a member never answered)";
            "checkpoint_drill_fits" => m.fits,
                "Whether every member of the target acknowledged its last drill within the budget (preemption, maintenance): 1 yes, 0 no";
            "checkpoint_drill_timestamp" in Unit::Seconds => m.at,
                "When the target's last drill ran (Unix time)";
        );
        m
    }

    /// Export exactly these drills (a target no longer stored loses its series).
    pub(crate) fn set(&self, drills: &[DrillResult]) {
        self.seconds.clear();
        self.fits.clear();
        self.at.clear();
        for d in drills {
            let target = || ("target", d.target.clone());
            for (quantile, v) in [("0.5", d.p50), ("1", d.all)] {
                self.seconds.get_or_create(&[target(), ("quantile", quantile.into())]).set(v);
            }
            let budgets = [("preemption", d.fits_preemption), ("maintenance", d.fits_maintenance)];
            for (budget, fits) in budgets {
                self.fits.get_or_create(&[target(), ("budget", budget.into())]).set(fits.into());
            }
            self.at.get_or_create(&[target()]).set(d.at / 1000);
        }
    }
}

#[cfg(any(test, feature = "bench"))]
impl DrillMetrics {
    /// One series in each family, for the docs' drift check.
    pub(crate) fn touch(&self) {
        self.set(&[DrillResult {
            target: "gang:touched".into(),
            at: 0,
            asked: 1,
            acked: 1,
            p50: 1.0,
            all: 1.0,
            preemption_budget: 1.0,
            maintenance_budget: 1.0,
            fits_preemption: true,
            fits_maintenance: true,
            missing: Vec::new(),
        }]);
    }
}
