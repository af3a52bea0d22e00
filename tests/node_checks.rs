//! `vigil doctor` and `vigil explain`, run as an operator runs them, against the fake Kubernetes
//! API server (and the fake kubelet's PodResources API): whether the checkpoint budgets fit this
//! node's worker pods (their `terminationGracePeriodSeconds`, read with a `spec.nodeName` field
//! selector), and whether each witness of the opportunistic idle check answers.

use crate::common;

use std::path::{Path, PathBuf};

use common::fake_kube::fake_pods::pod_json;
use common::fake_kube::FakeKube;
use common::fake_podresources::FakePodResources;
use common::real::{shared_redis_url, unique, vigil};
use serde_json::{json, Value};

/// A worker pod of `node` with this grace period (`None`: left to the API's default, 30 s).
fn worker_pod(name: &str, node: &str, grace: Option<u64>) -> Value {
    let mut p = pod_json("ml", name, node, &[("vigil.worker", name)], &[]);
    if let Some(g) = grace {
        p["spec"]["terminationGracePeriodSeconds"] = json!(g);
    }
    p
}

struct Rig {
    kube: FakeKube,
    node: String,
    dir: tempfile::TempDir,
}

impl Rig {
    async fn new() -> Rig {
        let node = unique("gpu-node-");
        let kube = FakeKube::start(&node).await;
        // Two worker pods on this node: one with a short grace, one with the API's default.
        kube.put_pod(worker_pod("trainer-0", &node, Some(10)));
        kube.put_pod(worker_pod("trainer-1", &node, None));
        // Not workers of this node: no opt-in label; another node's; a finished one.
        let mut other = pod_json("web", "frontend", &node, &[], &[]);
        other["spec"]["terminationGracePeriodSeconds"] = json!(1);
        kube.put_pod(other);
        kube.put_pod(worker_pod("elsewhere", "other-node", Some(1)));
        let mut done = worker_pod("finished", &node, Some(1));
        done["status"]["phase"] = json!("Succeeded");
        kube.put_pod(done);
        Rig { kube, node, dir: tempfile::tempdir().unwrap() }
    }

    /// A config file for this node; `extra` is appended (TOML tables).
    fn config(&self, extra: &str) -> PathBuf {
        self.config_with(extra, "")
    }

    /// [`Rig::config`], with `runtime` (keys) in the `[runtime]` table.
    fn config_with(&self, extra: &str, runtime: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{}.toml", unique("c")));
        let text = format!(
            r#"node_name = "{node}"
[docker]
host = "unix:///nonexistent/docker.sock"
[runtime]
kind = "docker"
{runtime}
[metadata]
enabled = "off"
[kubernetes]
enabled = "on"
api_url = "{url}"
{extra}"#,
            node = self.node,
            url = self.kube.url,
        );
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// Run `vigil ARGS --config CFG` off the test's runtime (the fakes serve on it).
async fn run(args: &[&str], cfg: &Path, envs: &[(&str, &str)]) -> (i32, String) {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--config".to_string(), cfg.to_str().unwrap().to_string()]);
    let envs: Vec<(String, String)> =
        envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (code, out, err) = vigil(&args, &envs);
        (code, format!("{out}{err}"))
    })
    .await
    .unwrap()
}

/// The doctor lines of check `name`.
fn lines_of<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.split_whitespace().nth(1) == Some(name)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_says_which_worker_pod_a_budget_does_not_fit() {
    let r = Rig::new().await;
    // The defaults: 25 s budgets, 5 s to stop.
    let (_, out) = run(&["doctor"], &r.config(""), &[]).await;
    let budget = lines_of(&out, "budget");
    let all = budget.join("\n");
    assert!(budget.iter().all(|l| l.starts_with("warn")), "{out}");
    assert!(
        all.contains("[pod-grace] checkpoint.preemption_budget + checkpoint.worker_stop = 30s but worker pod ml/trainer-0 is killed 10s after its SIGTERM")
            && all.contains("[pod-grace] checkpoint.sigterm_budget + checkpoint.worker_stop = 30s but worker pod ml/trainer-0"),
        "{all}"
    );
    assert!(
        all.contains("[gke-node-shutdown] checkpoint.preemption_budget + checkpoint.worker_stop = 30s but on a GKE Spot/preemptible node the kubelet gives non-system pod ml/trainer-1 at most 15s"),
        "{all}"
    );
    assert!(
        all.contains("2 worker pod(s) read, shortest terminationGracePeriodSeconds 10s"),
        "{all}"
    );
    for not_a_worker in ["frontend", "elsewhere", "finished"] {
        assert!(!all.contains(not_a_worker), "{not_a_worker}: {all}");
    }
    assert!(lines_of(&out, "rbac:pods")[0].starts_with("ok"), "{out}");

    // Budgets that fit: one ok line.
    let fits = r.config(
        "[checkpoint]\npreemption_budget = \"5s\"\nsigterm_budget = \"5s\"\nworker_stop = \"5s\"",
    );
    let (_, out) = run(&["doctor"], &fits, &[]).await;
    let budget = lines_of(&out, "budget");
    assert_eq!(budget.len(), 1, "{out}");
    assert!(
        budget[0].starts_with("ok") && budget[0].contains("fits: 2 worker pod(s) read"),
        "{out}"
    );

    // Past GCE's own notices, whatever the pods.
    let past = r.config(
        "[checkpoint]\ngrace = \"60s\"\npreemption_budget = \"28s\"\nmaintenance_budget = \"58s\"",
    );
    let (_, out) = run(&["doctor"], &past, &[]).await;
    let all = lines_of(&out, "budget").join("\n");
    assert!(all.contains("[preemption-notice]") && all.contains("[maintenance-notice]"), "{all}");

    // GKE's label says the node is on-demand: no preemption comes, so its limits are not
    // checked; the SIGTERM budget still meets each worker pod's grace.
    r.kube.foreign_write(json!({"metadata": {"labels": {
        "cloud.google.com/gke-provisioning": "standard"
    }}}));
    let (_, out) = run(&["doctor"], &r.config(""), &[]).await;
    let all = lines_of(&out, "budget").join("\n");
    assert!(
        !all.contains("[gke-node-shutdown]") && !all.contains("checkpoint.preemption_budget"),
        "{all}"
    );
    assert!(
        all.contains("[pod-grace] checkpoint.sigterm_budget + checkpoint.worker_stop = 30s but worker pod ml/trainer-0")
            && all.contains("provisioning standard (no preemption: its limits are not checked)"),
        "{all}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_says_when_the_pods_cannot_be_read() {
    let r = Rig::new().await;
    r.kube.forbid("list pods");
    let (code, out) = run(&["doctor"], &r.config(""), &[]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        lines_of(&out, "rbac:pods")[0].starts_with("FAIL")
            && lines_of(&out, "rbac:pods")[0].contains("may NOT list pods"),
        "{out}"
    );
    let budget = lines_of(&out, "budget").join("\n");
    assert!(
        budget.contains("worker pods' grace periods unknown (forbidden: the agent's ServiceAccount needs `list` on `pods`"),
        "{budget}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_ends_with_whether_the_budgets_fit_the_nodes_worker_pods() {
    let r = Rig::new().await;
    let redis = shared_redis_url();
    let cfg = r.config(&format!("[redis]\nkey_prefix = \"{}\"", unique("ex")));
    let (code, out) = run(&["explain", &r.node], &cfg, &[("REDIS_URL", &redis)]).await;
    assert_eq!(code, 0, "{out}");
    let tail = &out[out.find("checkpoint budget:").expect("a budget section")..];
    assert!(
        tail.starts_with("checkpoint budget: CANNOT be met (2 worker pod(s) read, shortest terminationGracePeriodSeconds 10s; checkpoint.worker_stop = 5s)"),
        "{tail}"
    );
    assert!(tail.contains("  [pod-grace] ") && tail.contains("  [gke-node-shutdown] "), "{tail}");
    // Off Kubernetes only GCE's notices are checked, and it says so.
    let off = r.config(&format!(
        "[redis]\nkey_prefix = \"{}\"\n[worker_api]\nauth = \"none\"",
        unique("ex")
    ));
    let text = std::fs::read_to_string(&off)
        .unwrap()
        .replace("enabled = \"on\"\napi_url", "enabled = \"off\"\napi_url");
    std::fs::write(&off, text).unwrap();
    let (code, out) = run(&["explain", &r.node], &off, &[("REDIS_URL", &redis)]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("checkpoint budget: fits (checked against Compute Engine's notices only (not on Kubernetes: no worker pod read)"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_asks_each_witness_of_the_idle_check() {
    let r = Rig::new().await;
    r.kube.put_pod(pod_json("team", "train", &r.node, &[], &[("nvidia.com/gpu", "1")]));
    let kubelet = FakePodResources::start().await;
    kubelet.set_gpu_pod("team", "train", "main", &["nvidia0"]);
    let cfg = r.config_with(
        &format!(
            "[opportunistic]\nenabled = true\n[fleet]\npool = \"p\"\n[redis]\nurl = \"{}\"\n[gpu]\nenabled = \"off\"",
            shared_redis_url()
        ),
        &format!("pod_resources_socket = \"{}\"", kubelet.socket_str()),
    );
    let (_, out) = run(&["doctor"], &cfg, &[]).await;
    let pods = lines_of(&out, "idle:pods");
    assert!(
        pods[0].starts_with("ok") && pods[0].contains("requesting accelerators: team/train"),
        "{out}"
    );
    let kubelet_line = lines_of(&out, "idle:pod-res");
    assert!(
        kubelet_line[0].starts_with("ok")
            && kubelet_line[0].contains("pods holding accelerators: team/train"),
        "{out}"
    );
    assert!(lines_of(&out, "idle:nvml")[0].contains("not a witness (gpu.enabled = off)"), "{out}");

    // Witnesses that cannot answer: warned, with what that means.
    r.kube.forbid("list pods");
    kubelet.refuse(true);
    let (_, out) = run(&["doctor"], &cfg, &[]).await;
    for name in ["idle:pods", "idle:pod-res"] {
        let l = lines_of(&out, name)[0];
        assert!(
            l.starts_with("warn") && l.contains("until it answers the node never counts as idle"),
            "{out}"
        );
    }
}
