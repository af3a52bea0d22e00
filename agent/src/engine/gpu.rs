//! The GPU monitor: runs a [`GpuProbe`] on a dedicated thread (NVML calls block) and publishes
//! [`GpuReport`]s, folded by the pure [`crate::policy::gpu::update`], on a `watch` channel.
//! [`start`] is the production wiring, which says once, and does not crash, when there is no
//! driver.

#![allow(clippy::disallowed_types)] // NB: a dedicated thread on real monotonic time (`clock_ms`).
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{GpuConfig, Switch};
use crate::model::gpu::{GpuHealth, GpuReport, GpuSample};
use crate::observe::metrics::{GpuMetricsState, Metrics};
use crate::policy::gpu::update;
use crate::sources::gpu::{GpuError, GpuProbe, NvmlProbe};

/// The monitor's clock: monotonic milliseconds since the first call in this process. The `now_ms`
/// of every [`GpuReport`] the monitor computes; pass it to [`crate::policy::gpu::evidence`].
pub fn clock_ms() -> i64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    epoch.elapsed().as_millis().min(i64::MAX as u128) as i64
}

/// Longest single wait for XID events: also how quickly the monitor notices `stop`.
const XID_WAIT: Duration = Duration::from_secs(1);

/// Logs a recurring failure at most once a minute, with how many were left out.
struct Throttled {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttled {
    const EVERY: Duration = Duration::from_secs(60);

    fn new() -> Throttled {
        Throttled {
            last: None,
            suppressed: 0,
        }
    }

    fn warn(&mut self, what: &'static str, e: &GpuError) {
        if self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(error = %e, suppressed = self.suppressed, "{what}");
        self.last = Some(Instant::now());
        self.suppressed = 0;
    }

    fn ok(&mut self, what: &'static str) {
        if self.last.take().is_some() {
            tracing::info!("{what}");
            self.suppressed = 0;
        }
    }
}

/// Run `probe` on a dedicated thread until `stop` is cancelled, publishing on `tx`.
///
/// The thread alternates between waiting for XID events (at most [`XID_WAIT`] at a time, so
/// `stop` is seen within about a second) and reading every GPU each `cfg.sample_interval`
/// (the first read at once).
pub fn spawn_monitor(
    probe: Box<dyn GpuProbe>,
    cfg: GpuConfig,
    tx: watch::Sender<GpuReport>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    spawn_thread(move || monitor(probe, &cfg, &tx, &stop))
}

fn spawn_thread(run: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("vigil-gpu".into())
        .spawn(run)
        .expect("the OS refused a thread for the GPU monitor")
}

/// The monitor loop (blocking).
///
/// NB: publication. Every successful sample is published (`send_replace`, which marks the value
/// changed even when the verdict is the same): the samples feed the temperature / power / ECC
/// metrics, and a reader waiting on `changed()` refreshes them. XID events are folded in and
/// published the moment they arrive, between samples, so a hardware failure does not wait for the
/// next sample. A failed read publishes nothing and is not read as "every GPU is gone": the last
/// verdict stands, and the error is logged at most once a minute.
fn monitor(
    mut probe: Box<dyn GpuProbe>,
    cfg: &GpuConfig,
    tx: &watch::Sender<GpuReport>,
    stop: &CancellationToken,
) {
    let mut report = GpuReport {
        monitoring: true,
        ..GpuReport::default()
    };
    let mut samples: Vec<GpuSample> = Vec::new();
    let mut sample_errors = Throttled::new();
    let mut xid_errors = Throttled::new();
    let mut next_sample = Instant::now();
    while !stop.is_cancelled() {
        if Instant::now() >= next_sample {
            match probe.sample() {
                Ok(s) => {
                    sample_errors.ok("GPUs readable again");
                    samples = s;
                    report = update(&report, &samples, &[], clock_ms(), cfg);
                    tx.send_replace(report.clone());
                }
                Err(e) => {
                    sample_errors.warn("cannot read the GPUs; the last GPU verdict stands", &e)
                }
            }
            next_sample = Instant::now() + cfg.sample_interval;
        }
        if stop.is_cancelled() {
            break;
        }
        let wait = next_sample
            .saturating_duration_since(Instant::now())
            .min(XID_WAIT);
        let started = Instant::now();
        match probe.wait_xids(wait) {
            Ok(xids) if xids.is_empty() => {}
            Ok(xids) => {
                xid_errors.ok("XID events readable again");
                for x in &xids {
                    tracing::warn!(gpu = x.index, uuid = %x.uuid, xid = x.xid, "GPU XID event");
                }
                let next = update(&report, &samples, &xids, clock_ms(), cfg);
                report = next.clone();
                tx.send_if_modified(|cur| {
                    let changed = *cur != next;
                    *cur = next;
                    changed
                });
            }
            Err(e) => {
                xid_errors.warn("cannot wait for GPU XID events", &e);
                // A probe that fails at once must not turn this loop into a busy loop.
                std::thread::sleep(wait.saturating_sub(started.elapsed()));
            }
        }
    }
    tracing::debug!("GPU monitor stopped");
}

/// Production wiring: `gpu.enabled = off` → `None`, quietly, with `monitoring: false` published.
/// `auto`/`on` → a thread that loads NVML and then runs the monitor; the call returns at once.
///
/// NB: loading NVML can block on a wedged driver. It happens on the monitor's own thread, never
/// on the executor and never awaited: start-up goes on with "monitoring off" until the first
/// report, and shutdown never waits for it. When NVML cannot be loaded, one line says why (info
/// for `auto`, error for `on`) and `monitoring: false` stays published: no GPU verdict, no crash.
pub fn start(
    cfg: &GpuConfig,
    tx: watch::Sender<GpuReport>,
    stop: CancellationToken,
) -> Option<JoinHandle<()>> {
    let off = GpuReport::default();
    debug_assert!(!off.monitoring);
    if cfg.enabled == Switch::Off {
        tx.send_replace(off);
        return None;
    }
    let cfg = cfg.clone();
    Some(spawn_thread(move || {
        let path = Some(cfg.library_path.as_str()).filter(|p| !p.is_empty());
        match NvmlProbe::new(path) {
            Ok(probe) => {
                tracing::info!(
                    gpus = probe.gpu_count().unwrap_or(0),
                    xid_events_on = probe.xid_gpus().len(),
                    "GPU monitoring on"
                );
                monitor(Box::new(probe), &cfg, &tx, &stop);
            }
            Err(e) => {
                if cfg.enabled == Switch::On {
                    tracing::error!("GPU monitoring off: {e}");
                } else {
                    tracing::info!("GPU monitoring off: {e}");
                }
                tx.send_replace(off);
            }
        }
    }))
}

/// The node's GPU health as last published, and when: the node controller publishes a change
/// of health at once, a change of reasons only (counts of XIDs, ECC errors) at most once a
/// minute, so an XID storm does not patch the Node on every event.
#[derive(Default)]
pub(crate) struct GpuHealthTracker {
    report: GpuReport,
    seen: GpuMetricsState,
    published_at: Option<Instant>,
}

/// A GPU change worth publishing.
pub(crate) struct GpuChange {
    pub prev: GpuHealth,
    /// `GPU health a → b: reasons`, for the trail, the Event and the alert.
    pub detail: String,
}

impl GpuHealthTracker {
    const REASONS_EVERY: Duration = Duration::from_secs(60);

    /// The first report, taken as what the Node shows (no change to announce at start-up).
    pub fn seed(&mut self, report: GpuReport, metrics: &Metrics) {
        metrics.record_gpu(&report, &mut self.seen);
        self.report = report;
    }

    /// The report the Node shows.
    pub fn report(&self) -> &GpuReport {
        &self.report
    }

    /// Fold in a new report (metrics always); `Some` when the Node should show it.
    pub(crate) fn fold(&mut self, report: GpuReport, metrics: &Metrics) -> Option<GpuChange> {
        metrics.record_gpu(&report, &mut self.seen);
        let health_changed =
            report.monitoring != self.report.monitoring || report.node != self.report.node;
        let reasons_due = report.node_reasons != self.report.node_reasons
            && self
                .published_at
                .is_none_or(|t| t.elapsed() >= Self::REASONS_EVERY);
        if !health_changed && !reasons_due {
            // Keep the previous reasons: they are what the Node shows.
            let reasons = std::mem::take(&mut self.report.node_reasons);
            self.report = GpuReport {
                node_reasons: reasons,
                ..report
            };
            return None;
        }
        self.published_at = Some(Instant::now());
        let prev = std::mem::replace(&mut self.report, report);
        let r = &self.report;
        let reasons = if r.node_reasons.is_empty() {
            String::new()
        } else {
            format!(": {}", r.node_reasons.join("; "))
        };
        Some(GpuChange {
            prev: prev.node,
            detail: format!(
                "GPU health {} → {}{reasons}",
                prev.node.as_str(),
                r.node.as_str()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic() {
        let a = clock_ms();
        let b = clock_ms();
        assert!(b >= a && a >= 0);
    }
}
