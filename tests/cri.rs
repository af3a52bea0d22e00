//! The restart half of Vigil on a Kubernetes node: the CRI adapter against a real containerd (a
//! private instance, see `common::containerd`), with the test playing kubelet. The agent is the
//! library's, on the in-process coordinator and a fake clock (so a three-minute persistence
//! timer takes no time); the runtime side is real.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::containerd::{Containerd, Kubelet, Pod};
use common::fake_gpu::FakeGpu;
use common::fake_podresources::FakePodResources;
use common::fakes::RecordingSink;
use common::fleet::Fleet;
use common::wiring::{node_config, write_record};
use tokio_util::sync::CancellationToken;
use vigil::accel::gpu::model::{GpuHealth, GpuReport};
use vigil::alerts::{AlertKind, Resolve};
use vigil::clock::{Clock, FakeClock, Millis};
use vigil::coord::{Coordinator, Keys};
use vigil::cycle::agent::Agent;
use vigil::kube::podresources::PodResourcesClient;
use vigil::kube::pods::{PodApi, PodError};
use vigil::metrics::Metrics;
use vigil::runtime::container::Container;
use vigil::runtime::cri::{CriRuntime, CriSettings, POD_NAME_ID, WORKER_CONTAINER_ANNOTATION};
use vigil::runtime::{ContainerRuntime, RuntimeError};
use vigil::vocab::workload::{Remediation, RestartPolicy, Stops, Workload};

const START: Millis = 1_796_083_200_000;
const POLL: Duration = Duration::from_secs(15);
const WORKER: &str = "trainer-0";
/// A worker that writes a line a second (its heartbeat goes to the coordinator, written by the
/// test, so it can "hang" while the process runs on).
const LOOP: &str = "i=0; while true; do i=$((i+1)); echo step $i; sleep 1; done";

/// The pods' restart policies, as the Kubernetes API would answer.
struct Policies(RestartPolicy);

#[async_trait]
impl PodApi for Policies {
    async fn workload(&self, ns: &str, pod: &str, c: &str) -> Result<Option<Workload>, PodError> {
        Ok(Some(Workload::bare(&format!("{ns}/{pod}"), c, self.0)))
    }
    async fn node_pods(&self, _: &str) -> Result<Vec<vigil::kube::pods::NodePod>, PodError> {
        Err(PodError::Unsupported("this test's pods API serves restartPolicy only"))
    }
}

/// The runtime on `ctd`, with a Kubernetes API whose pods all restart Always (kubelet here
/// restarts every container).
fn kubelet_runtime(ctd: &Containerd) -> CriRuntime {
    CriRuntime::new(settings(ctd), Some(Arc::new(Policies(RestartPolicy::Always))))
}

fn settings(ctd: &Containerd) -> CriSettings {
    CriSettings {
        socket: ctd.socket().to_str().unwrap().to_string(),
        worker_label: "vigil.worker".into(),
        checkpoint_annotation: "vigil.checkpoint".into(),
        call_timeout: Duration::from_secs(2),
        allow_pod_replacement: false,
        poll: Duration::from_millis(100),
    }
}

struct Rig {
    clock: FakeClock,
    store: Arc<dyn Coordinator>,
    sink: RecordingSink,
    metrics: Arc<Metrics>,
    agent: Agent,
    keys: Keys,
}

impl Rig {
    /// One node (`gke-node-1`) of the shared fleet harness, its agent on `runtime` (the private
    /// containerd), on the fake clock.
    fn new(runtime: Arc<dyn ContainerRuntime>) -> Rig {
        let mut fleet = Fleet::builder()
            .node("gke-node-1")
            .start_at(START)
            .runtime(runtime)
            .config(|_, cfg| {
                cfg.runtime.restart_timeout = Duration::from_secs(60);
                // NB: longer than the runtime calls' deadline (2 s): the workers ignore SIGTERM,
                // and a deadline shorter than the grace would cut every stop short (issue 16).
                cfg.runtime.stop_grace = Duration::from_secs(4);
                cfg.runtime.call_timeout = Duration::from_secs(2);
            })
            .build();
        let mut node = fleet.nodes.remove(0);
        Rig {
            clock: fleet.clock,
            store: fleet.store,
            sink: fleet.sink,
            metrics: node.metrics,
            agent: node.agents.remove(0),
            keys: node.keys,
        }
    }

    fn now(&self) -> Millis {
        self.clock.now()
    }

    /// The worker's record: processing, last beat at `at`.
    async fn beat_at(&self, at: Millis) {
        let key = self.keys.status(WORKER);
        write_record(self.store.as_ref(), &key, "processing", at, &[]).await;
    }

    async fn tick(&mut self) {
        self.clock.advance(POLL);
        self.agent.cycle().await;
    }

    /// A hang from now: ticks until the restart is due and done (stale 120 s, confirmed, 180 s).
    async fn hang_until_restart_window(&mut self) {
        self.beat_at(self.now()).await;
        for _ in 0..24 {
            self.tick().await;
        }
    }

    async fn decisions(&self) -> Vec<String> {
        common::wiring::trail_decisions(self.store.as_ref(), &self.keys).await
    }

    /// The agent reads the GPU monitor's reports.
    fn with_gpu(mut self, rx: tokio::sync::watch::Receiver<GpuReport>) -> Rig {
        self.agent = self.agent.with_gpu(rx);
        self
    }
}

async fn worker_pod(kubelet: &Kubelet, name: &str) -> Pod {
    kubelet.run_pod(name, &[("vigil.worker", WORKER)], &[], &[("main", LOOP)]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_is_one_stop_and_kubelet_runs_the_next_attempt_with_the_logs_in_the_alert() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let pod = worker_pod(&kubelet, "trainer-a").await;
    // Let the worker write a few lines to its log file.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let runtime = kubelet_runtime(&ctd);
    let mut rig = Rig::new(Arc::new(runtime));
    rig.hang_until_restart_window().await;

    let attempts = kubelet.containers(&pod).await;
    assert_eq!(
        attempts.iter().map(|c| (c.2, c.3)).collect::<Vec<_>>(),
        vec![(0, false), (1, true)],
        "attempt 0 stopped by Vigil, attempt 1 started by kubelet: {attempts:?}"
    );
    let d = rig.decisions().await;
    assert_eq!(d.iter().filter(|x| *x == "restarted").count(), 1, "{d:?}");
    let alerts = rig.sink.0.lock().unwrap().clone();
    let restarting =
        alerts.iter().find(|a| a.kind == AlertKind::Restarting).expect("a restarting alert");
    assert_eq!(restarting.container.as_deref(), Some("default/trainer-a/main"));
    let logs = restarting.logs.clone().unwrap_or_default();
    assert!(logs.contains("stdout step 1"), "CRI log lines, parsed: {logs}");

    // The booting attempt is ours: no second restart through the cooldown, whatever the record.
    for _ in 0..30 {
        rig.tick().await;
    }
    assert_eq!(kubelet.containers(&pod).await.len(), 2, "still one restart");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlabeled_pods_and_other_containers_are_never_touched() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let bystander = kubelet.run_pod("bystander", &[("app", "web")], &[], &[("main", LOOP)]).await;
    // Two containers and no annotation: which one is the worker is ambiguous.
    let two = kubelet
        .run_pod("two", &[("vigil.worker", "trainer-9")], &[], &[("main", LOOP), ("sidecar", LOOP)])
        .await;
    // Two containers, the annotation names the worker's.
    let named = kubelet
        .run_pod(
            "named",
            &[("vigil.worker", WORKER)],
            &[(WORKER_CONTAINER_ANNOTATION, "main")],
            &[("main", LOOP), ("sidecar", LOOP)],
        )
        .await;
    let runtime = kubelet_runtime(&ctd);
    let listed = runtime.list_workers().await.unwrap();
    let names: Vec<_> = listed.iter().map(|c| c.display()).collect();
    assert_eq!(
        names.iter().filter(|n| n.starts_with("default/two/")).count(),
        2,
        "both containers of the unannotated pod claim the worker: {names:?}"
    );
    assert!(names.contains(&"default/named/main".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("bystander") || n == "default/named/sidecar"));

    let mut rig = Rig::new(Arc::new(runtime));
    let key = rig.keys.status("trainer-9");
    write_record(rig.store.as_ref(), &key, "processing", rig.now(), &[]).await;
    rig.hang_until_restart_window().await;
    assert_eq!(
        rig.sink.count(AlertKind::Ambiguous),
        1,
        "one ambiguous alert for the unannotated pod"
    );
    // The named worker was restarted; nothing else was stopped.
    let named_now = kubelet.containers(&named).await;
    assert!(named_now.iter().any(|c| c.1 == "main" && c.2 == 1 && c.3), "{named_now:?}");
    assert!(named_now.iter().any(|c| c.1 == "sidecar" && c.2 == 0 && c.3), "{named_now:?}");
    for pod in [&two, &bystander] {
        let all = kubelet.containers(pod).await;
        assert!(all.iter().all(|c| c.2 == 0 && c.3), "untouched: {all:?}");
    }
    stop.cancel();
}

/// A worker that ends with exit 3 by its own hand when it gets SIGUSR1 (once it said `ready`).
const EXITS_3_ON_USR1: &str = "trap 'exit 3' USR1; echo ready; while true; do sleep 1; done";

/// Container `id` of `pod` (running [`EXITS_3_ON_USR1`]) exits with 3: signalled through the
/// adapter once its trap is set, then waited for.
async fn exit_3(runtime: &CriRuntime, kubelet: &Kubelet, pod: &Pod, id: &str) {
    for _ in 0..100 {
        if runtime.logs(id, 5).await.is_ok_and(|l| l.contains("ready")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    runtime.kill(id, "SIGUSR1").await.expect("the signal reaches the worker");
    for _ in 0..100 {
        if kubelet.containers(pod).await.iter().any(|c| c.0 == id && !c.3) {
            assert_eq!(kubelet.exit(id).await.0, 3, "the worker's own exit code");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{id} did not exit: {:?}", kubelet.containers(pod).await);
}

/// A container that exited 0 is done, not a worker that stopped: an init container that ran
/// (its pod's worker not started yet), a Job's worker that succeeded. Its pod's sandbox stays
/// ready a while, and listed exited it was an `exited` alert at every such pod's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_that_exited_0_is_done_and_not_listed() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let labels = [("vigil.worker", WORKER)];
    let main = "while true; do sleep 1; done";
    let pod =
        kubelet.run_pod("starting", &labels, &[], &[("fetch", "exit 0"), ("main", main)]).await;
    let runtime = kubelet_runtime(&ctd);
    let mut fetched = None;
    for _ in 0..100 {
        fetched = kubelet.containers(&pod).await.into_iter().find(|c| c.1 == "fetch" && !c.3);
        if fetched.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fetched = fetched.expect("fetch exits");
    assert_eq!(kubelet.exit(&fetched.0).await.0, 0);
    let (main_id, _) = kubelet.running(&pod, "main").await.expect("main runs");
    let listed: Vec<_> =
        runtime.list_workers().await.unwrap().into_iter().map(|c| (c.id, c.running)).collect();
    assert_eq!(listed, [(main_id, true)], "the completed container is not listed");
}

/// A worker whose container exited and is not started again (kubelet's back-off, a `Never`
/// pod) is listed exited, not missing: its `exited` page is sent, and its open pages are not
/// resolved as if it were gone. Of a container with several attempts, the newest alone is
/// listed, whatever its state, and it is the older one's successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_worker_is_listed_exited_by_its_newest_attempt_not_gone() {
    let ctd = Containerd::start();
    // No restart loop: a container that exits stays exited.
    let kubelet = Kubelet::new(&ctd);
    let labels = [("vigil.worker", WORKER)];
    let pod = kubelet.run_pod("crashing", &labels, &[], &[("main", EXITS_3_ON_USR1)]).await;
    let runtime = Arc::new(kubelet_runtime(&ctd));
    let mut rig = Rig::new(runtime.clone());
    // No record: `unreachable`, a page open for the worker.
    rig.tick().await;
    rig.tick().await;
    assert_eq!(rig.sink.count(AlertKind::Unreachable), 1, "{:?}", rig.sink.kinds());

    let (first, _) = kubelet.running(&pod, "main").await.expect("attempt 0 runs");
    exit_3(&runtime, &kubelet, &pod, &first).await;
    let listed = runtime.list_workers().await.unwrap();
    let seen: Vec<_> =
        listed.iter().map(|c| (c.id.as_str(), c.worker.as_str(), c.running)).collect();
    assert_eq!(seen, [(first.as_str(), WORKER, false)], "listed exited, not missing");
    rig.tick().await;
    assert_eq!(rig.sink.count(AlertKind::Exited), 1, "{:?}", rig.sink.kinds());
    let resolved = rig.sink.resolved();
    assert!(!resolved.contains(&(WORKER.into(), Resolve::Gone)), "not gone: {resolved:?}");

    // Kubelet's next attempt exits too: it alone speaks for the container.
    let second = kubelet.start_attempt(&pod, "main", 1).await;
    exit_3(&runtime, &kubelet, &pod, &second).await;
    let ids_now: Vec<_> = runtime.list_workers().await.unwrap().into_iter().map(|c| c.id).collect();
    assert_eq!(ids_now, std::slice::from_ref(&second), "the newest attempt only");
    let next = runtime.successor(&listed[0]).await.unwrap();
    assert_eq!(next.map(|c| (c.id, c.running)), Some((second, false)), "exited, not gone");
}

/// A runtime whose log collection takes long enough for kubelet to restart the container on
/// its own: the decision Vigil made is stale by the time of the command.
struct SlowLogs {
    inner: CriRuntime,
    kubelet: Kubelet,
    pod: Pod,
}

#[async_trait]
impl ContainerRuntime for SlowLogs {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn list_workers(&self) -> Result<Vec<Container>, RuntimeError> {
        self.inner.list_workers().await
    }
    async fn inspect(&self, id: &str) -> Result<Option<Container>, RuntimeError> {
        self.inner.inspect(id).await
    }
    async fn logs(&self, id: &str, lines: usize) -> Result<String, RuntimeError> {
        // Meanwhile the container crashes and kubelet starts the next attempt.
        self.kubelet.stop(id).await;
        let mut next = None;
        for _ in 0..100 {
            next = self.kubelet.running(&self.pod, "main").await;
            if next.as_ref().is_some_and(|(_, attempt)| *attempt == 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(next.map(|n| n.1), Some(1), "kubelet started the next attempt");
        self.inner.logs(id, lines).await
    }
    async fn remediation(&self, c: &Container, stops: Stops) -> Remediation {
        self.inner.remediation(c, stops).await
    }
    async fn fail(&self, c: &Container, grace: Duration, whole: bool) -> Result<(), RuntimeError> {
        self.inner.fail(c, grace, whole).await
    }
    async fn restart(&self, c: &Container, grace: Duration) -> Result<(), RuntimeError> {
        self.inner.restart(c, grace).await
    }
    async fn successor(&self, c: &Container) -> Result<Option<Container>, RuntimeError> {
        self.inner.successor(c).await
    }
    async fn kill(&self, id: &str, signal: &str) -> Result<(), RuntimeError> {
        self.inner.kill(id, signal).await
    }
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.inner.ping().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_decision_never_stops_the_new_attempt() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let pod = worker_pod(&kubelet, "trainer-b").await;
    let inner = kubelet_runtime(&ctd);
    let runtime = SlowLogs { inner, kubelet: kubelet.clone(), pod: pod.clone() };
    let mut rig = Rig::new(Arc::new(runtime));
    rig.beat_at(rig.now()).await;
    // Up to the first restart attempt (the log step restarts the container behind Vigil's back).
    for _ in 0..22 {
        rig.tick().await;
    }
    let d = rig.decisions().await;
    assert!(
        d.contains(&"skipped-not-running".to_string()),
        "compare-and-restart refused the stale decision: {d:?}"
    );
    let all = kubelet.containers(&pod).await;
    assert_eq!(
        all.iter().map(|c| (c.2, c.3)).collect::<Vec<_>>(),
        vec![(0, false), (1, true)],
        "attempt 1 (kubelet's) runs, untouched by Vigil: {all:?}"
    );
    assert!(!d.contains(&"restarted".to_string()), "{d:?}");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_restart_policy_never_is_refused_with_a_page() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let pod = worker_pod(&kubelet, "job-once").await;
    let runtime = CriRuntime::new(settings(&ctd), Some(Arc::new(Policies(RestartPolicy::Never))));
    let mut rig = Rig::new(Arc::new(runtime));
    rig.hang_until_restart_window().await;
    for _ in 0..5 {
        rig.tick().await;
    }
    assert_eq!(rig.sink.count(AlertKind::NotRestartable), 1, "one page per incident");
    let page = rig
        .sink
        .0
        .lock()
        .unwrap()
        .iter()
        .find(|a| a.kind == AlertKind::NotRestartable)
        .cloned()
        .unwrap();
    assert!(page.detail.contains("restartPolicy Never"), "{}", page.detail);
    let all = kubelet.containers(&pod).await;
    assert!(all.iter().all(|c| c.2 == 0 && c.3), "never stopped: {all:?}");
    assert_eq!(rig.agent_breaker_used().await, 0, "no breaker unit taken");

    // Without the Kubernetes API the policy is unknown: refused by default too.
    let blind = CriRuntime::new(settings(&ctd), None);
    let c = blind.list_workers().await.unwrap().remove(0);
    let why = blind.remediation(&c, Stops::One).await;
    assert!(
        matches!(&why, Remediation::Refuse(w) if w.contains("Kubernetes API is off")),
        "{why:?}"
    );
    let mut allowed = settings(&ctd);
    allowed.allow_pod_replacement = true;
    let yes = CriRuntime::new(allowed, None);
    assert!(
        matches!(yes.remediation(&c, Stops::One).await, Remediation::InPlace { kill: false, .. }),
        "allow_pod_replacement: stopped as ever, its next attempt awaited"
    );
}

impl Rig {
    async fn agent_breaker_used(&self) -> u64 {
        let day = vigil::clock::utc_day(self.now());
        self.store.counter(&self.keys.breaker(&day)).await.unwrap()
    }
}

/// The node controller of a checkpoint round over `runtime`, its store and its keys.
fn checkpoint_rig(
    runtime: Arc<CriRuntime>,
) -> (Arc<dyn Coordinator>, Keys, vigil::node::controller::Controller) {
    let mut fleet = Fleet::builder()
        .node("gke-node-1")
        .start_at(START)
        .runtime(runtime)
        .controllers()
        .without_alerts()
        .build();
    let mut node = fleet.nodes.remove(0);
    let controller = node.controller.take().expect("built with its controller");
    let (store, keys) = (fleet.store, node.keys);
    (store, keys, controller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_requests_reach_cri_workers_by_record_and_by_signal() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    // This worker traps SIGUSR1 and says so in its log.
    let script = "trap 'echo got-usr1' USR1; while true; do sleep 1; done";
    kubelet
        .run_pod(
            "ckpt-signal",
            &[("vigil.worker", "signal-worker")],
            &[("vigil.checkpoint", "signal:SIGUSR1")],
            &[("main", script)],
        )
        .await;
    kubelet
        .run_pod("ckpt-redis", &[("vigil.worker", "redis-worker")], &[], &[("main", LOOP)])
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let runtime = Arc::new(kubelet_runtime(&ctd));
    let (store, keys, mut controller) = checkpoint_rig(runtime.clone());
    // The redis-method worker acknowledges what it finds in its record; the signal worker's ack
    // is written when its log shows the signal arrived.
    let acker = {
        let (store, keys, runtime) = (store.clone(), keys.clone(), runtime.clone());
        tokio::spawn(async move {
            loop {
                for w in ["redis-worker", "signal-worker"] {
                    let rec = store.hgetall(&keys.status(w)).await.unwrap();
                    let asked = rec.get("checkpoint_request").is_some_and(|r| !r.is_empty());
                    let acked = rec.get("checkpoint_ack").is_some_and(|a| !a.is_empty());
                    let ready = w == "redis-worker" || {
                        let list = runtime.list_workers().await.unwrap();
                        let c = list.iter().find(|c| c.worker == w).unwrap();
                        runtime.logs(&c.id, 50).await.unwrap().contains("got-usr1")
                    };
                    if asked && !acked && ready {
                        let ack =
                            vec![("checkpoint_ack".into(), rec["checkpoint_request"].clone())];
                        store.hset(&keys.status(w), &ack, None).await.unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let results = controller.checkpoint("test", Duration::from_secs(10)).await;
    acker.abort();
    let mut by: Vec<_> =
        results.iter().map(|r| (r.worker.as_str(), r.method, r.outcome.as_str())).collect();
    by.sort();
    assert_eq!(
        by,
        vec![("redis-worker", "record", "acked"), ("signal-worker", "signal", "acked")],
        "{results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_down_is_one_runtime_down_alert_then_recovery() {
    let mut ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    worker_pod(&kubelet, "trainer-c").await;
    let runtime = kubelet_runtime(&ctd);
    let mut rig = Rig::new(Arc::new(runtime));
    rig.beat_at(rig.now()).await;
    rig.tick().await;
    assert!(common::has_sample(&rig.metrics.encode(), "vigil_runtime_up 1"));
    ctd.stop();
    for _ in 0..3 {
        rig.beat_at(rig.now()).await;
        rig.clock.advance(POLL);
        let report = rig.agent.cycle().await;
        assert!(report.runtime_error.is_some(), "{report:?}");
    }
    assert_eq!(rig.sink.count(AlertKind::RuntimeDown), 1, "once per outage");
    assert!(common::has_sample(&rig.metrics.encode(), "vigil_runtime_up 0"));
    ctd.restart();
    let mut recovered = false;
    for _ in 0..50 {
        rig.beat_at(rig.now()).await;
        rig.clock.advance(POLL);
        let report = rig.agent.cycle().await;
        if report.runtime_error.is_none() && !report.verdicts.is_empty() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "the same adapter reconnects: {}", ctd.log());
    assert!(common::has_sample(&rig.metrics.encode(), "vigil_runtime_up 1"));
}

/// A CRI socket that accepts connections and never answers (a wedged containerd): every call
/// is an error within `call_timeout`, never a hang, so the cycle goes on and reports
/// `runtime-down`.
#[tokio::test]
async fn a_cri_socket_that_never_answers_is_an_error_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wedged.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c); // never read, never answered
        }
    });
    let s = CriSettings {
        socket: path.to_str().unwrap().to_string(),
        worker_label: "vigil.worker".into(),
        checkpoint_annotation: "vigil.checkpoint".into(),
        call_timeout: Duration::from_secs(1),
        allow_pod_replacement: false,
        poll: Duration::from_millis(100),
    };
    let rt = CriRuntime::new(s, None);
    for call in ["list", "ping"] {
        let started = std::time::Instant::now();
        let failed = match call {
            "list" => rt.list_workers().await.is_err(),
            _ => rt.ping().await.is_err(),
        };
        assert!(failed, "{call} against a silent socket is an error");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{call} bounded by the call deadline, took {:?}",
            started.elapsed()
        );
    }
    held.abort();
}

/// The CRI adapter reading the workers' GPUs from this (fake) kubelet.
fn with_kubelet_gpus(runtime: CriRuntime, socket: &str) -> CriRuntime {
    runtime.with_devices(Some(Arc::new(PodResourcesClient::new(socket, Duration::from_secs(1)))))
}

fn gpus_by_worker(listed: &[Container]) -> Vec<(String, Option<Vec<String>>)> {
    let mut by: Vec<_> = listed.iter().map(|c| (c.worker.clone(), c.gpus.clone())).collect();
    by.sort();
    by
}

fn ids(ids: &[&str]) -> Option<Vec<String>> {
    Some(ids.iter().map(|i| i.to_string()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_pod_gets_the_gpus_the_kubelet_gave_it() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    for (pod, worker) in [("gpu-a", "trainer-a"), ("gpu-b", "trainer-b"), ("cpu-c", "trainer-c")] {
        kubelet.run_pod(pod, &[("vigil.worker", worker)], &[], &[("main", LOOP)]).await;
    }
    let kr = FakePodResources::start().await;
    // NVIDIA's device plugin: GPUs by UUID (a time-sliced replica of the second one).
    kr.set_gpu_pod("default", "gpu-a", "main", &["GPU-aaaa"]);
    kr.set_pod(
        "default",
        "gpu-b",
        vec![(
            "main",
            vec![
                ("nvidia.com/gpu", vec!["GPU-bbbb::1".into()]),
                ("example.com/nic", vec!["eth1".into()]),
            ],
        )],
    );
    // Listed by the kubelet, given no GPU: unknown, so every GPU.
    kr.set_pod("default", "cpu-c", vec![("main", vec![])]);
    let runtime = with_kubelet_gpus(CriRuntime::new(settings(&ctd), None), &kr.socket_str());
    let listed = runtime.list_workers().await.unwrap();
    assert_eq!(
        gpus_by_worker(&listed),
        vec![
            ("trainer-a".into(), ids(&["GPU-aaaa"])),
            ("trainer-b".into(), ids(&["GPU-bbbb"])),
            ("trainer-c".into(), None),
        ]
    );
    let a = listed.iter().find(|c| c.worker == "trainer-a").unwrap();
    let inspected = runtime.inspect(&a.id).await.unwrap().unwrap();
    assert_eq!(inspected.gpus, ids(&["GPU-aaaa"]), "inspect agrees");
    assert!(kr.calls() >= 2);

    // Without the kubelet's API every worker counts as on every GPU, as before.
    let blind = CriRuntime::new(settings(&ctd), None);
    let listed = blind.list_workers().await.unwrap();
    assert!(listed.iter().all(|c| c.gpus.is_none()), "{listed:?}");
}

/// An absent socket, a kubelet that refuses, one that never answers: the listing goes on, within
/// the deadline, with every worker on every GPU (a failed GPU then stands all down); the GPUs
/// come back when the kubelet does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_kubelet_answer_every_worker_counts_as_on_every_gpu() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    worker_pod(&kubelet, "gpu-a").await;
    let absent = with_kubelet_gpus(
        CriRuntime::new(settings(&ctd), None),
        "/nonexistent/pod-resources/kubelet.sock",
    );
    let listed = absent.list_workers().await.unwrap();
    assert_eq!(gpus_by_worker(&listed), vec![(WORKER.into(), None)]);

    let kr = FakePodResources::start().await;
    kr.set_gpu_pod("default", "gpu-a", "main", &["nvidia3"]);
    let runtime = with_kubelet_gpus(CriRuntime::new(settings(&ctd), None), &kr.socket_str());
    assert_eq!(
        gpus_by_worker(&runtime.list_workers().await.unwrap()),
        vec![(WORKER.into(), ids(&["nvidia3"]))]
    );
    kr.refuse(true);
    assert_eq!(gpus_by_worker(&runtime.list_workers().await.unwrap()), vec![(WORKER.into(), None)]);
    kr.refuse(false);
    kr.hang(true);
    let started = std::time::Instant::now();
    assert_eq!(gpus_by_worker(&runtime.list_workers().await.unwrap()), vec![(WORKER.into(), None)]);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "bounded by the call's deadline, took {:?}",
        started.elapsed()
    );
    kr.hang(false);
    assert_eq!(
        gpus_by_worker(&runtime.list_workers().await.unwrap()),
        vec![(WORKER.into(), ids(&["nvidia3"]))],
        "read again once the kubelet answers"
    );
}

/// GKE: two worker pods on GPUs `nvidia0` and `nvidia1` (GKE's device plugin ids), the real
/// GPU monitor on fake NVML. GPU 0 fails (XID 79) and both workers hang: the worker on GPU 0 is
/// left alone (a restart cannot fix hardware), the one on GPU 1 is restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_gpu_stands_down_only_the_worker_on_it() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let on0 =
        kubelet.run_pod("gke-a", &[("vigil.worker", "trainer-a")], &[], &[("main", LOOP)]).await;
    let on1 =
        kubelet.run_pod("gke-b", &[("vigil.worker", "trainer-b")], &[], &[("main", LOOP)]).await;
    let kr = FakePodResources::start().await;
    kr.set_gpu_pod("default", "gke-a", "main", &["nvidia0"]);
    kr.set_gpu_pod("default", "gke-b", "main", &["nvidia1"]);

    let gpu = FakeGpu::new();
    gpu.add_gpu(0, "GPU-aaaa");
    gpu.add_gpu(1, "GPU-bbbb");
    let mut gcfg = node_config("gke-node-1").gpu;
    gcfg.sample_interval = Duration::from_millis(50);
    let (tx, rx) = tokio::sync::watch::channel(GpuReport::default());
    let gpu_stop = CancellationToken::new();
    vigil::accel::gpu::monitor::spawn_monitor(Box::new(gpu.clone()), gcfg, tx, gpu_stop.clone())
        .expect("a monitor thread");
    gpu.inject_xid(0, 79);
    let failed = |r: &GpuReport| {
        r.gpus.iter().map(|g| (g.index, g.health)).collect::<Vec<_>>()
            == vec![(0, GpuHealth::Failed), (1, GpuHealth::Healthy)]
    };
    let mut seen = false;
    for _ in 0..200 {
        if failed(&rx.borrow()) {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen, "GPU 0 failed: {:?}", *rx.borrow());

    let runtime = kubelet_runtime(&ctd);
    let runtime = with_kubelet_gpus(runtime, &kr.socket_str());
    let mut rig = Rig::new(Arc::new(runtime)).with_gpu(rx);
    for w in ["trainer-a", "trainer-b"] {
        let key = rig.keys.status(w);
        write_record(rig.store.as_ref(), &key, "processing", rig.now(), &[]).await;
    }
    for _ in 0..24 {
        rig.tick().await;
    }
    let d = rig.decisions().await;
    assert_eq!(
        kubelet.containers(&on0).await.iter().map(|c| (c.2, c.3)).collect::<Vec<_>>(),
        vec![(0, true)],
        "the worker on the failed GPU is never stopped: {d:?}"
    );
    assert_eq!(
        kubelet.containers(&on1).await.iter().map(|c| (c.2, c.3)).collect::<Vec<_>>(),
        vec![(0, false), (1, true)],
        "the worker on the healthy GPU is restarted: {d:?}"
    );
    assert_eq!(d.iter().filter(|x| *x == "restarted").count(), 1, "{d:?}");
    gpu_stop.cancel();
    stop.cancel();
}

/// Issue 19: pods of one template share their labels. With the opt-in value `pod-name`, each
/// pod is its own worker (`<namespace>.<name>` the id): a hang of one is restarted, the other is untouched —
/// where two pods with one literal id would be ambiguous and never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_one_template_are_distinct_workers_by_their_names() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let template = [("vigil.worker", POD_NAME_ID), ("app", "trainer")];
    let a = kubelet.run_pod("trainer-7f9c-a", &template, &[], &[("main", LOOP)]).await;
    let b = kubelet.run_pod("trainer-7f9c-b", &template, &[], &[("main", LOOP)]).await;
    let runtime = kubelet_runtime(&ctd);
    let mut ids: Vec<String> =
        runtime.list_workers().await.unwrap().into_iter().map(|c| c.worker).collect();
    ids.sort();
    // Issue 26: with the pod's namespace, so pods of one name in two namespaces stay two.
    assert_eq!(ids, vec!["default.trainer-7f9c-a", "default.trainer-7f9c-b"]);

    let mut rig = Rig::new(Arc::new(runtime));
    // Pod a hangs (one beat, never again); pod b beats every cycle.
    let keys = rig.keys.clone();
    let key = |w: &str| keys.status(w);
    write_record(rig.store.as_ref(), &key("default.trainer-7f9c-a"), "processing", rig.now(), &[])
        .await;
    for _ in 0..24 {
        let (k, now) = (key("default.trainer-7f9c-b"), rig.now());
        write_record(rig.store.as_ref(), &k, "processing", now, &[]).await;
        rig.tick().await;
    }
    let attempts = |p: &Pod| {
        let kubelet = kubelet.clone();
        let p = p.clone();
        async move { kubelet.containers(&p).await.len() }
    };
    assert_eq!(attempts(&a).await, 2, "the hung pod was restarted once");
    assert_eq!(attempts(&b).await, 1, "the healthy pod of the same template is untouched");
    let d = rig.decisions().await;
    assert!(!d.iter().any(|x| x == "ambiguous"), "{d:?}");
    stop.cancel();
}

/// Issue 19: a pod says its restarts belong to another controller with the opt-in label's
/// companion `vigil.worker.restarts: alert-only`; the runtime reports it so, and the agent
/// alerts its hang and never stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_only_pod_is_reported_and_never_stopped() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let labels = [("vigil.worker", WORKER), ("vigil.worker.restarts", "alert-only")];
    let pod = kubelet.run_pod("jobset-0", &labels, &[], &[("main", LOOP)]).await;
    let runtime = kubelet_runtime(&ctd);
    let listed = runtime.list_workers().await.unwrap();
    assert!(listed.iter().all(|c| c.alert_only), "{listed:?}");
    let mut rig = Rig::new(Arc::new(runtime));
    rig.hang_until_restart_window().await;
    assert_eq!(kubelet.containers(&pod).await.len(), 1, "never stopped");
    let d = rig.decisions().await;
    assert_eq!(d.iter().filter(|x| *x == "skipped-alert-only").count(), 1, "{d:?}");
    assert_eq!(rig.sink.count(AlertKind::Hung), 1);
    stop.cancel();
}

/// Issue 19 on GKE's terms: the agent runs on the host network, the worker on the pod network.
/// An HTTP checkpoint method at `http://pod:8080/…` is sent to the pod's IP from its sandbox
/// status (the pod's 127.0.0.1 is not the agent's): the worker's own HTTP server receives the
/// request, with its id, and the worker acknowledges it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_checkpoint_reaches_a_pod_on_the_pod_network_at_its_ip() {
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    // busybox httpd with a CGI that logs the request body to the container's log.
    let script = "mkdir -p /tmp/www/cgi-bin && \
        printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\nbody=$(cat)\\necho \"got-checkpoint $body\" > /proc/1/fd/1\\necho ok\\n' > /tmp/www/cgi-bin/ckpt && \
        chmod +x /tmp/www/cgi-bin/ckpt && httpd -p 8080 -h /tmp/www && \
        while true; do sleep 1; done";
    let pod = kubelet
        .run_pod_on_pod_network(
            "ckpt-http",
            &[("vigil.worker", "http-worker")],
            &[("vigil.checkpoint", "http://pod:8080/cgi-bin/ckpt")],
            &[("main", script)],
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let runtime = Arc::new(kubelet_runtime(&ctd));
    let listed = runtime.list_workers().await.unwrap();
    let method = listed[0].checkpoint.as_ref().map(|m| m.expose().to_string()).unwrap_or_default();
    assert!(
        method.starts_with("http://10.") && method.ends_with(":8080/cgi-bin/ckpt"),
        "the pod's own IP: {method}"
    );
    let (store, keys, mut controller) = checkpoint_rig(runtime.clone());
    // The worker acknowledges once its server has the request.
    let acker = {
        let (store, keys, runtime) = (store.clone(), keys.clone(), runtime.clone());
        tokio::spawn(async move {
            loop {
                let rec = store.hgetall(&keys.status("http-worker")).await.unwrap();
                if let Some(id) = rec.get("checkpoint_request").filter(|r| !r.is_empty()) {
                    let list = runtime.list_workers().await.unwrap();
                    let logs = runtime.logs(&list[0].id, 50).await.unwrap();
                    if logs.contains("got-checkpoint") && logs.contains(id.as_str()) {
                        let ack = vec![("checkpoint_ack".into(), id.clone())];
                        store.hset(&keys.status("http-worker"), &ack, None).await.unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let results = controller.checkpoint("test", Duration::from_secs(10)).await;
    acker.abort();
    let by: Vec<_> =
        results.iter().map(|r| (r.worker.as_str(), r.method, r.outcome.as_str())).collect();
    assert_eq!(by, vec![("http-worker", "http", "acked")], "{results:?}");
    drop(pod);
}
