//! The GPU monitor: runs a [`GpuProbe`] on a dedicated thread (NVML calls block) and publishes
//! [`GpuReport`]s, folded by the pure [`crate::accel::gpu::policy::update`], on a `watch` channel,
//! keeping failed GPUs in the state file (`crate::accel::gpu::state`) when it has one.
//! `crate::accel::gpu::start::start` is the production wiring: it waits for the driver when the node has
//! GPUs but NVML does not load yet.

#![allow(clippy::disallowed_types)] // NB: a dedicated thread on real monotonic time.
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::accel::clock_ms;
use crate::accel::gpu::model::{GpuMonitorState, GpuReport, GpuSample, Told, XidEvent};
use crate::accel::gpu::nvml::GpuProbe;
use crate::accel::gpu::policy::{rejudge, update, update_xids};
use crate::accel::gpu::policy_episode::ended;
use crate::accel::gpu::policy_kubelet::{hear, new_reports, KubeletReport};
use crate::accel::gpu::policy_state::{needs_write, snapshot, Restored, StateFile};
use crate::accel::gpu::policy_xid::RECOVERY_ACTION_CHANGED;
use crate::accel::gpu::state::StateStore;
use crate::clock::human;
use crate::config::GpuConfig;

/// The kubelet's reports of the GPUs it calls `Unhealthy` (`crate::accel::gpu::kubelet`).
pub type Kubelet = watch::Receiver<Vec<KubeletReport>>;

/// Longest single wait for XID events: also how quickly the monitor notices `stop`.
const XID_WAIT: Duration = Duration::from_secs(1);

/// The monitor's thread's name (`ps -L`, a debugger's thread list).
pub(crate) const THREAD: &str = "vigil-gpu";

/// Logs a recurring failure at most once a minute, with how many were left out.
#[derive(Default)]
pub(crate) struct Throttled {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttled {
    const EVERY: Duration = Duration::from_secs(60);

    pub(crate) fn warn(&mut self, what: &'static str, e: &dyn std::fmt::Display) {
        if self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(error = %e, suppressed = self.suppressed, "{what}");
        (self.last, self.suppressed) = (Some(Instant::now()), 0);
    }

    pub(crate) fn ok(&mut self, what: &'static str) {
        if self.last.take().is_some() {
            tracing::info!("{what}");
            self.suppressed = 0;
        }
    }
}

/// Run `probe` on a dedicated thread until `stop` is cancelled, publishing on `tx`, keeping no
/// state across restarts (see [`spawn_monitor_with`]).
///
/// The thread alternates between waiting for XID events (at most [`XID_WAIT`] at a time, so
/// `stop` is seen within about a second) and reading every GPU each `cfg.sample_interval`
/// (the first read at once).
#[cfg(any(test, feature = "bench"))]
pub fn spawn_monitor(
    probe: Box<dyn GpuProbe>,
    cfg: GpuConfig,
    tx: watch::Sender<GpuReport>,
    stop: CancellationToken,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    spawn_monitor_with(probe, cfg, None, None, tx, stop)
}

/// As [`spawn_monitor`], with failed GPUs read from and written to `store`, and hearing the
/// kubelet's reports (`crate::accel::gpu::kubelet`): a GPU it newly reports `Unhealthy` is
/// failed until it is reset. Its own thread: an error when the OS refuses one (a container at its
/// pids limit).
#[cfg(any(test, feature = "bench"))]
pub fn spawn_monitor_with(
    probe: Box<dyn GpuProbe>,
    cfg: GpuConfig,
    store: Option<StateStore>,
    kubelet: Option<Kubelet>,
    tx: watch::Sender<GpuReport>,
    stop: CancellationToken,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let kept = Kept::open(store, &cfg);
    tx.send_replace(kept.before_nvml(GpuMonitorState::Starting));
    let run = move || run_monitor(probe, &cfg, kept, &tx, &stop, kubelet);
    std::thread::Builder::new().name(THREAD.into()).spawn(run)
}

/// The failures kept across restarts (with a state file), judged: where the monitor's verdict
/// starts, and its keeper of the file.
pub(crate) struct Kept {
    keeper: Option<Keeper>,
    report: GpuReport,
}

impl Kept {
    /// Read `store` (none: nothing kept) and judge what it keeps.
    pub(crate) fn open(store: Option<StateStore>, cfg: &GpuConfig) -> Kept {
        let (keeper, seed) = store.map(Keeper::open).unzip();
        Kept { keeper, report: rejudge(&seed.unwrap_or_default(), cfg) }
    }

    /// What holds while NVML is not read yet, in `state`: the kept failures (a GPU failed on
    /// this boot is failed before NVML answers, and a wedged driver is when that matters most).
    pub(crate) fn before_nvml(&self, state: GpuMonitorState) -> GpuReport {
        GpuReport { state, ..self.report.clone() }
    }
}

/// The state file as the monitor keeps it: what was last written, and when.
struct Keeper {
    store: StateStore,
    /// The file last written, and when.
    last: Option<(StateFile, i64)>,
    errors: Throttled,
}

impl Keeper {
    /// Read the file: the report to start from, not judged yet (failures of this boot,
    /// clearings by a reboot, what the last GPU Event said).
    fn open(store: StateStore) -> (Keeper, GpuReport) {
        let Restored { gpus, cleared, announced, warning } = store.load();
        if let Some(w) = &warning {
            tracing::warn!("{w}");
        }
        for g in &gpus {
            tracing::warn!(gpu = %g.uuid, "GPU failed before the agent restarted; kept failed");
        }
        for c in &cleared {
            tracing::info!(gpu = %c.gpu, "GPU failure cleared: {}", c.why);
        }
        let told = Told::restored(announced);
        let seed = GpuReport { gpus, cleared, told, ..GpuReport::default() };
        (Keeper { store, last: None, errors: Throttled::default() }, seed)
    }

    /// Write the failed GPUs of `report`, and what the last GPU Event said, when they changed
    /// (a failed write is retried at the next look, logged at most once a minute).
    fn keep(&mut self, report: &GpuReport, now_ms: i64) {
        let next = snapshot(&report.gpus, report.told.last(), &self.store.boot_id);
        if !needs_write(self.last.as_ref(), &next, now_ms) {
            return;
        }
        match self.store.write(&next) {
            Ok(()) => {
                self.errors.ok("GPU state file writable again");
                self.last = Some((next, now_ms));
            }
            Err(e) => self.errors.warn(
                "cannot write the GPU state file; a failed GPU would be forgotten by an agent restart",
                &format!("{}: {e}", self.store.path().display()),
            ),
        }
    }
}

/// The monitor loop (blocking).
///
/// NB: publication. Every successful sample is published (`send_replace`, which marks the value
/// changed even when the verdict is the same): the samples feed the temperature / power / ECC
/// metrics, and a reader waiting on `changed()` refreshes them. XID events are folded in and
/// published the moment they arrive, between samples, so a hardware failure does not wait for the
/// next sample (they are no reading: a GPU absent from the last sample is not counted absent
/// again); XID 154 (the driver changed its recovery action) brings the next sample forward.
/// A failed read publishes nothing and is not read as "every GPU is gone": the last verdict
/// stands, and the error is logged at most once a minute. The first verdict is the first
/// reading's: until then the failures kept across restarts stand as published before NVML
/// loaded ([`Kept::before_nvml`]), with no verdict.
pub(crate) fn run_monitor(
    probe: Box<dyn GpuProbe>,
    cfg: &GpuConfig,
    kept: Kept,
    tx: &watch::Sender<GpuReport>,
    stop: &CancellationToken,
    kubelet: Option<Kubelet>,
) {
    let calls = Calls::default();
    std::thread::scope(|scope| {
        let watchdog = std::thread::Builder::new()
            .name("vigil-gpu-watchdog".into())
            .spawn_scoped(scope, || calls.watch(tx, cfg.call_deadline, stop));
        if let Err(e) = &watchdog {
            tracing::warn!(error = %e, "cannot start the NVML watchdog thread; a wedged driver would go unreported");
        }
        // NB: the failures kept across restarts, rejudged, are where the verdict starts, not a
        // verdict of their own: a GPU judged from its readings (a row remapping that failed) is
        // not in them, and the first verdict must not say "healthy" before it is read (the node
        // controller judges a restarted agent's first verdict against its last Event's).
        let Kept { keeper, report } = kept;
        Verdict { report, keeper, heard: Vec::new(), kubelet, cfg, tx }.follow(probe, stop, &calls);
        calls.lock().done = true;
    });
    tracing::debug!("GPU monitor stopped");
}

/// The NVML call in progress, shared by the monitor loop and its watchdog ([`Calls::watch`]).
#[derive(Default)]
struct Calls(Mutex<CallState>);

#[derive(Default)]
struct CallState {
    /// What the call does and when it began.
    call: Option<(&'static str, Instant)>,
    /// The watchdog said this call was late (published `nvml-hung`).
    reported: bool,
    /// The monitor loop has ended.
    done: bool,
}

impl Calls {
    fn lock(&self) -> std::sync::MutexGuard<'_, CallState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run one NVML call under watch. One the watchdog had reported late is said once when it
    /// answers, and the watchdog's `nvml-hung` replaced by `v`'s verdict as it stands.
    fn run<T>(&self, what: &'static str, v: &Verdict<'_>, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        *self.lock() = CallState { call: Some((what, started)), ..CallState::default() };
        let out = f();
        if std::mem::take(&mut *self.lock()).reported {
            let took = started.elapsed();
            v.tx.send_replace(v.report.clone());
            tracing::info!(
                took_ms = took.as_millis() as u64,
                "the late NVML call answered after {}; GPU health is watched again",
                human(took.as_millis() as i64)
            );
        }
        out
    }

    /// The watchdog of the monitor's NVML calls: one that has not returned within `deadline` (a
    /// wedged driver; NVML calls block without a timeout of their own) is reported once: a log
    /// line, and a report in state `nvml-hung` (no verdict; the agent's cycle only ever reads the
    /// latest report, so it never waits for NVML).
    fn watch(&self, tx: &watch::Sender<GpuReport>, deadline: Duration, stop: &CancellationToken) {
        let tick = (deadline / 4).min(Duration::from_millis(250));
        let within = human(deadline.as_millis() as i64);
        loop {
            std::thread::sleep(tick);
            let mut st = self.lock();
            if st.done || stop.is_cancelled() {
                return;
            }
            let Some((what, since)) = st.call else { continue };
            if st.reported || since.elapsed() < deadline {
                continue;
            }
            st.reported = true;
            let hung = format!("{what} has not returned within {within}");
            tracing::error!(
                call = what,
                "an NVML call {hung}: the NVIDIA driver may be wedged; GPU health is unknown until it answers (failed GPUs stay failed)"
            );
            // NB: published under the lock, so the monitor's own report (after the call returns)
            // always comes later.
            tx.send_modify(|r| (r.state, r.hung) = (GpuMonitorState::NvmlHung, Some(hung)));
        }
    }
}

/// The monitor's verdict as it stands, what it has said of it, and where it says it.
struct Verdict<'a> {
    report: GpuReport,
    keeper: Option<Keeper>,
    /// The kubelet's reports as last heard.
    heard: Vec<KubeletReport>,
    kubelet: Option<Kubelet>,
    cfg: &'a GpuConfig,
    tx: &'a watch::Sender<GpuReport>,
}

impl Verdict<'_> {
    /// Take `report` as the verdict: the failures kept, and published (`always`: even when it
    /// is the same).
    fn set(&mut self, report: GpuReport, always: bool) {
        self.report = report;
        self.keep();
        let next = self.report.clone();
        self.tx.send_if_modified(|cur| std::mem::replace(cur, next) != *cur || always);
    }

    /// Keep the failures, and what the node's last GPU Event said, in the state file when they
    /// changed.
    fn keep(&mut self) {
        if let Some(k) = self.keeper.as_mut() {
            k.keep(&self.report, clock_ms());
        }
    }

    /// Fold observations in (`samples`: a new reading; `None`: XIDs between readings), log the
    /// episodes begun and ended and the failures cleared, keep the failures, publish: every
    /// sample (its readings feed the metrics), XIDs when they change the report.
    fn fold(&mut self, samples: Option<&[GpuSample]>, xids: &[XidEvent]) {
        let now = clock_ms();
        let next = match samples {
            Some(s) => update(&self.report, s, xids, now, self.cfg),
            None => update_xids(&self.report, xids, now, self.cfg),
        };
        log_changes(&self.report, &next);
        self.set(next, samples.is_some());
    }

    /// Hear the kubelet's reports when they changed (read between waits, each at most
    /// `XID_WAIT`: the kubelet's reader runs on the executor, never holding the monitor loop);
    /// not before the first GPUs are read (a report would match none and be spent). A GPU one
    /// newly names is failed (kept, and published at once, as an XID's failure is).
    fn listen(&mut self) {
        let Some(rx) = self.kubelet.as_mut() else { return };
        if self.report.gpus.is_empty() || !rx.has_changed().unwrap_or(false) {
            return;
        }
        let reports = rx.borrow_and_update().clone();
        let new = new_reports(&self.heard, &reports);
        self.heard = reports;
        if new.is_empty() || !self.report.monitoring() {
            return;
        }
        self.set(hear(&self.report, &new, self.cfg), true);
    }

    /// The monitor loop proper (blocking), its NVML calls under the watchdog's eye: the verdict
    /// followed and published until `stop`.
    fn follow(mut self, mut probe: Box<dyn GpuProbe>, stop: &CancellationToken, calls: &Calls) {
        let (mut sample_errors, mut xid_errors) = (Throttled::default(), Throttled::default());
        let mut next_sample = Instant::now();
        while !stop.is_cancelled() {
            if Instant::now() >= next_sample {
                match calls.run("reading the GPUs", &self, || probe.sample()) {
                    Ok(s) => {
                        sample_errors.ok("GPUs readable again");
                        self.fold(Some(s.as_slice()), &[]);
                    }
                    Err(e) => {
                        sample_errors.warn("cannot read the GPUs; the last GPU verdict stands", &e)
                    }
                }
                next_sample = Instant::now() + self.cfg.sample_interval;
            }
            if stop.is_cancelled() {
                break;
            }
            self.listen();
            // NB: an Event the node controller has said since (`Told`) is kept within a second,
            // not at the next sample: an agent stopped meanwhile would say it again.
            self.keep();
            let wait = next_sample.saturating_duration_since(Instant::now()).min(XID_WAIT);
            let started = Instant::now();
            match calls.run("waiting for XID events", &self, || probe.wait_xids(wait)) {
                Ok(xids) if xids.is_empty() => {}
                Ok(xids) => {
                    xid_errors.ok("XID events readable again");
                    tracing::debug!(events = xids.len(), "GPU XID events");
                    if xids.iter().any(|x| x.xid == RECOVERY_ACTION_CHANGED) {
                        next_sample = Instant::now();
                    }
                    self.fold(None, &xids);
                }
                Err(e) => {
                    xid_errors.warn("cannot wait for GPU XID events", &e);
                    // A probe that fails at once must not turn this loop into a busy loop.
                    std::thread::sleep(wait.saturating_sub(started.elapsed()));
                }
            }
        }
    }
}

/// What `next` holds that `prev` did not, in the log: one line per XID episode that began (warn)
/// and one per episode that ended (info), however many events each holds (never a line per
/// event: a storm of one XID is one episode), and one per failure cleared.
///
/// NB: the monitor sees every report it makes, so what is new is what is numbered after `prev`'s
/// latest (a reader of the channel, which may miss reports, counts what it has seen instead:
/// `new_begun`, `new_cleared`).
fn log_changes(prev: &GpuReport, next: &GpuReport) {
    for b in next.begun.iter().filter(|b| b.seq > prev.episode_seq) {
        tracing::warn!(gpu = %b.gpu, xid = b.xid, "GPU XID episode began: {}", b.detail);
    }
    for (gpu, e) in ended(prev, next) {
        let over = human(e.last_ms - e.first_ms);
        tracing::info!(gpu = %gpu, xid = e.xid, events = e.count,
            "GPU XID episode over: XID {} on {gpu}, {} event(s) over {over}", e.xid, e.count);
    }
    let cleared_before = prev.cleared.last().map_or(0, |c| c.seq);
    for c in next.cleared.iter().filter(|c| c.seq > cleared_before) {
        tracing::info!(gpu = %c.gpu, causes = %c.causes.join("; "), "GPU failure cleared: {}", c.why);
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
