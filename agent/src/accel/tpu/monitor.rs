//! The TPU monitor: reads the chips through an [`FsProbe`] every `tpu.sample_interval` (and at
//! once when the Node's allocatable `google.com/tpu` changes), folds each reading with the pure
//! [`crate::accel::tpu::policy::fold`], and publishes the [`TpuReport`] on a `watch` channel when it
//! changes. [`start`] is the production wiring.
//!
//! The expected chip count comes in on a `watch::Receiver<Option<u32>>`: the Node's allocatable
//! `google.com/tpu` (`crate::accel::tpu::policy::allocatable_chips` parses its quantity), `None` while
//! unknown. Whoever reads the Node publishes it there (see `crate::app`).

use std::path::Path;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::accel::clock_ms;
use crate::accel::tpu::chips::{device_files, FsProbe, TpuError};
use crate::accel::tpu::model::{TpuReading, TpuReport};
use crate::accel::tpu::policy::{fold, TpuMemory};
use crate::config::{Switch, TpuConfig};

/// Where the kernel's clock is read (the kernel log's timestamps are on it).
const UPTIME: &str = "/proc/uptime";

/// Run `probe` until `stop`, publishing on `tx`: a reading at once, then every
/// `cfg.sample_interval`, and again whenever `expected` changes.
///
/// NB: the reads (a directory, a few sysfs files, the non-blocking kernel log) are short but
/// blocking, so each runs on the blocking pool. A failed read publishes nothing: the last
/// verdict stands, and the error is logged once until reads succeed again.
pub async fn run_monitor(
    mut probe: FsProbe,
    cfg: TpuConfig,
    mut expected: watch::Receiver<Option<u32>>,
    tx: watch::Sender<TpuReport>,
    stop: CancellationToken,
) {
    let mut mem = TpuMemory::default();
    let mut tick = tokio::time::interval(cfg.sample_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut expected_open, mut failing, mut sent) = (true, false, false);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
            changed = expected.changed(), if expected_open => {
                expected_open = changed.is_ok();
                if !expected_open {
                    continue;
                }
            }
        }
        let want = *expected.borrow_and_update();
        let Some((p, reading)) = read_chips(probe).await else { return };
        probe = p;
        match reading {
            Ok(reading) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("TPU chips readable again");
                }
                let report = fold(&mut mem, &reading, want, clock_ms(), cfg.error_window);
                // The first report is always sent, even the default one (not a TPU node): it
                // tells the controller the monitor has read the chips.
                let first = !std::mem::replace(&mut sent, true);
                tx.send_if_modified(|cur| std::mem::replace(cur, report) != *cur || first);
            }
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(error = %e, "cannot read the TPU chips; the last TPU verdict stands");
                }
            }
        }
    }
    tracing::debug!("TPU monitor stopped");
}

/// One reading of the chips, off the async threads (the probe reads files); `None` when the
/// probe panicked (monitoring stops, said once).
async fn read_chips(mut probe: FsProbe) -> Option<(FsProbe, Result<TpuReading, TpuError>)> {
    // The reading first, then what it found of the kernel log.
    let read = tokio::task::spawn_blocking(move || (probe.read(), probe.kernel_log_error(), probe));
    let Ok((reading, log_error, probe)) = read.await else {
        tracing::error!("the TPU probe panicked; TPU monitoring stops");
        return None;
    };
    if let Some(e) = log_error {
        tracing::warn!(error = %e, "TPU device errors from the kernel log are not read");
    }
    Some((probe, reading))
}

/// Production wiring: `tpu.enabled = off` → `None`, quietly, with `monitoring: false`
/// published. `auto`/`on` → the monitor over [`FsProbe`] on `cfg`'s paths, spawned on the
/// runtime. With `on`, a device directory that cannot be read is an error at start-up (the
/// monitor still runs: the directory may appear).
pub(crate) fn start(
    cfg: &TpuConfig,
    expected: watch::Receiver<Option<u32>>,
    tx: watch::Sender<TpuReport>,
    stop: CancellationToken,
) -> Option<JoinHandle<()>> {
    if cfg.enabled == Switch::Off {
        tx.send_replace(TpuReport::default());
        return None;
    }
    let log = Some(Path::new(&cfg.kernel_log)).filter(|_| !cfg.kernel_log.is_empty());
    let probe = FsProbe::new(&cfg.device_dir, &cfg.sys_dir, log, UPTIME);
    let listed = (cfg.enabled == Switch::On).then(|| device_files(Path::new(&cfg.device_dir)));
    if let Some(Err(e)) = listed {
        tracing::error!(error = %e, "tpu.enabled = on but the TPU chips cannot be listed");
    }
    tracing::info!(device_dir = %cfg.device_dir, kernel_log = %cfg.kernel_log,
        "TPU monitoring on (a verdict where the node has TPU chips)");
    Some(tokio::spawn(run_monitor(probe, cfg.clone(), expected, tx, stop)))
}
