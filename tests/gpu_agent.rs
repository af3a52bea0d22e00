//! GPU health through the running agent: the fake NVML probe drives the real monitor thread,
//! whose reports reach the real restart pipeline and maintenance controller (Node fields,
//! Events, alerts, metrics). The no-driver path of the real binary is in tests/e2e.rs.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::fake_gpu::FakeGpu;
use common::fakes::{FakeRuntime, RecordingNodeApi, RecordingSink};
use common::fleet::Fleet;
use common::real::eventually_every;
use common::wiring::{trail_decisions, write_record};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use vigil::accel::gpu::model::{GpuHealth, GpuReport, RemappedRows};
use vigil::accel::gpu::monitor::{spawn_monitor, spawn_monitor_with};
use vigil::accel::gpu::state::StateStore;
use vigil::alerts::{AlertKind, Notifier};
use vigil::coord::{Coordinator, Keys};
use vigil::cycle::agent::Agent;
use vigil::hang::policy::Verdict;
use vigil::metrics::Metrics;
use vigil::node::controller::Controller;

struct Rig {
    gpu: FakeGpu,
    coord: Arc<dyn Coordinator>,
    runtime: FakeRuntime,
    node: RecordingNodeApi,
    sink: RecordingSink,
    metrics: Arc<Metrics>,
    agent: Agent,
    keys: Keys,
    stop: CancellationToken,
    cancel: CancellationToken,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cancel.cancel();
    }
}

/// One node (`gpu-1`) of the shared fleet harness on the system clock, with its controller; the
/// fake NVML (GPU 0 and GPU-bbbb) under the real monitor thread, whose reports reach the agent
/// and the running controller; `trainer-0` on GPU 0, `trainer-1` on GPU-bbbb.
async fn rig() -> Rig {
    let mut fleet = Fleet::builder()
        .node("gpu-1")
        .system_clock()
        .controllers()
        .unvalidated()
        .config(|_, cfg| {
            cfg.gpu.sample_interval = Duration::from_millis(50);
            cfg.gpu.taint_on_failure = true;
            cfg.gpu.call_deadline = Duration::from_secs(2);
            cfg.policy.stale_after = Duration::from_millis(300);
            cfg.policy.confirm_after = Duration::from_millis(20);
            cfg.policy.restart_delay = Duration::from_millis(50);
        })
        .build();
    let mut node = fleet.nodes.remove(0);
    let gpu = FakeGpu::new();
    gpu.add_gpu(0, "GPU-aaaa");
    gpu.add_gpu(1, "GPU-bbbb");
    node.runtime.add("c0", "trainer-0");
    node.runtime.set_gpus("c0", &["0"]);
    node.runtime.add("c1", "trainer-1");
    node.runtime.set_gpus("c1", &["GPU-bbbb"]);
    let (tx, rx) = tokio::sync::watch::channel(GpuReport::default());
    let stop = CancellationToken::new();
    spawn_monitor(Box::new(gpu.clone()), node.cfg.gpu.clone(), tx, stop.clone())
        .expect("a monitor thread");
    let agent = node.agents.remove(0).with_gpu(rx.clone());
    let notifier = Notifier::new(Some(Arc::new(fleet.sink.clone())), node.metrics.clone());
    let controller = node.controller.take().expect("built with its controller");
    let controller = controller.with_notifier(notifier);
    let cancel = CancellationToken::new();
    // No metadata watcher (not on GCE): its channel closed, so restarts do not wait for it.
    let (_, meta_rx) = tokio::sync::watch::channel(Default::default());
    tokio::spawn(controller.run(meta_rx, rx, CancellationToken::new(), cancel.clone()));
    Rig {
        keys: node.keys,
        gpu,
        coord: fleet.store,
        runtime: node.runtime,
        node: node.node_api,
        sink: fleet.sink,
        metrics: node.metrics,
        agent,
        stop,
        cancel,
    }
}

/// Wait (up to 4 s, every 20 ms) until `cond` holds.
async fn eventually(cond: impl FnMut() -> bool) -> bool {
    eventually_every(Duration::from_secs(4), Duration::from_millis(20), cond).await
}

impl Rig {
    fn gpu_label(&self) -> Option<String> {
        self.node.last().labels.get("vigil.dev/gpu-health").cloned().flatten()
    }

    async fn stale(&self, worker: &str) {
        let now = self.coord.time().await.unwrap();
        let key = self.keys.status(worker);
        write_record(self.coord.as_ref(), &key, "processing", now - 10_000, &[("job", "j")]).await;
    }

    async fn fresh(&self, worker: &str) {
        let now = self.coord.time().await.unwrap();
        let key = self.keys.status(worker);
        write_record(self.coord.as_ref(), &key, "processing", now, &[]).await;
    }

    /// Run agent cycles for a while (a restart, if any, happens within them).
    async fn cycles(&mut self, n: usize) -> Vec<(String, Verdict)> {
        let mut last = Vec::new();
        for _ in 0..n {
            last = self.agent.cycle().await.verdicts;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        last
    }

    /// `cycles(n)`, with `worker` beating before each one. NB: the cycles run on the real clock,
    /// and on a loaded machine ten of them can outlast `stale_after` (300 ms): a worker the test
    /// means to stay healthy would go stale, be confirmed hung and page on its own.
    async fn cycles_beating(&mut self, n: usize, worker: &str) -> Vec<(String, Verdict)> {
        let mut last = Vec::new();
        for _ in 0..n {
            self.fresh(worker).await;
            last = self.agent.cycle().await.verdicts;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        last
    }
}

#[tokio::test]
async fn xid_79_fails_the_gpu_taints_the_node_alerts_and_protects_its_worker() {
    let mut r = rig().await;
    assert!(
        eventually(|| r.gpu_label().as_deref() == Some("healthy")).await,
        "{:?}",
        r.node.last()
    );
    r.gpu.inject_xid(0, 79);
    assert!(eventually(|| r.gpu_label().as_deref() == Some("failed")).await);
    let d = r.node.last();
    assert!(d
        .add_taints
        .iter()
        .any(|t| t.key == "vigil.dev/gpu-failed" && t.effect == "NoSchedule"));
    let reasons = d.annotations["vigil.dev/gpu-health-reasons"].clone().unwrap();
    assert!(reasons.contains("79"), "{reasons}");
    assert!(r.node.reasons().contains(&"VigilGpuFailed".to_string()));
    assert!(eventually(|| r.sink.count(AlertKind::GpuFailed) >= 1).await);

    // Both workers hang: the one on the failed GPU is never restarted, the other one is.
    r.stale("trainer-0").await;
    r.stale("trainer-1").await;
    let verdicts = r.cycles(25).await;
    assert_eq!(r.runtime.restarts("c0"), 0, "a restart cannot fix hardware");
    assert_eq!(r.runtime.restarts("c1"), 1, "the healthy GPU's worker is still looked after");
    assert!(verdicts.contains(&("trainer-0".to_string(), Verdict::GpuFailed)), "{verdicts:?}");
    let text = r.metrics.encode();
    assert!(
        common::has_sample(
            &text,
            "vigil_gpu_xid_events_total{gpu=\"0\",uuid=\"GPU-aaaa\",xid=\"79\"} 1"
        ),
        "{text}"
    );
    assert!(
        common::has_sample(
            &text,
            "vigil_gpu_health{gpu=\"0\",uuid=\"GPU-aaaa\",state=\"failed\"} 1"
        ),
        "{text}"
    );
    assert!(common::has_sample(&text, "vigil_gpu_monitoring 1"), "{text}");
    // Issue 31, item 2: the failed GPU loses its time while failed, report after report.
    let gpu_lost = || {
        r.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix("vigil_lost_seconds_total{cause=\"gpu-failed\"} "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let before = gpu_lost();
    assert!(eventually(|| gpu_lost() > before).await, "{}", r.metrics.encode());
}

#[tokio::test]
async fn application_xid_13_keeps_the_gpu_healthy_but_is_counted() {
    let r = rig().await;
    r.gpu.inject_xid(0, 13);
    r.gpu.inject_xid(0, 13);
    assert!(
        eventually(|| common::has_sample(
            &r.metrics.encode(),
            "vigil_gpu_xid_events_total{gpu=\"0\",uuid=\"GPU-aaaa\",xid=\"13\"} 2"
        ))
        .await,
        "{}",
        r.metrics.encode()
    );
    assert_eq!(r.gpu_label().as_deref(), Some("healthy"));
    assert!(!r.node.reasons().contains(&"VigilGpuFailed".to_string()));
}

#[tokio::test]
async fn ecc_errors_and_pending_retirement_degrade() {
    let r = rig().await;
    let reasons = |r: &Rig| {
        r.node
            .last()
            .annotations
            .get("vigil.dev/gpu-health-reasons")
            .cloned()
            .flatten()
            .unwrap_or_default()
    };
    assert!(eventually(|| r.gpu_label().as_deref() == Some("healthy")).await);
    r.gpu.set_ecc_uncorrected(0, 2);
    assert!(eventually(|| r.gpu_label().as_deref() == Some("degraded")).await);
    assert!(reasons(&r).contains("uncorrectable ECC"), "{}", reasons(&r));
    assert!(r.node.last().add_taints.is_empty(), "degraded is not tainted");
    r.gpu.set_ecc_uncorrected(0, 0);
    assert!(eventually(|| r.gpu_label().as_deref() == Some("healthy")).await);
    r.gpu.set_pending_retirement(1, true);
    assert!(eventually(|| r.gpu_label().as_deref() == Some("degraded")).await);
    assert!(reasons(&r).contains("pending retirement"), "{}", reasons(&r));
}

#[tokio::test]
async fn an_application_xid_is_evidence_on_the_hang_alert() {
    let mut r = rig().await;
    r.gpu.inject_xid(0, 43);
    assert!(eventually(|| r.metrics.encode().contains("xid=\"43\"")).await);
    r.stale("trainer-0").await;
    // trainer-1 beats throughout: the one hung page is trainer-0's, one per incident.
    r.cycles_beating(10, "trainer-1").await;
    let hung = r.sink.of(AlertKind::Hung);
    assert_eq!(hung.len(), 1, "{:?}", r.sink.kinds());
    assert_eq!(hung[0].worker.as_deref(), Some("trainer-0"), "{:?}", hung[0]);
    assert!(hung[0].detail.contains("XID 43 on GPU 0"), "{}", hung[0].detail);
    assert_eq!(r.runtime.restarts("c0"), 1, "an application XID does not block the restart");
}

#[tokio::test]
async fn a_gpu_reset_clears_the_failure_in_the_trail_and_its_worker_is_looked_after_again() {
    let mut r = rig().await;
    assert!(eventually(|| r.gpu_label().as_deref() == Some("healthy")).await);
    r.gpu.inject_xid(0, 95);
    assert!(eventually(|| r.gpu_label().as_deref() == Some("failed")).await);
    r.stale("trainer-0").await;
    r.cycles(10).await;
    assert_eq!(r.runtime.restarts("c0"), 0, "stood down while the GPU needs a reset");
    // The GPU is reset: its energy counter and volatile counts start again.
    r.gpu.reset_gpu(0);
    assert!(eventually(|| r.gpu_label().as_deref() == Some("healthy")).await);
    let coord = r.coord.clone();
    let keys = r.keys.clone();
    let mut cleared = Vec::new();
    for _ in 0..100 {
        let entries = coord.read_recent(&keys.trail(), 1000).await.unwrap();
        cleared = entries
            .iter()
            .filter(|(_, f)| f["decision"] == "gpu-failure-cleared")
            .map(|(_, f)| f["detail"].clone())
            .collect();
        if !cleared.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cleared.len(), 1, "{:?}", trail_decisions(coord.as_ref(), &keys).await);
    assert!(
        cleared[0].contains("GPU 0 (GPU-aaaa): failure cleared: the energy counter restarted")
            && cleared[0].contains("XID 95 (uncontained ECC error)"),
        "{}",
        cleared[0]
    );
    assert!(!r.node.last().add_taints.iter().any(|t| t.key == "vigil.dev/gpu-failed"));
    // The worker is looked after again.
    r.stale("trainer-0").await;
    r.cycles(25).await;
    assert_eq!(r.runtime.restarts("c0"), 1);
}

#[tokio::test]
async fn a_contained_ecc_error_is_the_applications_and_its_worker_is_restarted() {
    let mut r = rig().await;
    assert!(eventually(|| r.gpu_label().as_deref() == Some("healthy")).await);
    r.gpu.inject_xid(0, 94);
    assert!(eventually(|| r.metrics.encode().contains("xid=\"94\"")).await);
    assert_eq!(r.gpu_label().as_deref(), Some("healthy"));
    r.fresh("trainer-1").await;
    r.stale("trainer-0").await;
    r.cycles(25).await;
    assert_eq!(r.runtime.restarts("c0"), 1, "restart-app: the restart is the fix");
    assert!(!r.node.reasons().contains(&"VigilGpuFailed".to_string()));
}

#[tokio::test]
async fn an_xid_storm_is_one_event_not_one_per_xid() {
    let r = rig().await;
    r.gpu.inject_xids(0, 13, 2000);
    assert!(
        eventually(|| common::has_sample(
            &r.metrics.encode(),
            "vigil_gpu_xid_events_total{gpu=\"0\",uuid=\"GPU-aaaa\",xid=\"13\"} 2000"
        ))
        .await,
        "{}",
        r.metrics.encode()
    );
    r.gpu.inject_xids(0, 13, 500);
    r.gpu.inject_xid(1, 13);
    let xid_events = || r.node.reasons().iter().filter(|e| *e == "VigilGpuXid").count();
    assert!(eventually(|| xid_events() == 2).await, "{:?}", r.node.reasons());
    // Settled: the rest of the storm on GPU 0 is the same episode.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(xid_events(), 2, "{:?}", r.node.reasons());
    assert_eq!(r.gpu_label().as_deref(), Some("healthy"));
}

#[tokio::test]
async fn a_wedged_driver_is_one_event_an_unknown_health_and_never_stops_the_cycle() {
    let mut r = rig().await;
    r.gpu.inject_xid(0, 79);
    assert!(eventually(|| r.gpu_label().as_deref() == Some("failed")).await);
    r.gpu.wedge(true);
    let node = r.node.clone();
    let hung = move || node.reasons().iter().filter(|e| *e == "VigilGpuNvmlHung").count();
    assert!(
        eventually_every(Duration::from_secs(10), Duration::from_millis(50), || hung() == 1).await,
        "{:?}",
        r.node.reasons()
    );
    // The cycle goes on while NVML does not answer: a hung worker on a healthy GPU is
    // restarted; the one on the GPU that failed before the driver wedged is not.
    r.stale("trainer-0").await;
    r.stale("trainer-1").await;
    r.cycles(25).await;
    assert_eq!(r.runtime.restarts("c1"), 1);
    assert_eq!(r.runtime.restarts("c0"), 0, "a failure outlives a wedged driver");
    let d = r.node.last();
    assert_eq!(
        d.labels.get("vigil.dev/gpu-health").cloned().flatten(),
        None,
        "no verdict while NVML hangs"
    );
    assert!(
        !d.remove_taints.contains(&"vigil.dev/gpu-failed".to_string()),
        "the failed GPU's taint stays: {:?}",
        d.remove_taints
    );
    let cond = d
        .conditions
        .iter()
        .find(|c| c.kind == "VigilGPUUnhealthy")
        .map(|c| format!("{c:?}"))
        .expect("the GPU condition");
    assert!(cond.contains("Unknown") && cond.contains("\"NvmlHung\""), "{cond}");
    r.gpu.wedge(false);
    assert!(eventually(|| r.gpu_label().as_deref() == Some("failed")).await);
    assert_eq!(hung(), 1, "reported once");
}

/// One agent process's GPU side on the node whose GPU state file and boot id are in `dir`: the
/// real monitor on `gpu`, keeping its failures in the state file, and the node controller of a
/// fresh `gpu-1` (its own Node, Events and alerts recorded), following the monitor from
/// [`Process::control`].
struct Process {
    rx: watch::Receiver<GpuReport>,
    node: RecordingNodeApi,
    sink: RecordingSink,
    metrics: Arc<Metrics>,
    controller: Option<Controller>,
    stop: CancellationToken,
    monitor: Option<std::thread::JoinHandle<()>>,
    controlling: Option<tokio::task::JoinHandle<()>>,
}

impl Process {
    /// The monitor started; the controller not yet.
    fn monitor(dir: &Path, gpu: &FakeGpu) -> Process {
        let file = dir.join("gpu-state.json");
        let state_file = file.display().to_string();
        let mut fleet = Fleet::builder()
            .node("gpu-1")
            .system_clock()
            .controllers()
            .unvalidated()
            .config(move |_, cfg| {
                cfg.gpu.sample_interval = Duration::from_millis(50);
                cfg.gpu.taint_on_failure = true;
                cfg.gpu.state_file = state_file.clone();
            })
            .build();
        let mut node = fleet.nodes.remove(0);
        let store = StateStore::new(file, &dir.join("boot_id"));
        let (tx, rx) = watch::channel(GpuReport::default());
        let stop = CancellationToken::new();
        let probe = Box::new(gpu.clone());
        let cfg = node.cfg.gpu.clone();
        let monitor = spawn_monitor_with(probe, cfg, Some(store), None, tx, stop.clone())
            .expect("a monitor thread");
        let notifier = Notifier::new(Some(Arc::new(fleet.sink.clone())), node.metrics.clone());
        let controller = node.controller.take().map(|c| c.with_notifier(notifier));
        Process {
            rx,
            node: node.node_api,
            sink: fleet.sink,
            metrics: node.metrics,
            controller,
            stop,
            monitor: Some(monitor),
            controlling: None,
        }
    }

    /// The monitor and the controller, started together as the agent starts them.
    fn start(dir: &Path, gpu: &FakeGpu) -> Process {
        let mut p = Process::monitor(dir, gpu);
        p.control();
        p
    }

    /// Start the node controller, on the monitor's reports as they stand.
    fn control(&mut self) {
        let controller = self.controller.take().expect("one controller per process");
        // No metadata watcher (not on GCE): its channel closed.
        let (_, meta_rx) = watch::channel(Default::default());
        let (gpu_rx, term) = (self.rx.clone(), CancellationToken::new());
        let run = controller.run(meta_rx, gpu_rx, term, self.stop.clone());
        self.controlling = Some(tokio::spawn(run));
    }

    fn gpu_label(&self) -> Option<String> {
        self.node.last().labels.get("vigil.dev/gpu-health").cloned().flatten()
    }

    fn failed_events(&self) -> usize {
        self.node.reasons().iter().filter(|e| *e == "VigilGpuFailed").count()
    }

    /// The agent stops: its controller, then its monitor.
    async fn end(mut self) {
        self.stop.cancel();
        if let Some(c) = self.controlling.take() {
            c.await.expect("the controller panicked");
        }
        if let Some(m) = self.monitor.take() {
            m.join().expect("the monitor thread panicked");
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A node's GPU state directory: its boot id, and room for the state file.
fn node_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("boot_id"), "boot-1\n").unwrap();
    dir
}

fn state_text(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("gpu-state.json")).unwrap_or_default()
}

/// The agent started again on `dir` (a rollout): the Node shows the GPUs failed, with no
/// `VigilGpuFailed` Event nor page; `temperature` marks a later report, by which the controller
/// is done with its first verdict's.
async fn restarted_quietly(dir: &Path, gpu: &FakeGpu, temperature: u32) -> Process {
    let p = Process::start(dir, gpu);
    assert!(eventually(|| p.gpu_label().as_deref() == Some("failed")).await);
    gpu.set_temperature(0, temperature);
    let gpu0 = "gpu=\"0\",uuid=\"GPU-aaaa\"";
    let later = format!("vigil_gpu_temperature_celsius{{{gpu0}}} {temperature}");
    assert!(eventually(|| common::has_sample(&p.metrics.encode(), &later)).await);
    assert_eq!(p.failed_events(), 0, "{:?}", p.node.reasons());
    assert_eq!(p.sink.count(AlertKind::GpuFailed), 0, "{:?}", p.sink.kinds());
    p
}

/// An agent restart sends no second `VigilGpuFailed` Event, and no second page, for a failure
/// its Events already said: one read again from the GPU at every start (a row remapping that
/// failed), and an XID's, kept in the state file.
#[tokio::test]
async fn an_agent_restart_does_not_announce_a_known_gpu_failure_again() {
    let dir = node_dir();
    let gpu = FakeGpu::new();
    gpu.add_gpu(0, "GPU-aaaa");
    gpu.add_gpu(1, "GPU-bbbb");
    gpu.set_remap(1, RemappedRows { failure: true, ..RemappedRows::default() });
    let p = Process::start(dir.path(), &gpu);
    let announced = || p.failed_events() == 1 && p.sink.count(AlertKind::GpuFailed) == 1;
    assert!(eventually(announced).await, "{:?}", p.node.reasons());
    // Kept: the node's last Event said `failed`.
    let said = || state_text(dir.path()).contains("\"announced\": \"failed\"");
    assert!(eventually(said).await, "{}", state_text(dir.path()));
    p.end().await;

    let p = restarted_quietly(dir.path(), &gpu, 41).await;
    // An XID fails the other GPU too: the node was failed already, no Event either.
    gpu.inject_xid(0, 79);
    assert!(eventually(|| state_text(dir.path()).contains("GPU-aaaa")).await);
    assert_eq!(p.failed_events(), 0, "{:?}", p.node.reasons());
    p.end().await;

    restarted_quietly(dir.path(), &gpu, 42).await.end().await;
}

/// A failure written to the state file before its Event went out (the agent stopped first, or
/// its controller did) is announced by the agent that starts next: an Event and a page.
#[tokio::test]
async fn a_gpu_failure_not_yet_announced_is_announced_after_a_restart() {
    let dir = node_dir();
    let gpu = FakeGpu::new();
    gpu.add_gpu(0, "GPU-aaaa");
    let p = Process::monitor(dir.path(), &gpu);
    gpu.inject_xid(0, 79);
    assert!(eventually(|| state_text(dir.path()).contains("GPU-aaaa")).await);
    p.end().await;

    let p = Process::start(dir.path(), &gpu);
    assert!(eventually(|| p.failed_events() == 1).await, "{:?}", p.node.reasons());
    assert!(eventually(|| p.sink.count(AlertKind::GpuFailed) == 1).await, "{:?}", p.sink.kinds());
    assert_eq!(p.gpu_label().as_deref(), Some("failed"));
    p.end().await;
}

/// A failure the monitor published before the node controller started (one in its first
/// sample) is a change: an Event and a page, not taken silently as the start.
#[tokio::test]
async fn a_gpu_failure_published_before_the_controller_starts_is_announced() {
    let dir = node_dir();
    let gpu = FakeGpu::new();
    gpu.add_gpu(0, "GPU-aaaa");
    let mut p = Process::monitor(dir.path(), &gpu);
    gpu.inject_xid(0, 79);
    let rx = p.rx.clone();
    let failed = || {
        let r = rx.borrow();
        r.monitoring() && r.node == GpuHealth::Failed
    };
    assert!(eventually(failed).await);
    p.control();
    assert!(eventually(|| p.failed_events() == 1).await, "{:?}", p.node.reasons());
    assert!(eventually(|| p.sink.count(AlertKind::GpuFailed) == 1).await, "{:?}", p.sink.kinds());
    assert_eq!(p.gpu_label().as_deref(), Some("failed"));
    p.end().await;
}
