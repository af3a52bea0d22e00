//! GKE's node labels as sources, end to end: the `vigil` binary against the fake Kubernetes API
//! server (over real HTTP), the real Redis and the real Docker daemon. The Node carries GKE's
//! labels, taints and allocatable resources as GKE and the kubelet write them; the agent must
//! read its pool, provisioning model, accelerator and TPU topology from them with no `fleet.pool`
//! configured, and stand a hung worker's restart down while GKE's maintenance label is up. And
//! in process (the controller's own loop, the Node read and written over HTTP): opportunistic
//! maintenance claims for the pool the Node names, and takes no claim before it is known.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::e2e::{decisions, ConfigParts, Setup};
use common::fake_kube::{self, FakeKube};
use common::real::{
    beat, eventually, explain, poll, shared_redis_url, vigil, VigilProcess, WorkerContainer,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

struct Rig {
    s: Setup,
    kube: FakeKube,
    redis: String,
}

impl Rig {
    async fn new() -> Rig {
        let s = Setup::new("gke");
        Rig { kube: FakeKube::start(&s.node).await, redis: shared_redis_url(), s }
    }

    /// No metadata server (the label source alone), the Node read every second, restarts on, and
    /// no `[fleet]` table at all.
    fn config(&self) -> PathBuf {
        self.s.write_config(ConfigParts {
            tables: &format!(
                r#"[safety]
lock_ttl = "60s"
[metadata]
enabled = "off"
settle = "1s"
[kubernetes]
enabled = "on"
api_url = "{kube}"
read_interval = "1s"
[checkpoint]
maintenance_budget = "1s"
preemption_budget = "1s"
sigterm_budget = "3s"
grace = "8s"
"#,
                kube = self.kube.url,
            ),
            ..ConfigParts::default()
        })
    }

    fn agent(&self, cfg: &Path) -> VigilProcess {
        VigilProcess::spawn(&["run"], cfg, &[("REDIS_URL", &self.redis)])
    }

    /// `vigil status --json`'s record of this node, once it has one.
    fn record(&self, cfg: &Path) -> Option<Value> {
        let (code, out, _) = vigil(
            &["status", "--json", "--config", cfg.to_str().unwrap()],
            &[("REDIS_URL", &self.redis)],
        );
        if code != 0 {
            return None;
        }
        let v: Value = serde_json::from_str(&out).ok()?;
        v["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["node"] == self.s.node.as_str())
            .map(|n| n["record"].clone())
            .filter(|r| !r.is_null())
    }

    fn trail(&self, cfg: &Path) -> String {
        let (_, out, _) =
            explain(cfg, &self.s.node, &["--limit", "300"], &[("REDIS_URL", &self.redis)]);
        out
    }

    fn label(&self, name: &str) -> Option<String> {
        fake_kube::label(&self.kube.node(), name)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_record_carries_the_pool_and_slice_from_the_node_labels_without_fleet_pool() {
    let r = Rig::new().await;
    // GKE's labels on a Spot host of a v5p 2x2x4 slice (16 chips, 4 on each host), and the
    // kubelet's allocatable count.
    r.kube.foreign_write(json!({"metadata": {"labels": {
        "cloud.google.com/gke-nodepool": "tpu-v5p-pool",
        "cloud.google.com/gke-spot": "true",
        "cloud.google.com/gke-provisioning": "spot",
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x4"
    }}}));
    let node = r.kube.kubelet_status(json!({"allocatable": {"google.com/tpu": 4, "cpu": "207"}}));
    assert_eq!(
        node["status"]["allocatable"]["google.com/tpu"], "4",
        "a quantity is stored as a string"
    );
    let cfg = r.config();
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(!text.contains("[fleet]"), "no fleet.pool configured");
    let agent = r.agent(&cfg);
    let rec = poll(Duration::from_secs(20), || async {
        r.record(&cfg).filter(|rec| rec["pool"] == "tpu-v5p-pool")
    })
    .await
    .unwrap_or_else(|| panic!("no record with the label's pool:\n{}", agent.log_text()));
    assert_eq!(rec["slice"], "tpu-v5p-pool", "a multi-host TPU pool is a slice");
    assert_eq!(rec["provisioning"], "spot");
    assert_eq!(rec["accelerator"], "tpu-v5p-slice");
    assert_eq!(rec["tpu_topology"], "2x2x4");
    assert_eq!(rec["maintenance"], "none");
    assert_eq!(rec["maintenance_source"], "");
    // The table shows the same, and the slice summary counts the node under its pool.
    let (code, table, err) =
        vigil(&["status", "--config", cfg.to_str().unwrap()], &[("REDIS_URL", &r.redis)]);
    assert_eq!(code, 0, "{err}");
    let row = table.lines().find(|l| l.starts_with(&r.s.node)).unwrap_or_else(|| panic!("{table}"));
    for cell in ["tpu-v5p-pool", "spot", "tpu-v5p-slice", "2x2x4"] {
        assert!(row.contains(cell), "{cell} missing: {row}");
    }
    // The metric, and the trail's note of what the Node said.
    let metrics = r.s.metrics().await;
    assert!(
        metrics.contains(
            "vigil_node_info{pool=\"tpu-v5p-pool\",provisioning=\"spot\",accelerator=\"tpu-v5p-slice\",tpu_topology=\"2x2x4\"} 1"
        ),
        "{metrics}"
    );
    let trail = r.trail(&cfg);
    assert_eq!(decisions(&trail, "node-info"), 1, "{trail}");
    assert!(trail.contains("pool tpu-v5p-pool (Node label)"), "{trail}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gke_maintenance_label_stands_a_hung_workers_restart_down() {
    let r = Rig::new().await;
    r.kube.foreign_write(json!({"metadata": {"labels": {
        "cloud.google.com/gke-nodepool": "gpu-pool",
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        "cloud.google.com/active-node-maintenance": "ONGOING"
    }}}));
    let cfg = r.config();
    // A hung worker: it ignores SIGTERM, and its record goes stale (2 s) after one beat.
    let worker = WorkerContainer::start(&r.s.label, &r.s.worker);
    let before = worker.started_at();
    let agent = r.agent(&cfg);
    // NB: the worker beats once the label has reached the Node as Vigil's phase: its hang
    // (stale in 2 s, due in ~5 s) must not race the agent's first read of the Node, which a
    // loaded machine can delay that long (the test failed so once).
    assert!(
        eventually(Duration::from_secs(10), || r.label("vigil.dev/maintenance").as_deref()
            == Some("ongoing"))
        .await,
        "GKE's label did not reach the Node as Vigil's phase:\n{}",
        agent.log_text()
    );
    let (code, _, err) = beat(&cfg, &r.s.worker, "processing", &[], &[("REDIS_URL", &r.redis)]);
    assert_eq!(code, 0, "{err}");
    // Stale after 2 s, confirmed and due after ~5 s, the stop grace 3 s: wait well past that.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(
        worker.started_at(),
        before,
        "restarted during GKE's maintenance:\n{}",
        agent.log_text()
    );
    let rec = r.record(&cfg).expect("a record");
    assert_eq!(rec["maintenance"], "ongoing");
    assert_eq!(rec["maintenance_source"], "node-labels");
    assert_eq!(rec["pool"], "gpu-pool");
    assert_eq!(rec["slice"], "", "a GPU pool is no slice");
    assert_eq!(rec["accelerator"], "nvidia-h100-80gb");
    let trail = r.trail(&cfg);
    assert!(!trail.contains("timer-started"), "{trail}");
    assert!(
        trail
            .contains("none → ongoing (reasons: gke-active-node-maintenance; sources: node-labels"),
        "{trail}"
    );
    let metrics = r.s.metrics().await;
    assert!(
        common::has_sample(&metrics, "vigil_maintenance_source{source=\"node-labels\"} 1"),
        "{metrics}"
    );
    // GKE takes its label off: the stand-down ends (after `metadata.settle`, 1 s) and the
    // still-hung worker is restarted: the label, and nothing else, held it.
    r.kube.foreign_write(json!({"metadata": {"labels": {
        "cloud.google.com/active-node-maintenance": null
    }}}));
    assert!(
        eventually(Duration::from_secs(30), || worker.started_at() != before).await,
        "not restarted once the label was gone:\n{}\n{}",
        r.trail(&cfg),
        agent.log_text()
    );
    // NB: the trail's `restarted` follows the new container's start (the restart is verified
    // first): under load, moments later.
    assert!(
        eventually(Duration::from_secs(30), || decisions(&r.trail(&cfg), "restarted") >= 1).await,
        "no restarted entry:\n{}",
        r.trail(&cfg)
    );
    let trail = r.trail(&cfg);
    assert!(trail.contains("ongoing → none"), "{trail}");
}

#[tokio::test(flavor = "multi_thread")]
async fn gke_s_impending_termination_taint_stands_restarts_down_and_reaches_the_node() {
    let r = Rig::new().await;
    r.kube.foreign_write(json!({
        "metadata": {"labels": {"cloud.google.com/gke-nodepool": "spot-pool",
                                "cloud.google.com/gke-spot": "true"}},
        "spec": {"taints": [{"key": "cloud.google.com/impending-node-termination",
                             "effect": "NoSchedule"}]}
    }));
    let cfg = r.config();
    let worker = WorkerContainer::start(&r.s.label, &r.s.worker);
    let before = worker.started_at();
    let agent = r.agent(&cfg);
    let (code, _, err) = beat(&cfg, &r.s.worker, "processing", &[], &[("REDIS_URL", &r.redis)]);
    assert_eq!(code, 0, "{err}");
    assert!(
        eventually(Duration::from_secs(10), || r.label("vigil.dev/maintenance").as_deref()
            == Some("terminating"))
        .await,
        "{}",
        agent.log_text()
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(worker.started_at(), before, "{}", agent.log_text());
    let rec = r.record(&cfg).expect("a record");
    assert_eq!(
        (rec["maintenance"].as_str(), rec["maintenance_source"].as_str()),
        (Some("terminating"), Some("node-labels"))
    );
    assert_eq!(rec["provisioning"], "spot");
    let metrics = r.s.metrics().await;
    assert!(
        common::has_sample(&metrics, "vigil_interruptions_total{type=\"preemption\",reason=\"gke-impending-node-termination\"} 1"),
        "{metrics}"
    );
    // GKE's own taint is GKE's: Vigil adds its own and leaves GKE's exactly as it was.
    let taints = fake_kube::taint_keys(&r.kube.node());
    assert!(
        taints.contains(&"cloud.google.com/impending-node-termination".to_string())
            && taints.contains(&"vigil.dev/termination-imminent".to_string()),
        "{taints:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn opportunistic_maintenance_claims_for_the_pool_the_node_names_and_not_before() {
    use common::fakes::FakeRuntime;
    use common::wiring::{agent_and_controller, memory_coordinator, node_config};
    use std::sync::Arc;
    use vigil::alerts::Notifier;
    use vigil::config::Switch;
    use vigil::coord::Keys;
    use vigil::kube::node::KubeNodeApi;
    use vigil::kube::node_source::KubeNodeReader;
    use vigil::maintenance::policy::PERFORM_MAINTENANCE_LABEL;
    use vigil::metrics::Metrics;
    use vigil::node::controller::SharedFacts;
    use vigil::vocab::maintenance::{RawMetadata, UpcomingMaintenance, UpcomingStatus};

    let kube = FakeKube::start("gpu-1").await;
    let mut cfg = node_config("gpu-1");
    cfg.poll_interval = Duration::from_millis(50);
    cfg.opportunistic.enabled = true;
    cfg.opportunistic.idle_for = Duration::from_millis(10);
    cfg.opportunistic.min_nodes = 0;
    // The idle check's other witnesses: no GPU here (NVML is no witness), no kubelet socket.
    cfg.gpu.enabled = Switch::Off;
    cfg.runtime.pod_resources_socket = String::new();
    // Validation wants the shared Redis for the claim; the test uses the in-process store.
    cfg.redis.url = "redis://127.0.0.1:1".into();
    cfg.kubernetes.enabled = Switch::On;
    cfg.kubernetes.api_url = kube.url.clone();
    assert!(cfg.fleet.pool.is_empty());
    cfg.validate()
        .expect("no fleet.pool needed: the Kubernetes API is on, the pool comes from the Node");
    let coord = memory_coordinator();
    let runtime = FakeRuntime::default();
    runtime.add("c1", "trainer-0");
    let keys = Keys::new("vigil", "gpu-1");
    coord.hset(&keys.status("trainer-0"), &[("state".into(), "idle".into())], None).await.unwrap();
    let metrics = Arc::new(Metrics::new());
    let api = Arc::new(KubeNodeApi::from_url(&kube.url).unwrap());
    let (_agent, controller) = agent_and_controller(
        &cfg,
        &coord,
        &runtime,
        api,
        Notifier::new(None, metrics.clone()),
        &metrics,
        SharedFacts::default(),
    );
    let stop = CancellationToken::new();
    let (node_tx, node_rx) = vigil::node::info::channel();
    let reader = Arc::new(KubeNodeReader::connect(&kube.url).await.unwrap());
    tokio::spawn(vigil::node::info::follow(
        reader,
        "gpu-1".into(),
        Duration::from_millis(100),
        node_tx,
        metrics.clone(),
        stop.clone(),
    ));
    // A rescheduleable maintenance is pending (the metadata server says so).
    let (_meta_tx, meta_rx) = tokio::sync::watch::channel(RawMetadata {
        upcoming: Some(UpcomingMaintenance {
            status: UpcomingStatus::Pending,
            can_reschedule: true,
            ..UpcomingMaintenance::default()
        }),
        ..RawMetadata::default()
    });
    let (_gpu_tx, gpu_rx) = tokio::sync::watch::channel(Default::default());
    // The idle check lists this node's pods (none hold an accelerator here).
    let pods = vigil::kube::pods::KubePods::connect(&kube.url).await.unwrap();
    let controller = controller.with_pod_witnesses(Some(Arc::new(pods)), None);
    tokio::spawn(controller.with_node_info(node_rx, None).run(
        meta_rx,
        gpu_rx,
        CancellationToken::new(),
        stop.clone(),
    ));
    let label = |k: &str| fake_kube::label(&kube.node(), k);
    assert!(
        eventually(Duration::from_secs(5), || label("vigil.dev/maintenance").as_deref()
            == Some("pending"))
        .await
    );
    // The Node has no pool label yet: idle, pending, reschedulable, and still no claim.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(label(PERFORM_MAINTENANCE_LABEL), None, "no pool, no claim");
    let claim_key = |pool: &str| [keys.maintenance_claim(pool)];
    assert_eq!(coord.get_many(&claim_key("")).await.unwrap(), vec![None]);
    // GKE's pool label arrives: the claim is taken for that pool.
    kube.foreign_write(json!({"metadata": {"labels": {
        "cloud.google.com/gke-nodepool": "gpu-pool"
    }}}));
    assert!(
        eventually(Duration::from_secs(5), || label(PERFORM_MAINTENANCE_LABEL).as_deref()
            == Some("true"))
        .await,
        "no claim once the pool was known"
    );
    let held = coord.get_many(&claim_key("gpu-pool")).await.unwrap();
    assert!(held[0].as_deref().is_some_and(|t| t.starts_with("gpu-1:")), "{held:?}");
    stop.cancel();
}

/// Issue 31, item 4: a Node cordoned by someone else (`kubectl drain`, GKE's node auto-repair,
/// an upgrade: each cordons before it drains) stands a hung worker's restart down — a restart
/// would race the drain — and the trail says why, once; uncordoned, the worker is restarted.
#[tokio::test(flavor = "multi_thread")]
async fn a_cordoned_node_stands_restarts_down_and_says_why() {
    let r = Rig::new().await;
    r.kube.foreign_write(json!({
        "spec": {"unschedulable": true,
                 "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}
    }));
    let cfg = r.config();
    let worker = WorkerContainer::start(&r.s.label, &r.s.worker);
    let before = worker.started_at();
    let agent = r.agent(&cfg);
    let (code, _, err) = beat(&cfg, &r.s.worker, "processing", &[], &[("REDIS_URL", &r.redis)]);
    assert_eq!(code, 0, "{err}");
    // Stale after 2 s, confirmed and due after ~5 s: wait well past that.
    assert!(
        eventually(Duration::from_secs(20), || r.trail(&cfg).contains("the node is cordoned"))
            .await,
        "{}\n{}",
        r.trail(&cfg),
        agent.log_text()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(worker.started_at(), before, "{}", agent.log_text());
    let trail = r.trail(&cfg);
    assert_eq!(trail.matches("the node is cordoned").count(), 1, "said once per incident: {trail}");
    assert_eq!(decisions(&trail, "restarted"), 0, "{trail}");
    // Uncordoned (the drain was called off; a JSON merge patch replaces the list).
    r.kube.foreign_write(json!({"spec": {"unschedulable": null, "taints": []}}));
    assert!(
        eventually(Duration::from_secs(30), || worker.started_at() != before).await,
        "not restarted once uncordoned:\n{}\n{}",
        r.trail(&cfg),
        agent.log_text()
    );
}
