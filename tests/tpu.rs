//! TPU health through the running monitor and controller: a fake device tree in a temp dir (the
//! chips' `/dev/vfio/N` files, their PCI functions with AER counters in a fake sysfs, a kernel
//! log file of `/dev/kmsg` records, an uptime file) drives the real `FsProbe` and TPU monitor;
//! the expected chip count is the Node's allocatable `google.com/tpu`, read from the fake API
//! server as the kubelet wrote it; the controller writes the Node there over real HTTP. The Node's
//! label, condition and Events follow the tree as it changes.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::fake_kube::{label, FakeKube};
use common::fakes::{FakeRuntime, RecordingSink};
use common::real::poll;
use common::wiring::{memory_coordinator, node_config, trail_decisions};
use k8s_openapi::api::core::v1::Node;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use vigil::accel::tpu::chips::FsProbe;
use vigil::accel::tpu::model::TpuReport;
use vigil::accel::tpu::monitor::run_monitor;
use vigil::accel::tpu::policy::allocatable_chips;
use vigil::alerts::{AlertKind, Notifier};
use vigil::coord::Keys;
use vigil::cycle::agent::Agent;
use vigil::kube::node::KubeNodeApi;
use vigil::metrics::Metrics;
use vigil::node::controller::Controller;

const NODE: &str = "gke-tpu-v5e-1";
/// The kernel's clock in the fake uptime file, and the timestamp of every record written.
const UPTIME_S: u64 = 5_000;
const CHIPS: [&str; 4] = ["0000:00:04.0", "0000:00:05.0", "0000:00:06.0", "0000:00:07.0"];

/// A TPU v5e host as the agent's container sees it: four VFIO groups, four Google PCI functions
/// (device 0x0063) with AER statistics, an empty kernel log.
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree { dir };
        std::fs::create_dir_all(t.dev().join("vfio")).unwrap();
        std::fs::write(t.dev().join("vfio/vfio"), "").unwrap();
        for (i, addr) in CHIPS.iter().enumerate() {
            std::fs::write(t.dev().join(format!("vfio/{i}")), "").unwrap();
            let f = t.sys().join("bus/pci/devices").join(addr);
            std::fs::create_dir_all(&f).unwrap();
            std::fs::write(f.join("vendor"), "0x1ae0\n").unwrap();
            std::fs::write(f.join("device"), "0x0063\n").unwrap();
            t.set_aer(addr, 0);
        }
        std::fs::write(t.kmsg(), "").unwrap();
        std::fs::write(t.uptime(), format!("{UPTIME_S}.00 1.00\n")).unwrap();
        t
    }
    fn dev(&self) -> PathBuf {
        self.dir.path().join("dev")
    }
    fn sys(&self) -> PathBuf {
        self.dir.path().join("sys")
    }
    fn kmsg(&self) -> PathBuf {
        self.dir.path().join("kmsg")
    }
    fn uptime(&self) -> PathBuf {
        self.dir.path().join("uptime")
    }
    fn set_aer(&self, addr: &str, fatal: u64) {
        let f = self.sys().join("bus/pci/devices").join(addr);
        let text = format!("Undefined 0\nDLP 0\nTOTAL_ERR_FATAL {fatal}\n");
        std::fs::write(f.join("aer_dev_fatal"), text).unwrap();
        std::fs::write(f.join("aer_dev_nonfatal"), "Undefined 0\nTOTAL_ERR_NONFATAL 0\n").unwrap();
    }
    /// Appends one `/dev/kmsg` record (with its dictionary) stamped now on the kernel's clock.
    fn kernel(&self, level: u8, text: &str, dict: &[&str]) {
        let mut f = std::fs::OpenOptions::new().append(true).open(self.kmsg()).unwrap();
        let mut record = format!("{level},{},{},-;{text}\n", rand_seq(), UPTIME_S * 1_000_000);
        for kv in dict {
            record.push_str(&format!(" {kv}\n"));
        }
        f.write_all(record.as_bytes()).unwrap();
    }
}

fn rand_seq() -> u64 {
    rand::random::<u32>() as u64
}

fn condition(node: &Value, kind: &str) -> Value {
    node["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind).cloned())
        .unwrap_or(Value::Null)
}

/// The Node's allocatable `google.com/tpu`, read from the API server as any client reads it.
async fn allocatable(url: &str) -> Option<u32> {
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let node = kube::Api::<Node>::all(client).get(NODE).await.unwrap();
    let q = node.status?.allocatable?.get("google.com/tpu")?.0.clone();
    allocatable_chips(&q)
}

/// Wait until the Node shows TPU health `want` in its `tpu-health` label and in the reason of
/// its `VigilTPUUnhealthy` condition (two writes: the metadata, then the status); the Node as
/// it then is.
async fn until_label(fake: &FakeKube, want: &str) -> Value {
    let reason = format!("{}{}", want[..1].to_uppercase(), &want[1..]);
    let seen = poll(Duration::from_secs(15), || {
        let node = fake.node();
        let shown = label(&node, "vigil.dev/tpu-health").as_deref() == Some(want)
            && condition(&node, "VigilTPUUnhealthy")["reason"] == reason.as_str();
        async move { shown.then_some(node) }
    })
    .await;
    seen.unwrap_or_else(|| panic!("TPU health never became {want}: {:#}", fake.node()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_follows_the_tpu_tree() {
    let fake = FakeKube::start(NODE).await;
    // The kubelet advertises four chips.
    fake.status_write(json!({"status": {
        "capacity": {"google.com/tpu": "4"},
        "allocatable": {"google.com/tpu": "4"}
    }}));
    let tree = Tree::new();

    let mut cfg = node_config(NODE);
    cfg.tpu.sample_interval = Duration::from_secs(1);
    cfg.tpu.taint_on_failure = true;
    let coord = memory_coordinator();
    let runtime = FakeRuntime::default();
    let metrics = Arc::new(Metrics::new());
    let sink = RecordingSink::default();
    let notifier = || Notifier::new(Some(Arc::new(sink.clone())), metrics.clone());
    let agent = Agent::new(
        cfg.clone(),
        coord.clone(),
        Arc::new(runtime.clone()),
        notifier(),
        metrics.clone(),
    );
    let keys: Keys = agent.keys().clone();

    let (expected_tx, expected_rx) = watch::channel(allocatable(&fake.url).await);
    assert_eq!(*expected_rx.borrow(), Some(4));
    let (tpu_tx, tpu_rx) = watch::channel(TpuReport::default());
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let probe = FsProbe::new(tree.dev(), tree.sys(), Some(&tree.kmsg()), tree.uptime());
    tokio::spawn(run_monitor(probe, cfg.tpu.clone(), expected_rx, tpu_tx, stop.clone()));
    let api = KubeNodeApi::from_url(&fake.url).unwrap();
    let controller = Controller::new(
        cfg.clone(),
        coord.clone(),
        Arc::new(runtime),
        metrics.clone(),
        agent.trail(),
    )
    .with_node_api(Arc::new(api))
    .with_tpu(tpu_rx)
    .with_notifier(notifier());
    let (_meta_tx, meta_rx) = watch::channel(Default::default());
    // The tpu overlay turns GPU monitoring off: the monitor says so at once.
    let (_gpu_tx, gpu_rx) = watch::channel(vigil::accel::gpu::model::GpuReport {
        state: vigil::accel::gpu::model::GpuMonitorState::Off,
        ..Default::default()
    });
    tokio::spawn(controller.run(meta_rx, gpu_rx, CancellationToken::new(), stop.clone()));

    // All four chips: healthy; the retired condition is gone, the new GPU one has taken its place.
    let node = until_label(&fake, "healthy").await;
    let c = condition(&node, "VigilTPUUnhealthy");
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("Healthy")));
    assert!(
        c["message"].as_str().unwrap().contains("4 chip(s) present, allocatable google.com/tpu 4"),
        "{c}"
    );
    assert_eq!(condition(&node, "VigilGPUUnhealthy")["status"], "Unknown");
    assert_eq!(condition(&node, "Ready")["status"], "True", "kubelet's condition untouched");

    // A chip disappears: failed, tainted, an Event, an alert, a trail entry.
    std::fs::remove_file(tree.dev().join("vfio/3")).unwrap();
    let node = until_label(&fake, "failed").await;
    let c = condition(&node, "VigilTPUUnhealthy");
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("True"), Some("Failed")));
    assert!(c["message"].as_str().unwrap().contains("3 of 4 TPU chips have a device file"), "{c}");
    let taints: Vec<String> = common::fake_kube::taint_keys(&node);
    assert!(taints.contains(&"vigil.dev/tpu-failed".to_string()), "{taints:?}");
    let failed_event = poll(Duration::from_secs(5), || {
        let events = fake.events();
        async move { events.into_iter().find(|e| e["reason"] == "VigilTpuFailed") }
    })
    .await
    .expect("a VigilTpuFailed Event");
    assert_eq!(failed_event["type"], "Warning");
    assert_eq!(sink.count(AlertKind::TpuFailed), 1);
    assert!(trail_decisions(coord.as_ref(), &keys).await.contains(&"tpu-health".to_string()));

    // It comes back: healthy again, untainted.
    std::fs::write(tree.dev().join("vfio/3"), "").unwrap();
    let node = until_label(&fake, "healthy").await;
    assert!(!common::fake_kube::taint_keys(&node).contains(&"vigil.dev/tpu-failed".to_string()));

    // The kernel reports a non-fatal PCIe error on a chip: degraded (still False).
    tree.kernel(
        3,
        "vfio-pci 0000:00:05.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, (Requester ID)",
        &["SUBSYSTEM=pci", "DEVICE=+pci:0000:00:05.0"],
    );
    let node = until_label(&fake, "degraded").await;
    let c = condition(&node, "VigilTPUUnhealthy");
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("Degraded")));
    assert!(vigil_annotation(&node).contains("error device error(s) on 0000:00:05.0"), "{node:#}");

    // A fatal AER count on another chip: failed.
    tree.set_aer(CHIPS[2], 1);
    let node = until_label(&fake, "failed").await;
    assert!(vigil_annotation(&node).contains("fatal device error(s) on 0000:00:06.0"), "{node:#}");

    // The kubelet now advertises three chips (the device plugin holds one back): the monitor
    // hears it at once, and the reasons say so.
    fake.status_write(json!({"status": {"allocatable": {"google.com/tpu": "3"}}}));
    expected_tx.send_replace(allocatable(&fake.url).await);
    let seen = poll(Duration::from_secs(15), || {
        let node = fake.node();
        async move {
            let m = condition(&node, "VigilTPUUnhealthy")["message"].as_str()?.to_string();
            m.contains("allocatable google.com/tpu 3").then_some(m)
        }
    })
    .await;
    let message = seen.expect("the condition follows the allocatable");
    assert!(message.contains("the Node advertises 3 google.com/tpu"), "{message}");

    let metrics_text = metrics.encode();
    assert!(
        common::has_sample(&metrics_text, "vigil_tpu_chips{kind=\"expected\"} 3"),
        "{metrics_text}"
    );
    assert!(common::has_sample(
        &metrics_text,
        "vigil_tpu_device_errors_total{severity=\"fatal\"} 1"
    ));
}

fn vigil_annotation(node: &Value) -> String {
    node["metadata"]["annotations"]["vigil.dev/tpu-health-reasons"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Not a TPU node (no chip, nothing advertised): no label, no condition — and an earlier
/// verdict is taken off.
#[tokio::test]
async fn a_node_without_tpus_carries_no_tpu_fields() {
    let fake = FakeKube::start(NODE).await;
    fake.foreign_write(json!({"metadata": {"labels": {"vigil.dev/tpu-health": "healthy"}}}));
    fake.status_write(json!({"status": {"conditions": [
        {"type": "VigilTPUUnhealthy", "status": "False", "reason": "Healthy"}
    ]}}));
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("dev")).unwrap();
    let cfg = node_config(NODE);
    let (_expected_tx, expected_rx) = watch::channel(None);
    let (tpu_tx, tpu_rx) = watch::channel(TpuReport::default());
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let probe = FsProbe::new(dir.path().join("dev"), dir.path(), None, Path::new("/none"));
    tokio::spawn(run_monitor(probe, cfg.tpu.clone(), expected_rx, tpu_tx, stop.clone()));
    let metrics = Arc::new(Metrics::new());
    let coord = memory_coordinator();
    let runtime = Arc::new(FakeRuntime::default());
    let notifier = Notifier::new(None, metrics.clone());
    let agent = Agent::new(cfg.clone(), coord.clone(), runtime.clone(), notifier, metrics.clone());
    let controller = Controller::new(cfg.clone(), coord, runtime, metrics, agent.trail())
        .with_node_api(Arc::new(KubeNodeApi::from_url(&fake.url).unwrap()))
        .with_tpu(tpu_rx);
    let (_meta_tx, meta_rx) = watch::channel(Default::default());
    let (_gpu_tx, gpu_rx) = watch::channel(Default::default());
    tokio::spawn(controller.run(meta_rx, gpu_rx, CancellationToken::new(), stop.clone()));
    let gone = poll(Duration::from_secs(10), || {
        let node = fake.node();
        async move {
            (label(&node, "vigil.dev/tpu-health").is_none()
                && condition(&node, "VigilTPUUnhealthy").is_null()
                && !condition(&node, "VigilMaintenance").is_null())
            .then_some(())
        }
    })
    .await;
    assert!(gone.is_some(), "{:#}", fake.node());
}

/// An agent restarting on a TPU node leaves its TPU label and condition as they are until its
/// monitor has read the chips: no flap of the condition (and of its transition time) at every
/// restart.
#[tokio::test]
async fn a_restarting_agent_leaves_the_tpu_fields_until_its_first_reading() {
    let fake = FakeKube::start(NODE).await;
    fake.foreign_write(json!({"metadata": {"labels": {"vigil.dev/tpu-health": "failed"}}}));
    fake.status_write(json!({"status": {"conditions": [
        {"type": "VigilTPUUnhealthy", "status": "True", "reason": "Failed",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]}}));
    let cfg = node_config(NODE);
    let metrics = Arc::new(Metrics::new());
    let coord = memory_coordinator();
    let runtime = Arc::new(FakeRuntime::default());
    let agent = Agent::new(
        cfg.clone(),
        coord.clone(),
        runtime.clone(),
        Notifier::new(None, metrics.clone()),
        metrics.clone(),
    );
    // The monitor has not reported yet.
    let (_tpu_tx, tpu_rx) = watch::channel(TpuReport::default());
    let controller = Controller::new(cfg, coord, runtime, metrics, agent.trail())
        .with_node_api(Arc::new(KubeNodeApi::from_url(&fake.url).unwrap()))
        .with_tpu(tpu_rx);
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let (_meta_tx, meta_rx) = watch::channel(Default::default());
    let (_gpu_tx, gpu_rx) = watch::channel(Default::default());
    tokio::spawn(controller.run(meta_rx, gpu_rx, CancellationToken::new(), stop.clone()));
    let written = poll(Duration::from_secs(10), || {
        let node = fake.node();
        async move { (!condition(&node, "VigilMaintenance").is_null()).then_some(node) }
    })
    .await
    .expect("the controller's first write");
    assert_eq!(label(&written, "vigil.dev/tpu-health").as_deref(), Some("failed"));
    let c = condition(&written, "VigilTPUUnhealthy");
    assert_eq!(c["lastTransitionTime"], "2026-01-01T00:00:00Z", "{c}");
}

/// A hung worker on a host whose TPU failed (a chip's device file gone) is alerted, never
/// restarted: it needs every chip of its host. Once the chip is back, the same hang is
/// restarted as usual.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_worker_on_a_failed_tpu_is_alerted_never_restarted() {
    use common::wiring::write_record;

    use vigil::accel::tpu::model::TpuHealth;
    use vigil::hang::policy::Verdict;

    let tree = Tree::new();
    let mut cfg = node_config(NODE);
    cfg.tpu.sample_interval = Duration::from_secs(1);
    cfg.policy.stale_after = Duration::from_millis(300);
    cfg.policy.confirm_after = Duration::from_millis(20);
    cfg.policy.restart_delay = Duration::from_millis(50);
    let coord = memory_coordinator();
    let runtime = FakeRuntime::default();
    runtime.add("c0", "trainer-0");
    let metrics = Arc::new(Metrics::new());
    let sink = RecordingSink::default();
    let (expected_tx, expected_rx) = watch::channel(Some(4));
    let _expected = expected_tx;
    let (tpu_tx, tpu_rx) = watch::channel(TpuReport::default());
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let probe = FsProbe::new(tree.dev(), tree.sys(), Some(&tree.kmsg()), tree.uptime());
    tokio::spawn(run_monitor(probe, cfg.tpu.clone(), expected_rx, tpu_tx, stop.clone()));
    let mut agent = Agent::new(
        cfg.clone(),
        coord.clone(),
        Arc::new(runtime.clone()),
        Notifier::new(Some(Arc::new(sink.clone())), metrics.clone()),
        metrics.clone(),
    )
    .with_tpu(tpu_rx.clone());
    let keys = agent.keys().clone();
    let health = |rx: &watch::Receiver<TpuReport>| rx.borrow().health;

    // A chip disappears: the TPU fails.
    std::fs::remove_file(tree.dev().join("vfio/3")).unwrap();
    assert!(
        common::real::eventually(Duration::from_secs(5), || health(&tpu_rx) == TpuHealth::Failed)
            .await
    );
    let now = coord.time().await.unwrap();
    let key = keys.status("trainer-0");
    write_record(coord.as_ref(), &key, "processing", now - 10_000, &[]).await;
    let mut last = Vec::new();
    for _ in 0..15 {
        last = agent.cycle().await.verdicts;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(runtime.restarts("c0"), 0, "a restart cannot fix hardware");
    assert_eq!(last, vec![("trainer-0".to_string(), Verdict::TpuFailed)]);
    assert_eq!(sink.count(AlertKind::TpuFailed), 1, "one alert for the episode");

    // The chip is back: healthy again, and the same hang is restarted.
    std::fs::write(tree.dev().join("vfio/3"), "").unwrap();
    assert!(
        common::real::eventually(Duration::from_secs(5), || health(&tpu_rx) == TpuHealth::Healthy)
            .await
    );
    for _ in 0..25 {
        agent.cycle().await;
        if runtime.restarts("c0") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(runtime.restarts("c0"), 1, "a healthy TPU's hung worker is restarted");
}
