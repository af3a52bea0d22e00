//! TPU metrics: whether the node's TPU chips are watched, their health, how many are present
//! against the Node's allocatable `google.com/tpu`, and the device errors counted. Fixed label
//! values only.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Labels;

/// Set by the report (`crate::accel::tpu::tracked`), each family under one label.
#[derive(Default)]
pub(crate) struct TpuMetrics {
    pub(crate) monitoring: Gauge,
    /// `state`: `healthy`, `degraded` or `failed`.
    pub(crate) health: Family<Labels<1>, Gauge>,
    /// `kind`: `present` (device files) or `expected` (allocatable `google.com/tpu`).
    pub(crate) chips: Family<Labels<1>, Gauge>,
    /// `severity`: `error` or `fatal`.
    pub(crate) device_errors: Family<Labels<1>, Counter>,
}

impl TpuMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = TpuMetrics::default();
        register!(reg;
            "tpu_monitoring" => m.monitoring, "1 when this is a TPU node and its chips are watched";
            "tpu_health" => m.health,
                "1 for the node's current TPU health (healthy, degraded, failed)";
            "tpu_chips" => m.chips,
                "TPU chips by kind: present (a device file) and expected (allocatable google.com/tpu; absent while unknown)";
            "tpu_device_errors" => m.device_errors,
                "Device errors of the TPU chips by severity (error, fatal), from the kernel log and the PCIe AER counters";
        );
        // Alert rules take increase() of it: created at 0.
        for severity in ["error", "fatal"] {
            let _ = m.device_errors.get_or_create(&[("severity", severity)]);
        }
        m
    }
}

#[cfg(any(test, feature = "bench"))]
impl TpuMetrics {
    /// Create one series in every family (see `Metrics::touch_all`), set here directly: the
    /// report that fills them in a running agent is the feature's (`crate::accel::tpu::tracked`).
    pub(crate) fn touch(&self) {
        self.monitoring.set(1);
        self.health.get_or_create(&[("state", "healthy")]).set(1);
        self.chips.get_or_create(&[("kind", "expected")]).set(4);
        self.device_errors.get_or_create(&[("severity", "error")]).inc_by(0);
    }
}
