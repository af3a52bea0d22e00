//! The GPU monitor: runs a [`GpuProbe`] on a dedicated thread (NVML calls block) and publishes
//! [`GpuReport`]s, folded by the pure [`crate::accel::gpu::policy::update`], on a `watch` channel,
//! keeping failed GPUs in the state file (`crate::accel::gpu::state`) when it has one.
//! `crate::accel::gpu::start::start` is the production wiring: it waits for the driver when the node has
//! GPUs but NVML does not load yet.

#![allow(clippy::disallowed_types)] // NB: a dedicated thread on real monotonic time (`clock_ms`).
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::accel::gpu::model::{GpuCleared, GpuReport, GpuSample};
use crate::accel::gpu::nvml::GpuProbe;
use crate::accel::gpu::policy::{rejudge, update};
use crate::accel::gpu::policy_state::{needs_write, snapshot, StateFile};
use crate::accel::gpu::policy_xid::RECOVERY_ACTION_CHANGED;
use crate::accel::gpu::state::StateStore;
use crate::config::GpuConfig;

/// The monitor's clock: monotonic milliseconds since the first call in this process. The `now_ms`
/// of every [`GpuReport`] the monitor computes; pass it to [`crate::accel::gpu::policy::evidence`].
pub fn clock_ms() -> i64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    epoch.elapsed().as_millis().min(i64::MAX as u128) as i64
}

/// Longest single wait for XID events: also how quickly the monitor notices `stop`.
const XID_WAIT: Duration = Duration::from_secs(1);

/// Logs a recurring failure at most once a minute, with how many were left out.
pub(crate) struct Throttled {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttled {
    const EVERY: Duration = Duration::from_secs(60);

    pub fn new() -> Throttled {
        Throttled {
            last: None,
            suppressed: 0,
        }
    }

    fn warn(&mut self, what: &'static str, e: &dyn std::fmt::Display) {
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

/// Run `probe` on a dedicated thread until `stop` is cancelled, publishing on `tx`, keeping no
/// state across restarts (see [`spawn_monitor_kept`]).
///
/// The thread alternates between waiting for XID events (at most [`XID_WAIT`] at a time, so
/// `stop` is seen within about a second) and reading every GPU each `cfg.sample_interval`
/// (the first read at once).
pub fn spawn_monitor(
    probe: Box<dyn GpuProbe>,
    cfg: GpuConfig,
    tx: watch::Sender<GpuReport>,
    stop: CancellationToken,
) -> std::io::Result<JoinHandle<()>> {
    spawn_thread(move || run_monitor(probe, &cfg, None, &tx, &stop))
}

/// As [`spawn_monitor`], with failed GPUs read from and written to `store`.
pub fn spawn_monitor_kept(
    probe: Box<dyn GpuProbe>,
    cfg: GpuConfig,
    store: StateStore,
    tx: watch::Sender<GpuReport>,
    stop: CancellationToken,
) -> std::io::Result<JoinHandle<()>> {
    spawn_thread(move || run_monitor(probe, &cfg, Some(store), &tx, &stop))
}

/// The monitor's own thread. An error when the OS refuses one (a container at its pids limit).
pub(crate) fn spawn_thread(run: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("vigil-gpu".into())
        .spawn(run)
}

/// The state file as the monitor keeps it: what was last written, and when.
struct Keeper {
    store: StateStore,
    last: Option<StateFile>,
    last_at: i64,
    errors: Throttled,
}

impl Keeper {
    /// Read the file: the report to start from (failures of this boot, clearings by a reboot).
    fn open(store: StateStore, cfg: &GpuConfig) -> (Keeper, GpuReport) {
        let restored = store.load();
        if let Some(w) = &restored.warning {
            tracing::warn!("{w}");
        }
        for g in &restored.gpus {
            tracing::warn!(gpu = %g.uuid, "GPU failed before the agent restarted; kept failed");
        }
        for c in &restored.cleared {
            tracing::info!(gpu = %c.gpu, "GPU failure cleared: {}", c.why);
        }
        let seed = GpuReport {
            gpus: restored.gpus,
            cleared: restored.cleared,
            ..GpuReport::default()
        };
        let keeper = Keeper {
            store,
            last: None,
            last_at: 0,
            errors: Throttled::new(),
        };
        (keeper, rejudge(&seed, cfg))
    }

    /// Write the failed GPUs of `report` when they changed (a failed write is retried with the
    /// next report, logged at most once a minute).
    fn keep(&mut self, report: &GpuReport, now_ms: i64) {
        let next = snapshot(&report.gpus, self.store.boot_id());
        if !needs_write(self.last.as_ref(), self.last_at, &next, now_ms) {
            return;
        }
        match self.store.write(&next) {
            Ok(()) => {
                self.errors.ok("GPU state file writable again");
                self.last = Some(next);
                self.last_at = now_ms;
            }
            Err(e) => self.errors.warn(
                "cannot write the GPU state file; a failed GPU would be forgotten by an agent restart",
                &format!("{}: {e}", self.store.path().display()),
            ),
        }
    }
}

/// Log the failures cleared since `seen` (by sequence number).
fn log_cleared(report: &GpuReport, seen: &mut u64) {
    for c in report.cleared.iter().filter(|c| c.seq > *seen) {
        tracing::info!(gpu = %c.gpu, causes = %c.causes.join("; "), "GPU failure cleared: {}", c.why);
    }
    if let Some(last) = report.cleared.last() {
        *seen = (*seen).max(last.seq);
    }
}

/// The monitor loop (blocking).
///
/// NB: publication. Every successful sample is published (`send_replace`, which marks the value
/// changed even when the verdict is the same): the samples feed the temperature / power / ECC
/// metrics, and a reader waiting on `changed()` refreshes them. XID events are folded in and
/// published the moment they arrive, between samples, so a hardware failure does not wait for the
/// next sample; XID 154 (the driver changed its recovery action) brings the next sample forward.
/// A failed read publishes nothing and is not read as "every GPU is gone": the last verdict
/// stands, and the error is logged at most once a minute.
pub(crate) fn run_monitor(
    mut probe: Box<dyn GpuProbe>,
    cfg: &GpuConfig,
    store: Option<StateStore>,
    tx: &watch::Sender<GpuReport>,
    stop: &CancellationToken,
) {
    let (mut keeper, mut report) = match store {
        Some(store) => {
            let (k, r) = Keeper::open(store, cfg);
            (Some(k), r)
        }
        None => (None, rejudge(&GpuReport::default(), cfg)),
    };
    tx.send_replace(report.clone());
    let mut cleared_seen = report.cleared.last().map_or(0, |c: &GpuCleared| c.seq);
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
                    log_cleared(&report, &mut cleared_seen);
                    if let Some(k) = keeper.as_mut() {
                        k.keep(&report, clock_ms());
                    }
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
                if xids.iter().any(|x| x.xid == RECOVERY_ACTION_CHANGED) {
                    next_sample = Instant::now();
                }
                let next = update(&report, &samples, &xids, clock_ms(), cfg);
                report = next.clone();
                if let Some(k) = keeper.as_mut() {
                    k.keep(&report, clock_ms());
                }
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
