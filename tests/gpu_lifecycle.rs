//! A GPU failure's life across agent restarts, and NVML that arrives late, below the agent: the
//! real monitor thread (`spawn_monitor_with`, `start_with`) with the real state file in a
//! temporary directory, an injected boot id, and the fake NVML (tests/common/fake_gpu.rs).
//!
//! An "agent restart" is the monitor stopped and started again on the same state file; a
//! "reboot" is a new boot id; a "GPU reset" is what `FakeGpu::reset_gpu` does to the readings.

use crate::common::fake_gpu;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fake_gpu::FakeGpu;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use vigil::accel::gpu::model::{GpuHealth, GpuMonitorState, GpuReport};
use vigil::accel::gpu::monitor::spawn_monitor_with;
use vigil::accel::gpu::nvml::{GpuError, GpuProbe, HostPaths, NvmlLoader};
use vigil::accel::gpu::policy::worker_on_failed_gpu;
use vigil::accel::gpu::start::{start_with, StartOptions};
use vigil::accel::gpu::state::StateStore;
use vigil::config::{GpuConfig, Switch};
use vigil::http::health::Warnings;

/// A guard against a hung test, not a speed assertion.
const LIMIT: Duration = Duration::from_secs(10);
const UUID0: &str = "GPU-00000000-1111-2222-3333-444444444444";
const UUID1: &str = "GPU-11111111-1111-2222-3333-444444444444";

fn cfg(state_file: &Path) -> GpuConfig {
    GpuConfig {
        enabled: Switch::Auto,
        sample_interval: Duration::from_millis(20),
        state_file: state_file.display().to_string(),
        ..GpuConfig::default()
    }
}

fn two_gpus() -> FakeGpu {
    let fake = FakeGpu::new();
    fake.add_gpu(0, UUID0);
    fake.add_gpu(1, UUID1);
    fake
}

/// A node: a state file and a boot id in a temporary directory.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let n = Node { dir: tempfile::tempdir().unwrap() };
        n.boot("boot-1");
        n
    }
    fn boot(&self, id: &str) {
        std::fs::write(self.boot_id_path(), format!("{id}\n")).unwrap();
    }
    fn boot_id_path(&self) -> PathBuf {
        self.dir.path().join("boot_id")
    }
    fn state_file(&self) -> PathBuf {
        self.dir.path().join("var/lib/vigil/gpu-state.json")
    }
    fn state_text(&self) -> String {
        std::fs::read_to_string(self.state_file()).unwrap_or_default()
    }
    /// One agent process's GPU monitor on this node.
    fn agent(&self, fake: &FakeGpu) -> Agent {
        let store = StateStore::new(self.state_file(), &self.boot_id_path());
        let (tx, rx) = watch::channel(GpuReport::default());
        let stop = CancellationToken::new();
        let thread = spawn_monitor_with(
            Box::new(fake.clone()),
            cfg(&self.state_file()),
            Some(store),
            None,
            tx,
            stop.clone(),
        )
        .expect("a monitor thread");
        Agent { rx, stop, thread: Some(thread) }
    }
}

struct Agent {
    rx: watch::Receiver<GpuReport>,
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl Agent {
    fn wait_for(&self, what: &str, pred: impl Fn(&GpuReport) -> bool) -> GpuReport {
        wait_for(&self.rx, what, pred)
    }
    fn stop(mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            t.join().expect("the monitor thread panicked");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn wait_for(
    rx: &watch::Receiver<GpuReport>,
    what: &str,
    pred: impl Fn(&GpuReport) -> bool,
) -> GpuReport {
    let deadline = Instant::now() + LIMIT;
    loop {
        let r = rx.borrow().clone();
        if pred(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "never saw: {what}; last report: {r:#?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn health(r: &GpuReport, id: &str) -> Option<GpuHealth> {
    r.gpu(id).map(|g| g.health)
}

/// Both GPUs read at least once (a sample, not only the state file's seed).
fn sampled(r: &GpuReport) -> bool {
    r.gpus.len() == 2 && r.gpus.iter().all(|g| g.sample.temperature_c.is_some())
}

#[test]
fn a_failed_gpu_stays_failed_across_agent_restarts_until_the_node_reboots() {
    let node = Node::new();
    let fake = two_gpus();
    let a = node.agent(&fake);
    a.wait_for("both sampled", sampled);
    fake.inject_xid(0, 95);
    a.wait_for("GPU 0 failed", |r| health(r, "0") == Some(GpuHealth::Failed));
    let deadline = Instant::now() + LIMIT;
    while !node.state_text().contains(UUID0) {
        assert!(Instant::now() < deadline, "never written: {}", node.state_text());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(node.state_text().contains("XID 95"));
    assert!(!node.state_text().contains(UUID1), "{}", node.state_text());
    a.stop();

    // The agent restarts; the GPU reads as it did (nothing was reset): still failed, at once,
    // and after samples.
    let a = node.agent(&fake);
    let r = a.wait_for("both sampled", sampled);
    assert_eq!(health(&r, "0"), Some(GpuHealth::Failed), "{:?}", r.node_reasons);
    assert_eq!(health(&r, "1"), Some(GpuHealth::Healthy));
    assert!(worker_on_failed_gpu(&r, Some(&["0".to_string()])));
    assert!(
        r.node_reasons.iter().any(|s| s.contains("XID 95") && s.contains(UUID0)),
        "{:?}",
        r.node_reasons
    );
    assert!(r.cleared.is_empty(), "{:?}", r.cleared);
    a.stop();

    // The node reboots (a new boot id): cleared, and the report says why.
    node.boot("boot-2");
    let a = node.agent(&fake);
    let r = a.wait_for("both sampled", sampled);
    assert_eq!(r.node, GpuHealth::Healthy, "{:?}", r.node_reasons);
    assert_eq!(r.cleared.len(), 1, "{:?}", r.cleared);
    assert!(r.cleared[0].why.contains("rebooted"), "{:?}", r.cleared);
    assert!(r.cleared[0].gpu.contains(UUID0));
    a.wait_for("the file forgets it", |_| !node.state_text().contains(UUID0));
    a.stop();
}

#[test]
fn a_gpu_reset_while_the_agent_runs_clears_the_failure_and_says_why() {
    let node = Node::new();
    let fake = two_gpus();
    let a = node.agent(&fake);
    a.wait_for("both sampled", sampled);
    fake.inject_xid(1, 79);
    a.wait_for("GPU 1 failed", |r| health(r, "1") == Some(GpuHealth::Failed));
    fake.reset_gpu(1);
    let r = a.wait_for("GPU 1 healthy again", |r| health(r, "1") == Some(GpuHealth::Healthy));
    assert_eq!(r.cleared.len(), 1);
    assert!(r.cleared[0].why.contains("energy counter restarted"), "{:?}", r.cleared);
    assert_eq!(r.cleared[0].causes, vec!["XID 79 (GPU has fallen off the bus)"]);
    a.wait_for("the file forgets it", |_| {
        let t = node.state_text();
        !t.is_empty() && !t.contains(UUID1)
    });
    a.stop();
}

#[test]
fn a_gpu_reset_while_the_agent_was_away_clears_it_with_persistence_mode_only() {
    for persistence in [true, false] {
        let node = Node::new();
        let fake = two_gpus();
        fake.set_persistence_mode(0, persistence);
        fake.set_ecc_uncorrected(0, 2);
        let a = node.agent(&fake);
        a.wait_for("both sampled", sampled);
        fake.inject_xid(0, 48);
        a.wait_for("GPU 0 failed", |r| health(r, "0") == Some(GpuHealth::Failed));
        a.wait_for("written", |_| node.state_text().contains(UUID0));
        a.stop();
        // The operator stops the agent, resets the GPU (nvidia-smi -r wants no NVML client on
        // it), and the agent starts again.
        fake.reset_gpu(0);
        fake.set_persistence_mode(0, persistence);
        let a = node.agent(&fake);
        let r = a.wait_for("both sampled", sampled);
        if persistence {
            assert_eq!(health(&r, "0"), Some(GpuHealth::Healthy), "{:?}", r.node_reasons);
            assert_eq!(r.cleared.len(), 1);
            assert!(
                r.cleared[0].why.contains("ECC counts went back from 2 to 0"),
                "{:?}",
                r.cleared
            );
        } else {
            // Without persistence mode the counters restart whenever the last client exits:
            // no evidence of a reset, so the GPU stays failed.
            assert_eq!(health(&r, "0"), Some(GpuHealth::Failed));
            assert!(r.cleared.is_empty());
        }
        a.stop();
    }
}

#[test]
fn a_corrupt_state_file_keeps_the_gpus_it_names_failed() {
    let node = Node::new();
    std::fs::create_dir_all(node.state_file().parent().unwrap()).unwrap();
    std::fs::write(
        node.state_file(),
        format!("{{\"version\":1,\"boot_id\":\"boot-1\",\"gpus\":[{{\"uuid\":\"{UUID1}\",\"ind"),
    )
    .unwrap();
    let fake = two_gpus();
    let a = node.agent(&fake);
    let r = a.wait_for("both sampled", sampled);
    assert_eq!(health(&r, "1"), Some(GpuHealth::Failed), "{:?}", r.node_reasons);
    assert_eq!(health(&r, "0"), Some(GpuHealth::Healthy));
    assert!(r.node_reasons.iter().any(|s| s.contains("unreadable state file")));
    // It is rewritten whole.
    a.wait_for("rewritten", |_| {
        serde_json::from_str::<serde_json::Value>(&node.state_text()).is_ok()
    });
    a.stop();
}

/// Fails `n` times as a missing library does, then hands over `fake`; counts attempts.
fn late_loader(
    n: u32,
    fake: FakeGpu,
    attempts: Arc<AtomicU32>,
) -> impl FnMut() -> Result<Box<dyn GpuProbe>, GpuError> + Send {
    move || {
        let k = attempts.fetch_add(1, Ordering::SeqCst);
        if k < n {
            Err(GpuError::NoLibrary("libnvidia-ml.so.1: cannot open shared object file".into()))
        } else {
            Ok(Box::new(fake.clone()) as Box<dyn GpuProbe>)
        }
    }
}

/// `start_with` as the agent runs it: a task on the runtime.
fn spawn_start(
    cfg: &GpuConfig,
    loader: Box<NvmlLoader>,
    opts: StartOptions,
    tx: watch::Sender<GpuReport>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Option<JoinHandle<()>>> {
    let cfg = cfg.clone();
    tokio::spawn(async move { start_with(&cfg, loader, opts, tx, stop).await })
}

/// The start-up task's end, and the monitor thread's if it started one.
async fn finish(start: tokio::task::JoinHandle<Option<JoinHandle<()>>>) {
    if let Some(thread) = start.await.expect("the start-up task panicked") {
        thread.join().expect("the monitor thread panicked");
    }
}

fn options(host: &Path, warnings: &Warnings) -> StartOptions {
    StartOptions {
        host: HostPaths { dev: host.join("dev"), pci_devices: host.join("sys/bus/pci/devices") },
        boot_id_path: host.join("boot_id"),
        retry_first: Duration::from_millis(5),
        retry_max: Duration::from_millis(40),
        log_every: Duration::from_secs(600),
        no_gpu_recheck: Duration::from_millis(30),
        warnings: Some(warnings.clone()),
        kubelet: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn nvml_that_arrives_late_starts_monitoring_without_a_restart() {
    let host = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(host.path().join("dev")).unwrap();
    std::fs::write(host.path().join("dev/nvidia0"), "").unwrap();
    let warnings = Warnings::default();
    let attempts = Arc::new(AtomicU32::new(0));
    let fake = two_gpus();
    let (tx, rx) = watch::channel(GpuReport::default());
    let stop = CancellationToken::new();
    let cfg = cfg(&host.path().join("state.json"));
    let loader = late_loader(4, fake.clone(), attempts.clone());
    let thread =
        spawn_start(&cfg, Box::new(loader), options(host.path(), &warnings), tx, stop.clone());
    wait_for(&rx, "waiting for the driver", |r| r.state == GpuMonitorState::WaitingForDriver);
    assert!(
        warnings.lines().iter().any(|l| l.starts_with("gpu: waiting for the NVIDIA driver")),
        "{:?}",
        warnings.lines()
    );
    let r = wait_for(&rx, "monitoring", |r| r.monitoring() && r.gpus.len() == 2);
    assert_eq!(r.state, GpuMonitorState::On);
    assert_eq!(attempts.load(Ordering::SeqCst), 5, "four failures, then the load");
    assert!(warnings.lines().is_empty(), "{:?}", warnings.lines());
    // The monitor runs: a failing XID arrives.
    fake.inject_xid(0, 95);
    wait_for(&rx, "GPU 0 failed", |r| health(r, "0") == Some(GpuHealth::Failed));
    stop.cancel();
    finish(thread).await;
}

/// A GPU failed before the agent restarted is failed before NVML answers, and stays failed
/// while NVML does not load (on the driver its failure wedged, it may never): no worker on it is
/// restarted meanwhile, and the Node keeps its taint (`failures_known`).
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_failure_holds_while_nvml_does_not_load() {
    let node = Node::new();
    let fake = two_gpus();
    let a = node.agent(&fake);
    a.wait_for("both sampled", sampled);
    fake.inject_xid(0, 79);
    a.wait_for("GPU 0 failed", |r| health(r, "0") == Some(GpuHealth::Failed));
    let deadline = Instant::now() + LIMIT;
    while !node.state_text().contains(UUID0) {
        assert!(Instant::now() < deadline, "never written: {}", node.state_text());
        std::thread::sleep(Duration::from_millis(5));
    }
    a.stop();

    // The agent restarts; NVML no longer loads.
    let warnings = Warnings::default();
    let (tx, rx) = watch::channel(GpuReport::default());
    let stop = CancellationToken::new();
    let on = GpuConfig { enabled: Switch::On, ..cfg(&node.state_file()) };
    let loader = late_loader(u32::MAX, fake, Arc::new(AtomicU32::new(0)));
    let opts = options(node.dir.path(), &warnings);
    let thread = spawn_start(&on, Box::new(loader), opts, tx, stop.clone());
    let r = wait_for(&rx, "waiting", |r| r.state == GpuMonitorState::WaitingForDriver);
    assert!(r.failures_known(), "{r:#?}");
    assert_eq!(r.node, GpuHealth::Failed, "{:?}", r.node_reasons);
    assert!(worker_on_failed_gpu(&r, Some(&["0".to_string()])));
    assert!(!worker_on_failed_gpu(&r, Some(&["1".to_string()])));
    assert!(r.node_reasons.iter().any(|s| s.contains("kept from before the agent restarted")));
    stop.cancel();
    finish(thread).await;

    // Without a kept failure, nothing is known before NVML answers (as before).
    node.boot("boot-2");
    let (tx, rx) = watch::channel(GpuReport::default());
    let stop = CancellationToken::new();
    let loader = late_loader(u32::MAX, two_gpus(), Arc::new(AtomicU32::new(0)));
    let opts = options(node.dir.path(), &warnings);
    let thread = spawn_start(&on, Box::new(loader), opts, tx, stop.clone());
    let r = wait_for(&rx, "waiting", |r| r.state == GpuMonitorState::WaitingForDriver);
    assert!(!r.failures_known(), "{r:#?}");
    stop.cancel();
    finish(thread).await;
}

/// `gpu.enabled = auto`: GPUs not seen for a while — at start-up, or in the middle of the wait
/// for the driver (a driver reloading takes its device files away) — are no proof that the
/// failed one is fine: the failures kept hold (the Node keeps its taint, the worker stays stood
/// down) until NVML reads the GPUs again.
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_failure_holds_while_the_gpus_are_not_seen() {
    let node = Node::new();
    let fake = two_gpus();
    let a = node.agent(&fake);
    a.wait_for("both sampled", sampled);
    fake.inject_xid(0, 79);
    a.wait_for("written", |_| node.state_text().contains(UUID0));
    a.stop();

    // The agent restarts while no GPU is seen; then one is, but NVML does not load.
    let warnings = Warnings::default();
    let (tx, rx) = watch::channel(GpuReport::default());
    let stop = CancellationToken::new();
    let loader = late_loader(u32::MAX, fake, Arc::new(AtomicU32::new(0)));
    let opts = options(node.dir.path(), &warnings);
    let start = spawn_start(&cfg(&node.state_file()), Box::new(loader), opts, tx, stop.clone());
    let held = |r: &GpuReport| {
        r.failures_known()
            && worker_on_failed_gpu(r, Some(&["0".to_string()]))
            && !worker_on_failed_gpu(r, Some(&["1".to_string()]))
    };
    let r = wait_for(&rx, "no GPU seen", |r| r.state == GpuMonitorState::NoGpu);
    assert!(held(&r), "{r:#?}");
    let dev = node.dir.path().join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("nvidia0"), "").unwrap();
    let r = wait_for(&rx, "waiting", |r| r.state == GpuMonitorState::WaitingForDriver);
    assert!(held(&r), "{r:#?}");
    // The driver reloads: its device files are gone a moment.
    std::fs::remove_file(dev.join("nvidia0")).unwrap();
    let r = wait_for(&rx, "no GPU seen again", |r| r.state == GpuMonitorState::NoGpu);
    assert!(held(&r), "{r:#?}");
    assert_eq!(r.node, GpuHealth::Failed, "{:?}", r.node_reasons);
    stop.cancel();
    finish(start).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_without_gpus_is_not_waited_on_until_one_shows() {
    let host = tempfile::tempdir().unwrap();
    let warnings = Warnings::default();
    let attempts = Arc::new(AtomicU32::new(0));
    let (tx, rx) = watch::channel(GpuReport::default());
    let stop = CancellationToken::new();
    let cfg = cfg(&host.path().join("state.json"));
    let loader = late_loader(0, two_gpus(), attempts.clone());
    let thread =
        spawn_start(&cfg, Box::new(loader), options(host.path(), &warnings), tx, stop.clone());
    wait_for(&rx, "no GPU", |r| r.state == GpuMonitorState::NoGpu);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(attempts.load(Ordering::SeqCst), 0, "NVML is not tried without a GPU");
    assert!(warnings.lines().is_empty(), "no GPU is not a warning");
    // The driver installer ran after all: a PCI NVIDIA 3D controller shows up.
    let pci = host.path().join("sys/bus/pci/devices/0000:00:04.0");
    std::fs::create_dir_all(&pci).unwrap();
    std::fs::write(pci.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(pci.join("class"), "0x030200\n").unwrap();
    wait_for(&rx, "monitoring", |r| r.monitoring() && r.gpus.len() == 2);
    stop.cancel();
    finish(thread).await;

    // `gpu.enabled = on`: the operator says there are GPUs; it waits for the driver instead.
    let host = tempfile::tempdir().unwrap();
    let (tx, rx) = watch::channel(GpuReport::default());
    let stop = CancellationToken::new();
    let on = GpuConfig { enabled: Switch::On, ..cfg.clone() };
    let loader = late_loader(u32::MAX, two_gpus(), Arc::new(AtomicU32::new(0)));
    let thread =
        spawn_start(&on, Box::new(loader), options(host.path(), &warnings), tx, stop.clone());
    wait_for(&rx, "waiting", |r| r.state == GpuMonitorState::WaitingForDriver);
    // `stop` ends the wait promptly.
    stop.cancel();
    finish(thread).await;
}
