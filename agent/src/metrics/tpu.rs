//! TPU metrics: whether the node's TPU chips are watched, their health, how many are present
//! against the Node's allocatable `google.com/tpu`, and the device errors counted. Fixed label
//! values only.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::accel::tpu::model::TpuReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TpuStateLabels {
    pub(crate) state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TpuChipLabels {
    /// `present` (device files) or `expected` (allocatable `google.com/tpu`).
    pub(crate) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TpuErrorLabels {
    /// `error` or `fatal`.
    pub(crate) severity: &'static str,
}

#[derive(Default)]
pub(crate) struct TpuMetrics {
    pub(crate) monitoring: Gauge,
    pub(crate) health: Family<TpuStateLabels, Gauge>,
    pub(crate) chips: Family<TpuChipLabels, Gauge>,
    pub(crate) device_errors: Family<TpuErrorLabels, Counter>,
}

/// What [`TpuMetrics::record`] already counted: (error, fatal).
#[derive(Debug, Default)]
pub(crate) struct TpuMetricsState {
    counted: (u64, u64),
}

impl TpuMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = TpuMetrics::default();
        reg.register(
            "tpu_monitoring",
            "1 when this is a TPU node and its chips are watched",
            m.monitoring.clone(),
        );
        reg.register(
            "tpu_health",
            "1 for the node's current TPU health (healthy, degraded, failed)",
            m.health.clone(),
        );
        reg.register(
            "tpu_chips",
            "TPU chips by kind: present (a device file) and expected (allocatable google.com/tpu; absent while unknown)",
            m.chips.clone(),
        );
        reg.register(
            "tpu_device_errors",
            "Device errors of the TPU chips by severity (error, fatal), from the kernel log and the PCIe AER counters",
            m.device_errors.clone(),
        );
        // Alert rules take increase() of it: created at 0.
        for severity in ["error", "fatal"] {
            let _ = m.device_errors.get_or_create(&TpuErrorLabels { severity });
        }
        m
    }

    /// Export one TPU report; the error counters advance by what `seen` has not counted yet.
    pub(crate) fn record(&self, r: &TpuReport, seen: &mut TpuMetricsState) {
        self.monitoring.set(i64::from(r.monitoring));
        for state in ["healthy", "degraded", "failed"] {
            let on = r.monitoring && r.health.as_str() == state;
            self.health
                .get_or_create(&TpuStateLabels { state })
                .set(i64::from(on));
        }
        let present = TpuChipLabels { kind: "present" };
        let expected = TpuChipLabels { kind: "expected" };
        self.chips.get_or_create(&present).set(i64::from(r.present));
        match r.expected {
            Some(n) => {
                self.chips.get_or_create(&expected).set(i64::from(n));
            }
            None => {
                self.chips.remove(&expected);
            }
        }
        let (error, fatal) = r.errors_total;
        for (severity, now, before) in [
            ("error", error, &mut seen.counted.0),
            ("fatal", fatal, &mut seen.counted.1),
        ] {
            if now > *before {
                self.device_errors
                    .get_or_create(&TpuErrorLabels { severity })
                    .inc_by(now - *before);
            }
            *before = now;
        }
    }

    /// Create one series in every family (see `Metrics::touch_all`).
    pub(crate) fn touch(&self) {
        let report = TpuReport {
            monitoring: true,
            expected: Some(4),
            ..TpuReport::default()
        };
        self.record(&report, &mut TpuMetricsState::default());
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;
    use crate::accel::tpu::model::TpuHealth;

    #[test]
    fn a_report_sets_the_gauges_and_advances_the_counters_once() {
        let m = Metrics::new();
        let mut seen = TpuMetricsState::default();
        let mut r = TpuReport {
            monitoring: true,
            present: 3,
            expected: Some(4),
            health: TpuHealth::Failed,
            errors_total: (2, 1),
            ..TpuReport::default()
        };
        m.tpu.record(&r, &mut seen);
        m.tpu.record(&r, &mut seen);
        r.errors_total = (3, 1);
        r.expected = None;
        m.tpu.record(&r, &mut seen);
        let text = m.encode();
        for want in [
            "vigil_tpu_monitoring 1",
            "vigil_tpu_health{state=\"failed\"} 1",
            "vigil_tpu_health{state=\"healthy\"} 0",
            "vigil_tpu_chips{kind=\"present\"} 3",
            "vigil_tpu_device_errors_total{severity=\"error\"} 3",
            "vigil_tpu_device_errors_total{severity=\"fatal\"} 1",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("kind=\"expected\""), "unknown: no series");
    }
}
