//! Opportunistic maintenance asks for the host event only when no accelerator is in use: the
//! real maintenance controller's loop, on the real Redis, reading this node's pods from the fake
//! API server (over HTTP, `fieldSelector=spec.nodeName`), the fake kubelet's PodResources API
//! (gRPC on a unix socket) and the fake NVML behind the real GPU monitor thread, and asking GKE
//! through the Node's `cloud.google.com/perform-maintenance` label on the fake API server.
//!
//! The node's one opted-in worker (pod ml/trainer-0, on GPU 0) is idle throughout; what changes
//! is everything else on the node.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::fake_gpu::FakeGpu;
use common::fake_kube::fake_pods::pod_json;
use common::fake_kube::{label, FakeKube};
use common::fake_podresources::FakePodResources;
use common::real::{eventually, shared_redis_url, unique};
use common::wiring::node_config;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use vigil::accel::gpu::model::GpuReport;
use vigil::alerts::Notifier;
use vigil::config::{Config, Switch};
use vigil::coord::redis::RedisCoordinator;
use vigil::coord::{Coordinator, Keys};
use vigil::cycle::agent::Agent;
use vigil::kube::node::KubeNodeApi;
use vigil::kube::podresources::PodResourcesClient;
use vigil::kube::pods::KubePods;
use vigil::maintenance::policy::PERFORM_MAINTENANCE_LABEL;
use vigil::metrics::Metrics;
use vigil::node::controller::Controller;
use vigil::runtime::sim::FakeRuntime;
use vigil::vocab::maintenance::{RawMetadata, UpcomingMaintenance, UpcomingStatus};

const WORKER_LABEL: (&str, &str) = ("vigil.worker", "trainer-0");

struct Rig {
    kube: FakeKube,
    kubelet: FakePodResources,
    gpus: FakeGpu,
    metrics: Arc<Metrics>,
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    node: String,
    stop: CancellationToken,
    /// Kept: dropping it closes the metadata watch.
    _meta: watch::Sender<RawMetadata>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A pending maintenance that can be started early: what opportunistic maintenance acts on.
fn reschedulable() -> RawMetadata {
    RawMetadata {
        upcoming: Some(UpcomingMaintenance {
            status: UpcomingStatus::Pending,
            can_reschedule: true,
            window_start: Some("2099-01-01T00:00:00Z".into()),
            ..UpcomingMaintenance::default()
        }),
        ..RawMetadata::default()
    }
}

fn config(node: &str, kube: &FakeKube, kubelet: &FakePodResources, idle_for: Duration) -> Config {
    let mut cfg = node_config(node);
    cfg.redis.url = shared_redis_url().as_str().into();
    cfg.redis.key_prefix = unique("idle");
    cfg.fleet.pool = "pool-a".into();
    cfg.kubernetes.enabled = Switch::On;
    cfg.kubernetes.api_url = kube.url.clone();
    cfg.runtime.pod_resources_socket = kubelet.socket_str();
    cfg.gpu.enabled = Switch::On;
    cfg.gpu.sample_interval = Duration::from_secs(1);
    cfg.poll_interval = Duration::from_millis(50);
    cfg.opportunistic.enabled = true;
    cfg.opportunistic.idle_for = idle_for;
    cfg.opportunistic.min_nodes = 0;
    cfg.validate().unwrap();
    cfg
}

/// What a test places on the node before the controller starts.
type Before = fn(&str, &FakeKube, &FakePodResources, &FakeGpu);

/// The node with its idle opted-in worker, whatever `before` adds, and the controller running.
async fn rig(idle_for: Duration, before: Before) -> Rig {
    let node = unique("gpu-node-");
    let kube = FakeKube::start(&node).await;
    let kubelet = FakePodResources::start().await;
    let cfg = config(&node, &kube, &kubelet, idle_for);
    // The worker: its pod holds GPU 0 by every account, and its record says idle.
    kube.put_pod(pod_json("ml", "trainer-0", &node, &[WORKER_LABEL], &[("nvidia.com/gpu", "1")]));
    kubelet.set_gpu_pod("ml", "trainer-0", "main", &["nvidia0"]);
    let runtime = FakeRuntime::default();
    runtime.add("c1", "trainer-0");
    runtime.set_kube_pod("c1", "ml", "trainer-0");
    runtime.set_gpus("c1", &["nvidia0"]);
    let gpus = FakeGpu::new();
    gpus.add_gpu(0, "GPU-0");
    gpus.add_gpu(1, "GPU-1");
    // The idle worker keeps its CUDA context: a process on its own GPU is allowed.
    gpus.set_compute_processes(0, Some(1));
    let coord: Arc<dyn Coordinator> =
        Arc::new(RedisCoordinator::new(&shared_redis_url(), Duration::from_secs(2)).unwrap());
    let keys = Keys::new(&cfg.redis.key_prefix, &node);
    coord.hset(&keys.status("trainer-0"), &[("state".into(), "idle".into())], None).await.unwrap();
    let metrics = Arc::new(Metrics::new());
    let agent = Agent::new(
        cfg.clone(),
        coord.clone(),
        Arc::new(runtime.clone()),
        Notifier::new(None, metrics.clone()),
        metrics.clone(),
    );
    let pods = KubePods::connect(&kube.url).await.unwrap();
    let devices = PodResourcesClient::new(&kubelet.socket_str(), Duration::from_secs(2));
    let controller = Controller::new(
        cfg.clone(),
        coord.clone(),
        Arc::new(runtime.clone()),
        metrics.clone(),
        agent.trail(),
    )
    .with_node_api(Arc::new(KubeNodeApi::from_url(&kube.url).unwrap()))
    .with_pod_witnesses(Some(Arc::new(pods)), Some(Arc::new(devices)));
    before(&node, &kube, &kubelet, &gpus);
    let stop = CancellationToken::new();
    let (gpu_tx, gpu_rx) = watch::channel(GpuReport::default());
    vigil::accel::gpu::monitor::spawn_monitor(
        Box::new(gpus.clone()),
        cfg.gpu.clone(),
        gpu_tx,
        stop.child_token(),
    )
    .expect("a monitor thread");
    let (meta_tx, meta_rx) = watch::channel(reschedulable());
    tokio::spawn(controller.run(meta_rx, gpu_rx, stop.child_token(), stop.clone()));
    Rig { kube, kubelet, gpus, metrics, coord, keys, node, stop, _meta: meta_tx }
}

impl Rig {
    /// Whether the node asks GKE to perform the maintenance now.
    fn asked(&self) -> bool {
        label(&self.kube.node(), PERFORM_MAINTENANCE_LABEL).as_deref() == Some("true")
    }

    /// The idle check's current reasons, as `/metrics` shows them.
    fn busy(&self, reason: &str) -> bool {
        let line = format!("vigil_opportunistic_busy{{reason=\"{reason}\"}} 1");
        self.metrics.encode().lines().any(|l| l == line)
    }

    /// The trail's idle-check details, oldest first.
    async fn idle_checks(&self) -> Vec<String> {
        let entries = self.coord.read_recent(&self.keys.trail(), 1000).await.unwrap();
        entries
            .iter()
            .rev()
            .filter(|(_, f)| f["decision"] == "idle-check")
            .map(|(_, f)| f["detail"].clone())
            .collect()
    }

    /// Wait until the trail's last idle check satisfies `ok`; false after [`LIMIT`].
    async fn wait_check(&self, ok: impl Fn(&str) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + LIMIT;
        while tokio::time::Instant::now() < deadline {
            if self.idle_checks().await.last().is_some_and(|d| ok(d)) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Wait until the last idle check found the node idle.
    async fn wait_idle(&self) -> bool {
        self.wait_check(|d| d.starts_with("idle")).await
    }

    fn remove_foreign_job(&self) {
        self.kube.remove_pod("team", "train");
        self.kubelet.remove_pod("team", "train");
        self.gpus.set_compute_processes(1, Some(0));
    }
}

const LIMIT: Duration = Duration::from_secs(15);

/// A training job that never opted in, on GPU 1, by every witness's account.
fn foreign_job(node: &str, kube: &FakeKube, kubelet: &FakePodResources, gpus: &FakeGpu) {
    kube.put_pod(pod_json("team", "train", node, &[], &[("nvidia.com/gpu", "1")]));
    kubelet.set_gpu_pod("team", "train", "main", &["nvidia1"]);
    gpus.set_compute_processes(1, Some(1));
}

/// Nothing besides the idle worker.
fn nothing(_: &str, _: &FakeKube, _: &FakePodResources, _: &FakeGpu) {}

/// No witness but the workers can answer.
fn all_unknown(_: &str, kube: &FakeKube, kubelet: &FakePodResources, gpus: &FakeGpu) {
    kube.forbid("list pods");
    kubelet.refuse(true);
    gpus.set_compute_processes(1, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_job_that_never_opted_in_keeps_the_node_from_asking_and_its_end_lets_it() {
    let r = rig(Duration::from_millis(300), foreign_job).await;
    assert!(
        eventually(LIMIT, || r.busy("accelerator-pod") && r.busy("gpu-compute-process")).await,
        "{}",
        r.metrics.encode()
    );
    // Many idle_for periods and ticks later, still no request.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!r.asked(), "asked GKE to take down a node running a job");
    let checks = r.idle_checks().await;
    let last = checks.last().expect("an idle-check entry in the trail");
    assert!(
        last.contains(
            "accelerator-pod: team/train holds accelerator devices (kubelet PodResources)"
        ) && last.contains("team/train requests accelerators (Kubernetes API)")
            && last.contains("gpu-compute-process: GPU 1 (GPU-1)"),
        "{last}"
    );
    assert!(!last.contains("trainer-0"), "the idle worker's own pod and GPU are allowed: {last}");

    r.remove_foreign_job();
    assert!(eventually(LIMIT, || r.asked()).await, "{}", r.metrics.encode());
    assert!(!r.busy("accelerator-pod") && !r.busy("gpu-compute-process"));
    let checks = r.idle_checks().await;
    assert!(checks.last().unwrap().starts_with("idle"), "{checks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_witness_alone_sees_the_job() {
    // idle_for is long: this test reads the verdict, never the claim.
    let r = rig(Duration::from_secs(3600), nothing).await;
    // Admitted to the node but not started: only the API server knows.
    r.kube.put_pod(pod_json("team", "pending", &r.node, &[], &[("google.com/tpu", "4")]));
    assert!(eventually(LIMIT, || r.busy("accelerator-pod")).await);
    r.kube.remove_pod("team", "pending");
    assert!(eventually(LIMIT, || !r.busy("accelerator-pod")).await);
    // A pod on another node is none of this node's business (the field selector).
    r.kube.put_pod(pod_json("team", "elsewhere", "other-node", &[], &[("nvidia.com/gpu", "8")]));
    // Only the kubelet: a pod the API server no longer lists (deleted there while its containers
    // still run).
    r.kubelet.set_gpu_pod("team", "devs", "main", &["nvidia1"]);
    assert!(eventually(LIMIT, || r.busy("accelerator-pod")).await);
    r.kubelet.remove_pod("team", "devs");
    assert!(eventually(LIMIT, || !r.busy("accelerator-pod")).await);
    // Only NVML: a process on GPU 1 that no pod accounts for (a host process, a privileged pod).
    r.gpus.set_compute_processes(1, Some(2));
    assert!(eventually(LIMIT, || r.busy("gpu-compute-process")).await);
    r.gpus.set_compute_processes(1, Some(0));
    assert!(eventually(LIMIT, || !r.busy("gpu-compute-process")).await);
    assert!(!r.busy("accelerator-pod"), "{}", r.metrics.encode());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_witness_that_cannot_answer_counts_as_busy() {
    let r = rig(Duration::from_millis(200), all_unknown).await;
    assert!(
        eventually(LIMIT, || r.busy("pods-unknown")
            && r.busy("pod-resources-unknown")
            && r.busy("nvml-unknown"))
        .await,
        "{}",
        r.metrics.encode()
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!r.asked(), "unknown was taken for idle");
    let last = r.idle_checks().await.pop().unwrap();
    assert!(
        last.contains("needs `list` on `pods`")
            && last.contains("GPU 1 (GPU-1): compute processes unreadable"),
        "{last}"
    );
    // Every witness answers again, and sees nothing: the node asks.
    r.kube.allow("list pods");
    r.kubelet.refuse(false);
    r.gpus.set_compute_processes(1, Some(0));
    assert!(eventually(LIMIT, || r.asked()).await, "{}", r.metrics.encode());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_that_stops_answering_is_no_answer() {
    let r = rig(Duration::from_secs(3600), nothing).await;
    assert!(r.wait_idle().await, "{:?}", r.idle_checks().await);
    r.gpus.fail_samples(true);
    // After three sampling intervals (1 s here) the last report is no answer.
    assert!(eventually(LIMIT, || r.busy("nvml-unknown")).await);
    let stale =
        |d: &str| d == "not idle: nvml-unknown: no GPU sample in the last 3s (NVML reads failing?)";
    assert!(r.wait_check(stale).await, "{:?}", r.idle_checks().await);
    r.gpus.fail_samples(false);
    assert!(eventually(LIMIT, || !r.busy("nvml-unknown")).await);
    assert!(r.wait_idle().await, "{:?}", r.idle_checks().await);
}
