//! The GPU report as the tracker publishes it (`crate::accel::tracker::Tracked`): its alert,
//! trail code and advice, and its metric series — the monitor's state, each GPU's health,
//! samples, memory errors, throttle reasons and XID counters, set on the families
//! `crate::metrics` registers. Here, with the kind, so neither the tracker nor the metrics
//! infrastructure names a GPU type.

use std::collections::{BTreeMap, BTreeSet};

use crate::accel::gpu::model::{GpuMonitorState, GpuReport, GpuSample, GpuStatus};
use crate::accel::tracker::Tracked;
use crate::alerts::AlertKind;
use crate::metrics::gpu::{
    EccLabels, GpuLabels, GpuMetrics, HealthLabels, MonitorStateLabels, RemapLabels,
    ThrottleLabels, XidLabels,
};
use crate::metrics::Metrics;
use crate::trail::Code;

impl Tracked for GpuReport {
    type Seen = GpuMetricsState;
    const ALERT: AlertKind = AlertKind::GpuFailed;
    const TRAIL: Code = Code::GpuHealth;
    const ADVICE: &'static str =
        "a restart cannot fix hardware: drain the node and have the GPU checked";
    fn record(&self, metrics: &Metrics, seen: &mut GpuMetricsState) {
        record(&metrics.gpu, self, seen);
    }
}

/// What [`record`] already exported.
#[derive(Debug, Default)]
pub(crate) struct GpuMetricsState {
    xids: BTreeMap<(String, u64), u64>,
    throttled: BTreeSet<(String, &'static str)>,
}

/// A count as a gauge value, saturating at `i64::MAX`.
fn saturating(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// Export one GPU report: gauges set from the latest samples, the XID counter advanced by
/// the occurrences since the last report (`seen` remembers what was already counted).
pub(crate) fn record(m: &GpuMetrics, report: &GpuReport, seen: &mut GpuMetricsState) {
    m.monitoring.set(i64::from(report.monitoring()));
    for &state in GpuMonitorState::ALL {
        m.monitor_state
            .get_or_create(&MonitorStateLabels { state: state.as_str() })
            .set(i64::from(state == report.state));
    }
    for g in &report.gpus {
        let id = GpuLabels { gpu: g.index, uuid: g.uuid.clone() };
        record_health(m, &id, g);
        record_sample(m, &id, &g.sample);
        record_memory_errors(m, &id, &g.sample);
        record_throttle(m, &id, &g.sample, seen);
        record_xids(m, &id, g, seen);
    }
}

fn record_health(m: &GpuMetrics, id: &GpuLabels, g: &GpuStatus) {
    for state in ["healthy", "degraded", "failed"] {
        let labels = HealthLabels { id: id.clone(), state };
        m.health.get_or_create(&labels).set(i64::from(g.health.as_str() == state));
    }
}

/// Temperature, power, utilisation and memory, each when the sample has it.
fn record_sample(m: &GpuMetrics, id: &GpuLabels, s: &GpuSample) {
    if let Some(t) = s.temperature_c {
        m.temperature.get_or_create(id).set(i64::from(t));
    }
    if let Some(p) = s.power_w {
        m.power.get_or_create(id).set(p);
    }
    if let Some(u) = s.utilization {
        m.utilization.get_or_create(id).set(u);
    }
    if let Some(bytes) = s.memory_used_bytes {
        m.memory_used.get_or_create(id).set(saturating(bytes));
    }
    if let Some(bytes) = s.memory_total_bytes {
        m.memory_total.get_or_create(id).set(saturating(bytes));
    }
}

/// ECC counts, retired pages and remapped rows, each when the sample has them.
fn record_memory_errors(m: &GpuMetrics, id: &GpuLabels, s: &GpuSample) {
    for (counter, severity, v) in [
        ("volatile", "corrected", s.ecc_volatile_corrected),
        ("volatile", "uncorrected", s.ecc_volatile_uncorrected),
        ("aggregate", "corrected", s.ecc_aggregate_corrected),
        ("aggregate", "uncorrected", s.ecc_aggregate_uncorrected),
    ] {
        if let Some(v) = v {
            let labels = EccLabels { id: id.clone(), counter, severity };
            m.ecc_errors.get_or_create(&labels).set(saturating(v));
        }
    }
    if let Some(r) = s.retired_pages {
        m.retired_pages.get_or_create(id).set(saturating(r));
    }
    if let Some(p) = s.retired_pages_pending {
        m.retired_pages_pending.get_or_create(id).set(i64::from(p));
    }
    if let Some(r) = s.remapped_rows {
        for (kind, v) in [("correctable", r.correctable), ("uncorrectable", r.uncorrectable)] {
            let labels = RemapLabels { id: id.clone(), kind };
            m.remapped_rows.get_or_create(&labels).set(i64::from(v));
        }
        m.remap_pending.get_or_create(id).set(i64::from(r.pending));
        m.remap_failure.get_or_create(id).set(i64::from(r.failure));
    }
}

/// Throttle reasons: 1 while active, back to 0 once they clear.
fn record_throttle(m: &GpuMetrics, id: &GpuLabels, s: &GpuSample, seen: &mut GpuMetricsState) {
    for reason in &s.throttle_reasons {
        seen.throttled.insert((id.uuid.clone(), *reason));
    }
    for (_, reason) in seen.throttled.iter().filter(|(u, _)| *u == id.uuid) {
        let labels = ThrottleLabels { id: id.clone(), reason };
        let active = s.throttle_reasons.contains(reason);
        m.throttle.get_or_create(&labels).set(i64::from(active));
    }
}

/// Advance each XID's counter by the occurrences since the last report.
fn record_xids(m: &GpuMetrics, id: &GpuLabels, g: &GpuStatus, seen: &mut GpuMetricsState) {
    for (xid, count) in &g.xid_counts {
        let before = seen.xids.insert((id.uuid.clone(), *xid), *count).unwrap_or(0);
        if *count > before {
            let labels = XidLabels { id: id.clone(), xid: *xid };
            m.xid_events.get_or_create(&labels).inc_by(count - before);
        }
    }
}
