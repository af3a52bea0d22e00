//! GPU metrics: whether NVML is watched, and per GPU its health, latest samples, memory errors,
//! clock-throttle reasons and XID events. Labelled by the GPU's index and UUID (bounded by the
//! GPUs in one node) plus fixed names.

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::accel::gpu::model::{GpuMonitorState, GpuReport, GpuSample, GpuStatus};

type F64Gauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// One GPU: its NVML index and UUID.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GpuLabels {
    pub(crate) gpu: u32,
    pub(crate) uuid: String,
}

/// One of a GPU's health states (healthy, degraded, failed).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HealthLabels {
    #[prometheus(flatten)]
    pub(crate) id: GpuLabels,
    pub(crate) state: &'static str,
}

/// An ECC count: the counter (volatile, aggregate) and severity (corrected, uncorrected).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EccLabels {
    #[prometheus(flatten)]
    pub(crate) id: GpuLabels,
    pub(crate) counter: &'static str,
    pub(crate) severity: &'static str,
}

/// Remapped rows of one kind (correctable, uncorrectable).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RemapLabels {
    #[prometheus(flatten)]
    pub(crate) id: GpuLabels,
    pub(crate) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ThrottleLabels {
    #[prometheus(flatten)]
    pub(crate) id: GpuLabels,
    pub(crate) reason: &'static str,
}

/// One of the monitor's states (starting, off, no-gpu, waiting-for-driver, on).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MonitorStateLabels {
    pub(crate) state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct XidLabels {
    #[prometheus(flatten)]
    pub(crate) id: GpuLabels,
    pub(crate) xid: u64,
}

#[derive(Default)]
pub(crate) struct GpuMetrics {
    pub(crate) monitoring: Gauge,
    pub(crate) monitor_state: Family<MonitorStateLabels, Gauge>,
    pub(crate) health: Family<HealthLabels, Gauge>,
    pub(crate) temperature: Family<GpuLabels, Gauge>,
    pub(crate) power: Family<GpuLabels, F64Gauge>,
    pub(crate) utilization: Family<GpuLabels, F64Gauge>,
    pub(crate) memory_used: Family<GpuLabels, Gauge>,
    pub(crate) memory_total: Family<GpuLabels, Gauge>,
    pub(crate) ecc_errors: Family<EccLabels, Gauge>,
    pub(crate) retired_pages: Family<GpuLabels, Gauge>,
    pub(crate) retired_pages_pending: Family<GpuLabels, Gauge>,
    pub(crate) remapped_rows: Family<RemapLabels, Gauge>,
    pub(crate) remap_pending: Family<GpuLabels, Gauge>,
    pub(crate) remap_failure: Family<GpuLabels, Gauge>,
    pub(crate) throttle: Family<ThrottleLabels, Gauge>,
    pub(crate) xid_events: Family<XidLabels, Counter>,
}

/// What [`GpuMetrics::record`] already exported.
#[derive(Debug, Default)]
pub(crate) struct GpuMetricsState {
    xids: BTreeMap<(String, u64), u64>,
    throttled: BTreeSet<(String, &'static str)>,
}

/// A count as a gauge value, saturating at `i64::MAX`.
fn saturating(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

impl GpuMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = GpuMetrics::default();
        m.register_state(reg);
        m.register_samples(reg);
        m.register_memory_errors(reg);
        m.register_events(reg);
        m
    }

    fn register_state(&self, reg: &mut Registry) {
        reg.register(
            "gpu_monitoring",
            "1 when NVML is loaded and GPUs are watched",
            self.monitoring.clone(),
        );
        reg.register(
            "gpu_monitor_state",
            "1 for the GPU monitor's current state (starting, off, no-gpu, waiting-for-driver, on)",
            self.monitor_state.clone(),
        );
        reg.register(
            "gpu_health",
            "1 for each GPU's current health (healthy, degraded, failed)",
            self.health.clone(),
        );
    }

    fn register_samples(&self, reg: &mut Registry) {
        reg.register_with_unit(
            "gpu_temperature",
            "GPU core temperature",
            Unit::Celsius,
            self.temperature.clone(),
        );
        reg.register_with_unit(
            "gpu_power",
            "GPU power draw",
            Unit::Other("watts".into()),
            self.power.clone(),
        );
        reg.register_with_unit(
            "gpu_utilization",
            "GPU utilisation, 0 to 1",
            Unit::Other("ratio".into()),
            self.utilization.clone(),
        );
        reg.register_with_unit(
            "gpu_memory_used",
            "GPU memory in use",
            Unit::Bytes,
            self.memory_used.clone(),
        );
        reg.register_with_unit(
            "gpu_memory_total",
            "GPU memory in total",
            Unit::Bytes,
            self.memory_total.clone(),
        );
    }

    fn register_memory_errors(&self, reg: &mut Registry) {
        reg.register(
            "gpu_ecc_errors",
            "ECC error counts as NVML reports them, by counter (volatile since boot, aggregate lifetime) and severity",
            self.ecc_errors.clone(),
        );
        reg.register(
            "gpu_retired_pages",
            "Retired memory pages (single- and double-bit causes)",
            self.retired_pages.clone(),
        );
        reg.register(
            "gpu_retired_pages_pending",
            "1 when a page retirement waits for the next GPU reset",
            self.retired_pages_pending.clone(),
        );
        reg.register(
            "gpu_remapped_rows",
            "Remapped memory rows by kind (correctable, uncorrectable)",
            self.remapped_rows.clone(),
        );
        reg.register(
            "gpu_remap_pending",
            "1 when a row remap waits for the next GPU reset",
            self.remap_pending.clone(),
        );
        reg.register(
            "gpu_remap_failure",
            "1 when a row remap failed (the GPU should be replaced)",
            self.remap_failure.clone(),
        );
    }

    fn register_events(&self, reg: &mut Registry) {
        reg.register(
            "gpu_throttle",
            "1 for each active clock-throttle reason",
            self.throttle.clone(),
        );
        reg.register(
            "gpu_xid_events",
            "Critical XID events by GPU and XID (every occurrence counts)",
            self.xid_events.clone(),
        );
    }

    /// Export one GPU report: gauges set from the latest samples, the XID counter advanced by
    /// the occurrences since the last report (`seen` remembers what was already counted).
    pub(crate) fn record(&self, report: &GpuReport, seen: &mut GpuMetricsState) {
        self.monitoring.set(i64::from(report.monitoring()));
        for state in GpuMonitorState::ALL {
            self.monitor_state
                .get_or_create(&MonitorStateLabels {
                    state: state.as_str(),
                })
                .set(i64::from(state == report.state));
        }
        for g in &report.gpus {
            let id = GpuLabels {
                gpu: g.index,
                uuid: g.uuid.clone(),
            };
            self.record_health(&id, g);
            self.record_sample(&id, &g.sample);
            self.record_memory_errors(&id, &g.sample);
            self.record_throttle(&id, &g.sample, seen);
            self.record_xids(&id, g, seen);
        }
    }

    fn record_health(&self, id: &GpuLabels, g: &GpuStatus) {
        for state in ["healthy", "degraded", "failed"] {
            let labels = HealthLabels {
                id: id.clone(),
                state,
            };
            self.health
                .get_or_create(&labels)
                .set(i64::from(g.health.as_str() == state));
        }
    }

    /// Temperature, power, utilisation and memory, each when the sample has it.
    fn record_sample(&self, id: &GpuLabels, s: &GpuSample) {
        if let Some(t) = s.temperature_c {
            self.temperature.get_or_create(id).set(i64::from(t));
        }
        if let Some(p) = s.power_w {
            self.power.get_or_create(id).set(p);
        }
        if let Some(u) = s.utilization {
            self.utilization.get_or_create(id).set(u);
        }
        if let Some(m) = s.memory_used_bytes {
            self.memory_used.get_or_create(id).set(saturating(m));
        }
        if let Some(m) = s.memory_total_bytes {
            self.memory_total.get_or_create(id).set(saturating(m));
        }
    }

    /// ECC counts, retired pages and remapped rows, each when the sample has them.
    fn record_memory_errors(&self, id: &GpuLabels, s: &GpuSample) {
        for (counter, severity, v) in [
            ("volatile", "corrected", s.ecc_volatile_corrected),
            ("volatile", "uncorrected", s.ecc_volatile_uncorrected),
            ("aggregate", "corrected", s.ecc_aggregate_corrected),
            ("aggregate", "uncorrected", s.ecc_aggregate_uncorrected),
        ] {
            if let Some(v) = v {
                let labels = EccLabels {
                    id: id.clone(),
                    counter,
                    severity,
                };
                self.ecc_errors.get_or_create(&labels).set(saturating(v));
            }
        }
        if let Some(r) = s.retired_pages {
            self.retired_pages.get_or_create(id).set(saturating(r));
        }
        if let Some(p) = s.retired_pages_pending {
            self.retired_pages_pending
                .get_or_create(id)
                .set(i64::from(p));
        }
        if let Some(r) = s.remapped_rows {
            for (kind, v) in [
                ("correctable", r.correctable),
                ("uncorrectable", r.uncorrectable),
            ] {
                let labels = RemapLabels {
                    id: id.clone(),
                    kind,
                };
                self.remapped_rows.get_or_create(&labels).set(i64::from(v));
            }
            self.remap_pending
                .get_or_create(id)
                .set(i64::from(r.pending));
            self.remap_failure
                .get_or_create(id)
                .set(i64::from(r.failure));
        }
    }

    /// Throttle reasons: 1 while active, back to 0 once they clear.
    fn record_throttle(&self, id: &GpuLabels, s: &GpuSample, seen: &mut GpuMetricsState) {
        for reason in &s.throttle_reasons {
            seen.throttled.insert((id.uuid.clone(), *reason));
        }
        for (_, reason) in seen.throttled.iter().filter(|(u, _)| *u == id.uuid) {
            let labels = ThrottleLabels {
                id: id.clone(),
                reason,
            };
            let active = s.throttle_reasons.contains(reason);
            self.throttle.get_or_create(&labels).set(i64::from(active));
        }
    }

    /// Advance each XID's counter by the occurrences since the last report.
    fn record_xids(&self, id: &GpuLabels, g: &GpuStatus, seen: &mut GpuMetricsState) {
        for (xid, count) in &g.xid_counts {
            let before = seen
                .xids
                .insert((id.uuid.clone(), *xid), *count)
                .unwrap_or(0);
            if *count > before {
                let labels = XidLabels {
                    id: id.clone(),
                    xid: *xid,
                };
                self.xid_events
                    .get_or_create(&labels)
                    .inc_by(count - before);
            }
        }
    }

    /// Record one healthy GPU with every sample set, so every GPU family has a series.
    pub(super) fn touch(&self) {
        let sample = GpuSample {
            index: 0,
            uuid: "GPU-0".into(),
            temperature_c: Some(40),
            power_w: Some(70.0),
            utilization: Some(0.5),
            memory_used_bytes: Some(1),
            memory_total_bytes: Some(2),
            ecc_volatile_corrected: Some(0),
            ecc_volatile_uncorrected: Some(0),
            ecc_aggregate_corrected: Some(0),
            ecc_aggregate_uncorrected: Some(0),
            retired_pages: Some(0),
            retired_pages_pending: Some(false),
            remapped_rows: Some(Default::default()),
            throttle_reasons: vec!["gpu-idle"],
            ..Default::default()
        };
        let report = GpuReport {
            state: GpuMonitorState::On,
            gpus: vec![GpuStatus {
                index: 0,
                uuid: "GPU-0".into(),
                sample,
                xid_counts: [(13, 1)].into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        self.record(&report, &mut GpuMetricsState::default());
    }
}
