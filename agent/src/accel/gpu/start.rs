//! Starting the GPU monitor when NVML may arrive late. On a new GKE GPU node the driver
//! installer usually finishes after the agent's pod starts; [`start`] keeps trying to load NVML
//! (5 s, doubling to 5 min) until it loads, then runs the monitor, with no pod restart.
//!
//! Three situations, told apart without the driver (`crate::accel::gpu::nvml::gpus_present`):
//! - no NVIDIA GPU on the node (no `/dev/nvidiaN`, no NVIDIA display/3D PCI function): said once,
//!   state `no-gpu`, looked for again every [`StartOptions::no_gpu_recheck`] (5 min) in silence,
//!   by an async task: the monitor's thread exists only on a node with GPUs (GPUs failed on this
//!   boot, kept in `gpu.state_file`, stay failed meanwhile: a driver reloading hides them);
//! - GPUs but NVML does not load: state `waiting-for-driver`, a line when the wait starts, at most
//!   one every [`StartOptions::log_every`] (10 min) while it lasts, one when NVML arrives;
//! - NVML loads: the monitor runs (state `on`).
//!
//! The log schedule is [`WaitLog`], pure (time handed in) and tested without sleeps.

#![allow(clippy::disallowed_types)] // NB: a dedicated thread on real monotonic time.
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::accel::gpu::model::{GpuMonitorState, GpuReport};
use crate::accel::gpu::monitor::{run_monitor, Kept, Kubelet, THREAD};
use crate::accel::gpu::nvml::{gpus_present, GpuError, GpuProbe, HostPaths, NvmlLoader, NvmlProbe};
use crate::accel::gpu::state::{StateStore, BOOT_ID_PATH};
use crate::backoff::Backoff;
use crate::clock::{human, ms};
use crate::config::{GpuConfig, Switch};
use crate::http::health::Warnings;

/// How the start-up waits; the defaults are production's, tests shrink them.
#[derive(Debug, Clone, educe::Educe)]
#[educe(Default)]
pub struct StartOptions {
    /// Where to look for GPUs without the driver.
    pub host: HostPaths,
    /// Where the node's boot id is read (`/proc/sys/kernel/random/boot_id`).
    #[educe(Default(expression = BOOT_ID_PATH.into()))]
    pub boot_id_path: PathBuf,
    /// First retry of a failed NVML load; doubled up to `retry_max`.
    #[educe(Default(expression = Duration::from_secs(5)))]
    pub retry_first: Duration,
    #[educe(Default(expression = Duration::from_secs(5 * 60)))]
    pub retry_max: Duration,
    /// While waiting for the driver, at most one log line this often.
    #[educe(Default(expression = Duration::from_secs(10 * 60)))]
    pub log_every: Duration,
    /// How often a node without GPUs is looked at again.
    #[educe(Default(expression = Duration::from_secs(5 * 60)))]
    pub no_gpu_recheck: Duration,
    /// `/readyz` shows "waiting for the driver" here while it lasts.
    pub warnings: Option<Warnings>,
    /// The kubelet's reports of `Unhealthy` GPUs, when read (`crate::accel::gpu::kubelet`).
    pub kubelet: Option<Kubelet>,
}

/// What to log about the wait for the driver, at a time handed in.
#[derive(Debug, Default)]
pub(crate) struct WaitLog {
    every: Duration,
    started: Option<Instant>,
    last: Option<Instant>,
    attempts: u32,
}

impl WaitLog {
    /// A failed load at `now`: the line to log, if one is due (the first, then at most one per
    /// `every`).
    pub(crate) fn failed(&mut self, now: Instant, e: &GpuError) -> Option<String> {
        self.attempts += 1;
        let started = *self.started.get_or_insert(now);
        let (waited, attempts) = (human(ms(now.duration_since(started))), self.attempts);
        let line = match self.last {
            None => format!(
                "this node has NVIDIA GPUs but NVML does not load yet ({e}); waiting for the driver, trying again with backoff"
            ),
            Some(t) if now.duration_since(t) >= self.every => format!(
                "still waiting for the NVIDIA driver after {waited} ({attempts} attempts): {e}"
            ),
            Some(_) => return None,
        };
        self.last = Some(now);
        Some(line)
    }

    /// NVML loaded at `now`: the line to log (`None` when it loaded at the first attempt).
    pub(crate) fn loaded(&self, now: Instant) -> Option<String> {
        let (waited, attempts) = (human(ms(now.duration_since(self.started?))), self.attempts);
        Some(format!(
            "NVIDIA driver arrived after {waited} ({attempts} failed attempts): GPU monitoring starts"
        ))
    }
}

/// Sleep up to `d`, waking within a tenth of a second of `stop`; false when stopped.
fn sleep_unless_stopped(d: Duration, stop: &CancellationToken) -> bool {
    let until = Instant::now() + d;
    while !stop.is_cancelled() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
    false
}

/// Production wiring: `gpu.enabled = off` → `None`, quietly, with state `off` published.
/// `auto`/`on` → reads `gpu.state_file`, waits for a GPU (see the module), then starts the
/// monitor's thread, which waits for NVML and runs the monitor; returns that thread, or `None`
/// when stopped first.
///
/// NB: a node without GPUs waits here, on the executor (a file check every 5 min): no thread
/// until there is a GPU to watch. Loading NVML can block on a wedged driver: it happens on the
/// monitor's own thread, never on the executor and never awaited; shutdown never waits for it.
pub async fn start(
    cfg: &GpuConfig,
    tx: watch::Sender<GpuReport>,
    stop: CancellationToken,
    warnings: Option<Warnings>,
    kubelet: Option<Kubelet>,
) -> Option<JoinHandle<()>> {
    let path = cfg.library_path.clone();
    let loader = move || -> Result<Box<dyn GpuProbe>, GpuError> {
        let probe = NvmlProbe::new(Some(path.as_str()))?;
        tracing::info!(
            gpus = probe.gpu_count().unwrap_or(0),
            xid_events_on = probe.xid_gpus.len(),
            "NVML loaded"
        );
        Ok(Box::new(probe))
    };
    let opts = StartOptions { warnings, kubelet, ..StartOptions::default() };
    start_with(cfg, Box::new(loader), opts, tx, stop).await
}

/// [`start`] with its seams: the NVML loader and the host paths, boot id and waits.
pub async fn start_with(
    cfg: &GpuConfig,
    mut loader: Box<NvmlLoader>,
    opts: StartOptions,
    tx: watch::Sender<GpuReport>,
    stop: CancellationToken,
) -> Option<JoinHandle<()>> {
    if cfg.enabled == Switch::Off {
        tx.send_replace(GpuReport::in_state(GpuMonitorState::Off));
        return None;
    }
    // NB: the failures kept across restarts hold until NVML reads the GPUs (it may never, on
    // the driver a failure wedged; and a driver reloading hides them a while): published at
    // once, and through both waits.
    let kept = Kept::open(StateStore::from_config(&cfg.state_file, &opts.boot_id_path), cfg);
    tx.send_replace(kept.before_nvml(GpuMonitorState::Starting));
    // `on`: the operator says this node has GPUs; believe it and wait for the driver.
    let mut said_no_gpu = false;
    while cfg.enabled != Switch::On && !gpus_present(&opts.host) {
        no_gpu(&tx, &opts, &kept, &mut said_no_gpu);
        tokio::select! {
            _ = tokio::time::sleep(opts.no_gpu_recheck) => {}
            _ = stop.cancelled() => return None,
        }
    }
    let cfg = cfg.clone();
    let warnings = opts.warnings.clone();
    // The monitor's own thread: an error when the OS refuses one (a container at its pids limit).
    let spawned = std::thread::Builder::new().name(THREAD.into()).spawn(move || {
        let wait = wait_for_nvml(&cfg, loader.as_mut(), &opts, &kept, &tx, &stop, said_no_gpu);
        let Some(probe) = wait else { return };
        readyz(&opts.warnings, None);
        tracing::info!("GPU monitoring on");
        run_monitor(probe, &cfg, kept, &tx, &stop, opts.kubelet);
    });
    // NB: never a panic: the restart path and the Node go on without GPU health, and `/readyz`
    // and the log say why (the thread's channel is gone with its closure, so the GPU report
    // stays where it was: monitoring not on).
    spawned
        .inspect_err(|e| {
            let why = format!("GPU monitoring off: the OS refused a thread for the GPU monitor ({e}); GPU health is not watched until the agent restarts (is the container at its pids limit?)");
            tracing::error!("{why}");
            readyz(&warnings, Some(why));
        })
        .ok()
}

/// No GPU seen on the node: said once (`said`), published (with the failures `kept`), and no
/// `/readyz` warning.
fn no_gpu(tx: &watch::Sender<GpuReport>, opts: &StartOptions, kept: &Kept, said: &mut bool) {
    if !*said {
        tracing::info!(
            "GPU monitoring off: no NVIDIA GPU on this node (no /dev/nvidiaN, no NVIDIA PCI display device); looking again every {}",
            human(ms(opts.no_gpu_recheck))
        );
        *said = true;
    }
    publish(tx, kept.before_nvml(GpuMonitorState::NoGpu));
    readyz(&opts.warnings, None);
}

/// Say `why` the GPUs are not watched on `/readyz`, or (`None`) that nothing stands in the way.
fn readyz(warnings: &Option<Warnings>, why: Option<String>) {
    if let Some(w) = warnings {
        w.set("gpu", why);
    }
}

/// Publish `report` unless it is already the one published.
fn publish(tx: &watch::Sender<GpuReport>, report: GpuReport) {
    tx.send_if_modified(|cur| std::mem::replace(cur, report) != *cur);
}

/// On the monitor's thread: wait until NVML loads (`Some(probe)`) or `stop` (`None`),
/// publishing where the wait stands.
fn wait_for_nvml(
    cfg: &GpuConfig,
    loader: &mut NvmlLoader,
    opts: &StartOptions,
    kept: &Kept,
    tx: &watch::Sender<GpuReport>,
    stop: &CancellationToken,
    mut said_no_gpu: bool,
) -> Option<Box<dyn GpuProbe>> {
    let mut backoff = Backoff::new(opts.retry_first, opts.retry_max);
    let mut log = WaitLog { every: opts.log_every, ..WaitLog::default() };
    while !stop.is_cancelled() {
        // `auto`: GPUs gone while the driver was awaited are looked for again, as at start-up.
        if cfg.enabled != Switch::On && !gpus_present(&opts.host) {
            no_gpu(tx, opts, kept, &mut said_no_gpu);
            if !sleep_unless_stopped(opts.no_gpu_recheck, stop) {
                return None;
            }
            continue;
        }
        match loader() {
            Ok(probe) => {
                if let Some(line) = log.loaded(Instant::now()) {
                    tracing::info!("{line}");
                }
                return Some(probe);
            }
            Err(e) => {
                publish(tx, kept.before_nvml(GpuMonitorState::WaitingForDriver));
                let why = format!(
                    "waiting for the NVIDIA driver ({e}); restarts work, GPU verdicts start when it loads"
                );
                readyz(&opts.warnings, Some(why));
                if let Some(line) = log.failed(Instant::now(), &e) {
                    if cfg.enabled == Switch::On {
                        tracing::warn!("{line}");
                    } else {
                        tracing::info!("{line}");
                    }
                }
                if !sleep_unless_stopped(backoff.next_delay(), stop) {
                    return None;
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err() -> GpuError {
        GpuError::NoLibrary("libnvidia-ml.so.1: cannot open shared object file".into())
    }

    #[test]
    fn the_wait_logs_once_then_at_most_every_interval_then_on_arrival() {
        let every = Duration::from_secs(600);
        let mut log = WaitLog { every, ..WaitLog::default() };
        let t0 = Instant::now();
        assert_eq!(log.loaded(t0), None, "loaded at once: nothing to say");
        let first = log.failed(t0, &err()).unwrap();
        assert!(first.contains("waiting for the driver"), "{first}");
        // Backoff attempts within the interval are silent: 5 s, 10 s, … 5 min.
        for s in [5, 15, 35, 75, 155, 315, 599] {
            assert_eq!(log.failed(t0 + Duration::from_secs(s), &err()), None, "{s}s");
        }
        let again = log.failed(t0 + every, &err()).unwrap();
        assert!(again.contains("still waiting") && again.contains("9 attempts"), "{again}");
        assert_eq!(log.failed(t0 + every + Duration::from_secs(300), &err()), None);
        let arrived = log.loaded(t0 + Duration::from_secs(1200)).unwrap();
        assert!(
            arrived.contains("arrived after 20m") && arrived.contains("10 failed"),
            "{arrived}"
        );
    }

    #[test]
    fn the_backoff_doubles_from_five_seconds_to_five_minutes() {
        let o = StartOptions::default();
        let mut b = Backoff::new(o.retry_first, o.retry_max);
        let steps: Vec<u64> = (0..9).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(steps, vec![5, 10, 20, 40, 80, 160, 300, 300, 300]);
    }
}
