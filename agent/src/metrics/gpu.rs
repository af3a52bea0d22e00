//! GPU metrics: whether NVML is watched, and per GPU its health, latest samples, memory errors,
//! clock-throttle reasons and XID events. Labelled by the GPU's index and UUID (bounded by the
//! GPUs in one node) plus fixed names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::{F64Gauge, Labels};

/// One GPU: its NVML index and UUID.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GpuLabels {
    pub(crate) gpu: u32,
    pub(crate) uuid: String,
}

/// One GPU and its series' own labels, encoded after `gpu` and `uuid`: a health `state`, an ECC
/// count's `counter` (volatile, aggregate) and `severity` (corrected, uncorrected), remapped
/// rows' `kind` (correctable, uncorrectable), a throttle `reason`, an `xid`.
type GpuAnd<const N: usize, V = &'static str> = (GpuLabels, Labels<N, V>);

#[derive(Default)]
pub(crate) struct GpuMetrics {
    pub(crate) monitoring: Gauge,
    /// `state`: one of the monitor's (starting, off, no-gpu, waiting-for-driver, on).
    pub(crate) monitor_state: Family<Labels<1>, Gauge>,
    pub(crate) health: Family<GpuAnd<1>, Gauge>,
    pub(crate) temperature: Family<GpuLabels, Gauge>,
    pub(crate) power: Family<GpuLabels, F64Gauge>,
    pub(crate) utilization: Family<GpuLabels, F64Gauge>,
    pub(crate) memory_used: Family<GpuLabels, Gauge>,
    pub(crate) memory_total: Family<GpuLabels, Gauge>,
    pub(crate) ecc_errors: Family<GpuAnd<2>, Gauge>,
    pub(crate) retired_pages: Family<GpuLabels, Gauge>,
    pub(crate) retired_pages_pending: Family<GpuLabels, Gauge>,
    pub(crate) remapped_rows: Family<GpuAnd<1>, Gauge>,
    pub(crate) remap_pending: Family<GpuLabels, Gauge>,
    pub(crate) remap_failure: Family<GpuLabels, Gauge>,
    pub(crate) throttle: Family<GpuAnd<1>, Gauge>,
    pub(crate) xid_events: Family<GpuAnd<1, u64>, Counter>,
}

impl GpuMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = GpuMetrics::default();
        register!(reg;
            "gpu_monitoring" => m.monitoring, "1 when NVML is loaded and GPUs are watched";
            "gpu_monitor_state" => m.monitor_state,
                "1 for the GPU monitor's current state (starting, off, no-gpu, waiting-for-driver, on)";
            "gpu_health" => m.health, "1 for each GPU's current health (healthy, degraded, failed)";
            // The latest samples.
            "gpu_temperature" in Unit::Celsius => m.temperature, "GPU core temperature";
            "gpu_power" in Unit::Other("watts".into()) => m.power, "GPU power draw";
            "gpu_utilization" in Unit::Other("ratio".into()) => m.utilization,
                "GPU utilisation, 0 to 1";
            "gpu_memory_used" in Unit::Bytes => m.memory_used, "GPU memory in use";
            "gpu_memory_total" in Unit::Bytes => m.memory_total, "GPU memory in total";
            // Memory errors.
            "gpu_ecc_errors" => m.ecc_errors,
                "ECC error counts as NVML reports them, by counter (volatile since boot, aggregate lifetime) and severity";
            "gpu_retired_pages" => m.retired_pages,
                "Retired memory pages (single- and double-bit causes)";
            "gpu_retired_pages_pending" => m.retired_pages_pending,
                "1 when a page retirement waits for the next GPU reset";
            "gpu_remapped_rows" => m.remapped_rows,
                "Remapped memory rows by kind (correctable, uncorrectable)";
            "gpu_remap_pending" => m.remap_pending,
                "1 when a row remap waits for the next GPU reset";
            "gpu_remap_failure" => m.remap_failure,
                "1 when a row remap failed (the GPU should be replaced)";
            // Events.
            "gpu_throttle" => m.throttle, "1 for each active clock-throttle reason";
            "gpu_xid_events" => m.xid_events,
                "Critical XID events by GPU and XID (every occurrence counts)";
        );
        m
    }
}

#[cfg(any(test, feature = "bench"))]
impl GpuMetrics {
    /// One series in every GPU family (see `Metrics::touch_all`), set here directly: the report
    /// that fills them in a running agent is the feature's (`crate::accel::gpu::tracked`).
    pub(super) fn touch(&self) {
        let id = GpuLabels { gpu: 0, uuid: "GPU-0".into() };
        self.monitoring.set(1);
        self.monitor_state.get_or_create(&[("state", "on")]).set(1);
        let health = (id.clone(), [("state", "healthy")]);
        self.health.get_or_create(&health).set(1);
        self.temperature.get_or_create(&id).set(40);
        self.power.get_or_create(&id).set(70.0);
        self.utilization.get_or_create(&id).set(0.5);
        self.memory_used.get_or_create(&id).set(1);
        self.memory_total.get_or_create(&id).set(2);
        let ecc = (id.clone(), [("counter", "volatile"), ("severity", "corrected")]);
        self.ecc_errors.get_or_create(&ecc).set(0);
        self.retired_pages.get_or_create(&id).set(0);
        self.retired_pages_pending.get_or_create(&id).set(0);
        let remap = (id.clone(), [("kind", "correctable")]);
        self.remapped_rows.get_or_create(&remap).set(0);
        self.remap_pending.get_or_create(&id).set(0);
        self.remap_failure.get_or_create(&id).set(0);
        let throttle = (id.clone(), [("reason", "gpu-idle")]);
        self.throttle.get_or_create(&throttle).set(1);
        self.xid_events.get_or_create(&(id, [("xid", 13)])).inc();
    }
}
