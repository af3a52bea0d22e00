//! Prometheus metrics, one struct registered once. Labels are fixed `&'static str` values (verdict
//! names, decision codes, alert kinds): never ids, jobs or error text, so cardinality is bounded.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, &'static str)>;
/// Per-GPU labels: the index and UUID of a GPU (bounded by the GPUs in one node), plus fixed
/// names.
pub(crate) type GpuLabels = Vec<(&'static str, String)>;
type F64Gauge = Gauge<f64, std::sync::atomic::AtomicU64>;

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
    pub breaker_used: Gauge,
    pub breaker_open: Gauge,
    pub fleet_budget_used: Gauge,
    pub gpu_monitoring: Gauge,
    pub gpu_health: Family<GpuLabels, Gauge>,
    pub gpu_temperature: Family<GpuLabels, Gauge>,
    pub gpu_power: Family<GpuLabels, F64Gauge>,
    pub gpu_utilization: Family<GpuLabels, F64Gauge>,
    pub gpu_memory_used: Family<GpuLabels, Gauge>,
    pub gpu_memory_total: Family<GpuLabels, Gauge>,
    pub gpu_ecc_errors: Family<GpuLabels, Gauge>,
    pub gpu_retired_pages: Family<GpuLabels, Gauge>,
    pub gpu_retired_pages_pending: Family<GpuLabels, Gauge>,
    pub gpu_remapped_rows: Family<GpuLabels, Gauge>,
    pub gpu_remap_pending: Family<GpuLabels, Gauge>,
    pub gpu_remap_failure: Family<GpuLabels, Gauge>,
    pub gpu_throttle: Family<GpuLabels, Gauge>,
    pub gpu_xid_events: Family<GpuLabels, Counter>,
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
            breaker_used: Gauge::default(),
            breaker_open: Gauge::default(),
            fleet_budget_used: Gauge::default(),
            gpu_monitoring: Gauge::default(),
            gpu_health: Family::default(),
            gpu_temperature: Family::default(),
            gpu_power: Family::default(),
            gpu_utilization: Family::default(),
            gpu_memory_used: Family::default(),
            gpu_memory_total: Family::default(),
            gpu_ecc_errors: Family::default(),
            gpu_retired_pages: Family::default(),
            gpu_retired_pages_pending: Family::default(),
            gpu_remapped_rows: Family::default(),
            gpu_remap_pending: Family::default(),
            gpu_remap_failure: Family::default(),
            gpu_throttle: Family::default(),
            gpu_xid_events: Family::default(),
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
            "breaker_used",
            "Restarts used on this node in the current UTC day (the circuit breaker's count)",
            m.breaker_used.clone(),
        );
        registry.register(
            "breaker_open",
            "1 when this node's breaker is open: no more restarts today, alerts only",
            m.breaker_open.clone(),
        );
        registry.register(
            "fleet_budget_used",
            "Restarts used across the fleet in the current budget window",
            m.fleet_budget_used.clone(),
        );
        registry.register(
            "gpu_monitoring",
            "1 when NVML is loaded and GPUs are watched",
            m.gpu_monitoring.clone(),
        );
        registry.register(
            "gpu_health",
            "1 for each GPU's current health (healthy, degraded, failed)",
            m.gpu_health.clone(),
        );
        registry.register_with_unit(
            "gpu_temperature",
            "GPU core temperature",
            prometheus_client::registry::Unit::Celsius,
            m.gpu_temperature.clone(),
        );
        registry.register_with_unit(
            "gpu_power",
            "GPU power draw",
            prometheus_client::registry::Unit::Other("watts".into()),
            m.gpu_power.clone(),
        );
        registry.register_with_unit(
            "gpu_utilization",
            "GPU utilisation, 0 to 1",
            prometheus_client::registry::Unit::Other("ratio".into()),
            m.gpu_utilization.clone(),
        );
        registry.register_with_unit(
            "gpu_memory_used",
            "GPU memory in use",
            prometheus_client::registry::Unit::Bytes,
            m.gpu_memory_used.clone(),
        );
        registry.register_with_unit(
            "gpu_memory_total",
            "GPU memory in total",
            prometheus_client::registry::Unit::Bytes,
            m.gpu_memory_total.clone(),
        );
        registry.register(
            "gpu_ecc_errors",
            "ECC error counts as NVML reports them, by counter (volatile since boot, aggregate lifetime) and severity",
            m.gpu_ecc_errors.clone(),
        );
        registry.register(
            "gpu_retired_pages",
            "Retired memory pages (single- and double-bit causes)",
            m.gpu_retired_pages.clone(),
        );
        registry.register(
            "gpu_retired_pages_pending",
            "1 when a page retirement waits for the next GPU reset",
            m.gpu_retired_pages_pending.clone(),
        );
        registry.register(
            "gpu_remapped_rows",
            "Remapped memory rows by kind (correctable, uncorrectable)",
            m.gpu_remapped_rows.clone(),
        );
        registry.register(
            "gpu_remap_pending",
            "1 when a row remap waits for the next GPU reset",
            m.gpu_remap_pending.clone(),
        );
        registry.register(
            "gpu_remap_failure",
            "1 when a row remap failed (the GPU should be replaced)",
            m.gpu_remap_failure.clone(),
        );
        registry.register(
            "gpu_throttle",
            "1 for each active clock-throttle reason",
            m.gpu_throttle.clone(),
        );
        registry.register(
            "gpu_xid_events",
            "Critical XID events by GPU and XID (every occurrence counts)",
            m.gpu_xid_events.clone(),
        );
        // NB: a gauge fixed at 1 rather than an OpenMetrics `info`, so that parsers of the
        // classic text format (promtool, older scrapers) read it too.
        let build: Family<Labels, Gauge> = Family::default();
        build
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION"))])
            .set(1);
        registry.register("build_info", "Build information (always 1)", build);
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

    pub(crate) fn metadata_error(&self, key: &'static str, kind: &'static str) {
        self.metadata_errors
            .get_or_create(&vec![("key", key), ("kind", kind)])
            .inc();
    }
    pub(crate) fn kube_error(&self, op: &'static str) {
        self.kube_errors.get_or_create(&vec![("op", op)]).inc();
    }

    /// Export one GPU report: gauges set from the latest samples, the XID counter advanced by the
    /// occurrences since the last report (`seen` remembers what was already counted).
    pub(crate) fn record_gpu(
        &self,
        report: &crate::model::gpu::GpuReport,
        seen: &mut GpuMetricsState,
    ) {
        self.gpu_monitoring.set(i64::from(report.monitoring));
        for g in &report.gpus {
            let id = |extra: Vec<(&'static str, String)>| {
                let mut l: GpuLabels = vec![("gpu", g.index.to_string()), ("uuid", g.uuid.clone())];
                l.extend(extra);
                l
            };
            for h in ["healthy", "degraded", "failed"] {
                self.gpu_health
                    .get_or_create(&id(vec![("state", h.to_string())]))
                    .set(i64::from(g.health.as_str() == h));
            }
            let s = &g.sample;
            if let Some(t) = s.temperature_c {
                self.gpu_temperature
                    .get_or_create(&id(vec![]))
                    .set(i64::from(t));
            }
            if let Some(p) = s.power_w {
                self.gpu_power.get_or_create(&id(vec![])).set(p);
            }
            if let Some(u) = s.utilization {
                self.gpu_utilization.get_or_create(&id(vec![])).set(u);
            }
            if let Some(m) = s.memory_used_bytes {
                self.gpu_memory_used
                    .get_or_create(&id(vec![]))
                    .set(m.min(i64::MAX as u64) as i64);
            }
            if let Some(m) = s.memory_total_bytes {
                self.gpu_memory_total
                    .get_or_create(&id(vec![]))
                    .set(m.min(i64::MAX as u64) as i64);
            }
            for (counter, severity, v) in [
                ("volatile", "corrected", s.ecc_volatile_corrected),
                ("volatile", "uncorrected", s.ecc_volatile_uncorrected),
                ("aggregate", "corrected", s.ecc_aggregate_corrected),
                ("aggregate", "uncorrected", s.ecc_aggregate_uncorrected),
            ] {
                if let Some(v) = v {
                    self.gpu_ecc_errors
                        .get_or_create(&id(vec![
                            ("counter", counter.to_string()),
                            ("severity", severity.to_string()),
                        ]))
                        .set(v.min(i64::MAX as u64) as i64);
                }
            }
            if let Some(r) = s.retired_pages {
                self.gpu_retired_pages
                    .get_or_create(&id(vec![]))
                    .set(r.min(i64::MAX as u64) as i64);
            }
            if let Some(p) = s.retired_pages_pending {
                self.gpu_retired_pages_pending
                    .get_or_create(&id(vec![]))
                    .set(i64::from(p));
            }
            if let Some(r) = s.remapped_rows {
                for (kind, v) in [
                    ("correctable", r.correctable),
                    ("uncorrectable", r.uncorrectable),
                ] {
                    self.gpu_remapped_rows
                        .get_or_create(&id(vec![("kind", kind.to_string())]))
                        .set(i64::from(v));
                }
                self.gpu_remap_pending
                    .get_or_create(&id(vec![]))
                    .set(i64::from(r.pending));
                self.gpu_remap_failure
                    .get_or_create(&id(vec![]))
                    .set(i64::from(r.failure));
            }
            // Throttle reasons: 1 while active, back to 0 once they clear.
            for reason in &s.throttle_reasons {
                seen.throttled.insert((g.uuid.clone(), reason));
            }
            for (uuid, reason) in seen.throttled.iter().filter(|(u, _)| *u == g.uuid) {
                let active = s.throttle_reasons.contains(reason);
                self.gpu_throttle
                    .get_or_create(&vec![
                        ("gpu", g.index.to_string()),
                        ("uuid", uuid.clone()),
                        ("reason", reason.to_string()),
                    ])
                    .set(i64::from(active));
            }
            for (xid, count) in &g.xid_counts {
                let before = seen
                    .xids
                    .insert((g.uuid.clone(), *xid), *count)
                    .unwrap_or(0);
                if *count > before {
                    self.gpu_xid_events
                        .get_or_create(&id(vec![("xid", xid.to_string())]))
                        .inc_by(count - before);
                }
            }
        }
    }

    /// Create one series in every family, so an encoding lists them all (the docs drift
    /// check and `promtool` see every name, not only those that happened to be touched).
    pub fn touch_all(&self) {
        self.verdict("healthy");
        self.decision("agent-started");
        self.restart("hung", "restarted");
        self.alert("hung", "logged");
        self.metadata_error("preempted", "timeout");
        self.kube_error("get");
        self.interruptions
            .get_or_create(&vec![("type", "preemption"), ("reason", "preempted")])
            .inc();
        self.maintenance
            .get_or_create(&vec![("phase", "none")])
            .set(1);
        self.checkpoints
            .get_or_create(&vec![("method", "redis"), ("outcome", "acked")])
            .inc();
        let sample = crate::model::gpu::GpuSample {
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
        let report = crate::model::gpu::GpuReport {
            monitoring: true,
            gpus: vec![crate::model::gpu::GpuStatus {
                index: 0,
                uuid: "GPU-0".into(),
                sample,
                xid_counts: [(13, 1)].into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        self.record_gpu(&report, &mut GpuMetricsState::default());
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The classic Prometheus text format (0.0.4) from OpenMetrics text, for scrapers and tools
/// that do not speak OpenMetrics (`promtool check metrics`, `curl`): counter families are named
/// with their `_total` suffix, and the OpenMetrics-only `# UNIT` and `# EOF` lines are dropped.
pub fn to_classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// What [`Metrics::record_gpu`] already exported.
#[derive(Debug, Default)]
pub(crate) struct GpuMetricsState {
    xids: std::collections::BTreeMap<(String, u64), u64>,
    throttled: std::collections::BTreeSet<(String, &'static str)>,
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
        m.decision("restarted");
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
