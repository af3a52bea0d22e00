//! The TPU report as the tracker publishes it (`crate::accel::tracker::Tracked`): its alert,
//! trail code and advice, and its metric series — whether the chips are watched, their health,
//! how many are present against the Node's allocatable, and the device errors counted, set on the
//! families `crate::metrics` registers. Here, with the kind, so neither the tracker nor the
//! metrics infrastructure names a TPU type.

use crate::accel::tpu::model::TpuReport;
use crate::accel::tracker::Tracked;
use crate::alerts::AlertKind;
use crate::metrics::Metrics;
use crate::trail::Code;

impl Tracked for TpuReport {
    /// What [`Tracked::record`] already counted: (error, fatal).
    type Seen = (u64, u64);
    const ALERT: AlertKind = AlertKind::TpuFailed;
    const TRAIL: Code = Code::TpuHealth;
    const ADVICE: &'static str =
        "a restart cannot fix hardware: drain the node and have its TPU chips checked";
    /// Export one TPU report; the error counters advance by what `seen` has not counted yet.
    fn record(&self, metrics: &Metrics, seen: &mut (u64, u64)) {
        let m = &metrics.tpu;
        m.monitoring.set(i64::from(self.monitoring));
        for state in ["healthy", "degraded", "failed"] {
            let on = self.monitoring && self.health.as_str() == state;
            m.health.get_or_create(&[("state", state)]).set(i64::from(on));
        }
        let (present, expected) = ([("kind", "present")], [("kind", "expected")]);
        m.chips.get_or_create(&present).set(i64::from(self.present));
        if let Some(n) = self.expected {
            m.chips.get_or_create(&expected).set(i64::from(n));
        } else {
            m.chips.remove(&expected);
        }
        let total = self.errors_total;
        let was = std::mem::replace(seen, total);
        for (severity, now, before) in [("error", total.0, was.0), ("fatal", total.1, was.1)] {
            if now > before {
                m.device_errors.get_or_create(&[("severity", severity)]).inc_by(now - before);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accel::tpu::model::TpuHealth;
    use crate::metrics::Metrics;

    #[test]
    fn a_report_sets_the_gauges_and_advances_the_counters_once() {
        let m = Metrics::new();
        let mut seen = (0, 0);
        let mut r = TpuReport {
            monitoring: true,
            present: 3,
            expected: Some(4),
            health: TpuHealth::Failed,
            errors_total: (2, 1),
            ..TpuReport::default()
        };
        r.record(&m, &mut seen);
        r.record(&m, &mut seen);
        r.errors_total = (3, 1);
        r.expected = None;
        r.record(&m, &mut seen);
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
