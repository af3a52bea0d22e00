//! The GPU report as the tracker publishes it (`crate::accel::tracker::Tracked`): its alert,
//! trail code and advice, and its metric series — the monitor's state, each GPU's health,
//! samples, memory errors, throttle reasons and XID counters, set on the families
//! `crate::metrics` registers. Here, with the kind, so neither the tracker nor the metrics
//! infrastructure names a GPU type.

use std::collections::{BTreeMap, BTreeSet};

use crate::accel::gpu::model::{GpuMonitorState, GpuReport, GpuSample};
use crate::accel::tracker::Tracked;
use crate::alerts::AlertKind;
use crate::metrics::gpu::{GpuLabels, GpuMetrics};
use crate::metrics::Metrics;
use crate::trail::Code;

impl Tracked for GpuReport {
    type Seen = GpuMetricsState;
    const ALERT: AlertKind = AlertKind::GpuFailed;
    const TRAIL: Code = Code::GpuHealth;
    const ADVICE: &'static str =
        "a restart cannot fix hardware: drain the node and have the GPU checked";
    /// Export one GPU report: gauges set from the latest samples, the XID counter advanced by
    /// the occurrences since the last report (`seen` remembers what was already counted).
    fn record(&self, metrics: &Metrics, seen: &mut GpuMetricsState) {
        let m = &metrics.gpu;
        m.monitoring.set(i64::from(self.monitoring()));
        for &state in <GpuMonitorState as strum::VariantArray>::VARIANTS {
            let labels = [("state", state.as_str())];
            m.monitor_state.get_or_create(&labels).set(i64::from(state == self.state));
        }
        for g in &self.gpus {
            let id = GpuLabels { gpu: g.index, uuid: g.uuid.clone() };
            for state in ["healthy", "degraded", "failed"] {
                let labels = (id.clone(), [("state", state)]);
                m.health.get_or_create(&labels).set(i64::from(g.health.as_str() == state));
            }
            record_sample(m, &id, &g.sample);
            record_throttle(m, &id, &g.sample, seen);
            // Each XID's counter advances by the occurrences since the last report.
            for (xid, count) in &g.xid_counts {
                let before = seen.xids.insert((id.uuid.clone(), *xid), *count).unwrap_or(0);
                if *count > before {
                    let labels = (id.clone(), [("xid", *xid)]);
                    m.xid_events.get_or_create(&labels).inc_by(count - before);
                }
            }
        }
    }
}

/// What [`Tracked::record`] already exported.
#[derive(Debug, Default)]
pub(crate) struct GpuMetricsState {
    xids: BTreeMap<(String, u64), u64>,
    throttled: BTreeSet<(String, &'static str)>,
}

/// A count as a gauge value, saturating at `i64::MAX`.
fn saturating(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// The sample's readings — temperature, power, utilisation, memory, ECC counts, retired pages
/// and remapped rows — each when the sample has it.
fn record_sample(m: &GpuMetrics, id: &GpuLabels, s: &GpuSample) {
    let remap = s.remapped_rows;
    for (gauge, v) in [
        (&m.temperature, s.temperature_c.map(i64::from)),
        (&m.memory_used, s.memory_used_bytes.map(saturating)),
        (&m.memory_total, s.memory_total_bytes.map(saturating)),
        (&m.retired_pages, s.retired_pages.map(saturating)),
        (&m.retired_pages_pending, s.retired_pages_pending.map(i64::from)),
        (&m.remap_pending, remap.map(|r| i64::from(r.pending))),
        (&m.remap_failure, remap.map(|r| i64::from(r.failure))),
    ] {
        let Some(v) = v else { continue };
        gauge.get_or_create(id).set(v);
    }
    for (gauge, v) in [(&m.power, s.power_w), (&m.utilization, s.utilization)] {
        let Some(v) = v else { continue };
        gauge.get_or_create(id).set(v);
    }
    for (counter, severity, v) in [
        ("volatile", "corrected", s.ecc_volatile_corrected),
        ("volatile", "uncorrected", s.ecc_volatile_uncorrected),
        ("aggregate", "corrected", s.ecc_aggregate_corrected),
        ("aggregate", "uncorrected", s.ecc_aggregate_uncorrected),
    ] {
        let Some(v) = v else { continue };
        let labels = (id.clone(), [("counter", counter), ("severity", severity)]);
        m.ecc_errors.get_or_create(&labels).set(saturating(v));
    }
    let rows = remap.map(|r| [("correctable", r.correctable), ("uncorrectable", r.uncorrectable)]);
    for (kind, v) in rows.into_iter().flatten() {
        let labels = (id.clone(), [("kind", kind)]);
        m.remapped_rows.get_or_create(&labels).set(i64::from(v));
    }
}

/// Throttle reasons: 1 while active, back to 0 once they clear.
fn record_throttle(m: &GpuMetrics, id: &GpuLabels, s: &GpuSample, seen: &mut GpuMetricsState) {
    seen.throttled.extend(s.throttle_reasons.iter().map(|reason| (id.uuid.clone(), *reason)));
    for (_, reason) in seen.throttled.iter().filter(|(u, _)| *u == id.uuid) {
        let labels = (id.clone(), [("reason", *reason)]);
        m.throttle.get_or_create(&labels).set(i64::from(s.throttle_reasons.contains(reason)));
    }
}
