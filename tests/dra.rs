//! A failed GPU as a DRA device taint (issue 44, item 4; `gpu.device_taints`): the production
//! client (`vigil::kube::device_taints`) over real HTTP against the fake API server's
//! `resource.k8s.io` (ResourceSlices, DeviceTaintRules validated as the API validates them);
//! and the whole path — the fake NVML under the real monitor thread, XID 79 on one of two GPUs,
//! the running Node controller — tainting that device only, never the Node, and untainting it
//! when the GPU is reset. And the kubelet's word (`allocatedResourcesStatus`,
//! `vigil::accel::gpu::kubelet`): a GPU the kubelet reports `Unhealthy` to a pod is failed —
//! its device tainted, the Node showing it — until it is reset.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::fake_gpu::FakeGpu;
use common::fake_kube::FakeKube;
use common::fleet::Fleet;
use common::real::eventually_every;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use vigil::accel::gpu::model::GpuReport;
use vigil::accel::gpu::monitor::{spawn_monitor, spawn_monitor_with};
use vigil::kube::device_taints::{reconcile, KubeDeviceTaints};
use vigil::kube::pods::PodError;

const NODE: &str = "gpu-1";
const DRIVER: &str = "gpu.nvidia.com";

/// This node's ResourceSlice as NVIDIA's DRA driver publishes it: `gpu-<index>`, pool the node,
/// the GPU's UUID as the `uuid` attribute.
fn slice(uuids: &[&str]) -> Value {
    let devices: Vec<Value> = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| json!({"name": format!("gpu-{i}"), "attributes": {"uuid": {"string": u}, "index": {"int": i}}}))
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceSlice",
        "metadata": {"name": format!("{NODE}-gpu.nvidia.com-abcde")},
        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    })
}

async fn client(kube: &FakeKube) -> KubeDeviceTaints {
    KubeDeviceTaints::connect(&kube.url, "v1beta2").await.unwrap()
}

#[tokio::test]
async fn a_failed_gpu_is_one_rule_for_its_device_and_goes_when_it_recovers() {
    let kube = FakeKube::start(NODE).await;
    kube.put_slice(slice(&["GPU-aaaa", "GPU-bbbb"]));
    // Another node's slice, and another driver's: never matched.
    let mut other = slice(&["GPU-bbbb"]);
    other["spec"]["nodeName"] = json!("gpu-2");
    kube.put_slice(other);
    let api = client(&kube).await;
    let failed = vec!["GPU-bbbb".to_string()];
    let plan = reconcile(&api, NODE, DRIVER, &failed, false).await.unwrap();
    assert_eq!(plan.create.len(), 1);
    let rules = kube.taint_rules();
    assert_eq!(rules.len(), 1);
    let r = &rules[0];
    let name = r["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("vigil-gpu-1-gpu-1-"), "{name}");
    assert_eq!(r["metadata"]["labels"]["vigil.dev/node"], NODE);
    assert_eq!(r["metadata"]["annotations"]["vigil.dev/gpu"], "GPU-bbbb");
    assert_eq!(
        r["spec"]["deviceSelector"],
        json!({"driver": DRIVER, "pool": NODE, "device": "gpu-1"})
    );
    assert_eq!(r["spec"]["taint"]["effect"], "NoSchedule");
    assert_eq!(r["spec"]["taint"]["key"], "vigil.dev/gpu-failed");
    assert!(r["spec"]["taint"]["timeAdded"].is_string(), "set by the server");
    // The same failure again: nothing written.
    let again = reconcile(&api, NODE, DRIVER, &failed, false).await.unwrap();
    assert!(again.create.is_empty() && again.delete.is_empty());
    let posts = kube
        .requests()
        .iter()
        .filter(|(m, p, _)| m == "POST" && p.ends_with("/devicetaintrules"))
        .count();
    assert_eq!(posts, 1);
    // Recovered: the rule goes; an empty list reads no slices.
    let healed = reconcile(&api, NODE, DRIVER, &[], false).await.unwrap();
    assert_eq!(healed.delete, [name]);
    assert!(kube.taint_rules().is_empty());
}

/// A rule of that name that is not this node's is said, never taken for ours; a Node's name
/// too long for a label value is hashed (its rules still listed and removed); a cluster that
/// serves the rules at `v1alpha3` lists its slices at `v1beta1`.
#[tokio::test]
async fn names_taken_long_node_names_and_the_alpha_api_are_handled() {
    use vigil::vocab::device_taint::{rule_name, Device};
    let kube = FakeKube::start(NODE).await;
    kube.put_slice(slice(&["GPU-aaaa"]));
    let api = client(&kube).await;
    let device = Device {
        driver: DRIVER.into(),
        pool: NODE.into(),
        name: "gpu-0".into(),
        uuid: Some("GPU-aaaa".into()),
        parent_uuid: None,
    };
    kube.put_taint_rule(json!({
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name(NODE, &device), "labels": {"team": "infra"}},
        "spec": {"deviceSelector": {"driver": DRIVER}, "taint": {"key": "infra/hold", "effect": "NoSchedule"}}
    }));
    let failed = vec!["GPU-aaaa".to_string()];
    let err = reconcile(&api, NODE, DRIVER, &failed, false).await.unwrap_err();
    assert!(
        matches!(err, PodError::Taken(_)) && err.to_string().contains("is not this node's"),
        "{err}"
    );

    let long = format!("{}-{}", "n".repeat(100), NODE);
    let mut s = slice(&["GPU-bbbb"]);
    s["spec"]["nodeName"] = json!(long);
    s["spec"]["pool"]["name"] = json!(long);
    kube.put_slice(s);
    let failed = vec!["GPU-bbbb".to_string()];
    reconcile(&api, &long, DRIVER, &failed, false).await.unwrap();
    let mine: Vec<Value> = kube
        .taint_rules()
        .into_iter()
        .filter(|r| r["metadata"]["annotations"]["vigil.dev/node-name"] == long.as_str())
        .collect();
    assert_eq!(mine.len(), 1);
    let label = mine[0]["metadata"]["labels"]["vigil.dev/node"].as_str().unwrap();
    assert!(label.starts_with("h-") && label.len() <= 63, "{label}");
    let healed = reconcile(&api, &long, DRIVER, &[], false).await.unwrap();
    assert_eq!(healed.delete.len(), 1, "listed by the hashed label, and removed");

    let alpha = KubeDeviceTaints::connect(&kube.url, "v1alpha3").await.unwrap();
    assert_eq!(alpha.devices(NODE, DRIVER).await.unwrap().len(), 1);
    let asked: Vec<String> = kube.requests().into_iter().map(|(_, p, _)| p).collect();
    assert!(
        asked.contains(&"/apis/resource.k8s.io/v1beta1/resourceslices".to_string()),
        "{asked:?}"
    );
}

#[tokio::test]
async fn observe_mode_shows_the_taint_and_a_gpu_no_device_stands_for_is_said() {
    let kube = FakeKube::start(NODE).await;
    kube.put_slice(slice(&["GPU-aaaa"]));
    let api = client(&kube).await;
    let failed = vec!["GPU-aaaa".to_string(), "GPU-zzzz".to_string()];
    let plan = reconcile(&api, NODE, DRIVER, &failed, true).await.unwrap();
    assert_eq!(plan.unmatched, ["GPU-zzzz"], "never a guessed device");
    let rules = kube.taint_rules();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["spec"]["taint"]["effect"], "None", "observe mode");
}

#[tokio::test]
async fn a_missing_rule_or_version_is_an_error_naming_it() {
    let kube = FakeKube::start(NODE).await;
    kube.put_slice(slice(&["GPU-aaaa"]));
    kube.forbid("create devicetaintrules");
    let api = client(&kube).await;
    let failed = vec!["GPU-aaaa".to_string()];
    let err = reconcile(&api, NODE, DRIVER, &failed, false).await.unwrap_err();
    assert!(
        matches!(err, PodError::Forbidden { verb: "create", resource: "devicetaintrules", .. }),
        "{err}"
    );
    // A version the cluster does not serve.
    let old = KubeDeviceTaints::connect(&kube.url, "v9").await.unwrap();
    assert!(old.rules(NODE).await.is_err());
    // The fake refuses what the API would: an effect that is no DRA taint effect (authorized
    // first, as the server does).
    kube.allow("create devicetaintrules");
    let bad = reqwest::Client::new()
        .post(format!("{}/apis/resource.k8s.io/v1beta2/devicetaintrules", kube.url))
        .json(&json!({"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
                      "metadata": {"name": "x"}, "spec": {"deviceSelector": {"driver": DRIVER},
                      "taint": {"key": "a/b", "effect": "PreferNoSchedule"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 422);
}

/// The fake holds a rule to Kubernetes' own schema of its version (vendored): what Vigil writes
/// passes it at every version that serves DeviceTaintRule, and the schema refuses what the API
/// would (a required field missing, a field it does not have, a wrong type).
#[tokio::test]
async fn the_rules_vigil_writes_pass_the_apis_own_schema_at_every_version() {
    let kube = FakeKube::start(NODE).await;
    kube.put_slice(slice(&["GPU-aaaa"]));
    let failed = vec!["GPU-aaaa".to_string()];
    for version in ["v1alpha3", "v1beta2", "v1"] {
        let api = KubeDeviceTaints::connect(&kube.url, version).await.unwrap();
        let plan = reconcile(&api, NODE, DRIVER, &failed, false).await;
        assert_eq!(plan.unwrap().create.len(), 1, "{version}");
        assert_eq!(kube.taint_rules().len(), 1, "{version}");
        reconcile(&api, NODE, DRIVER, &[], false).await.unwrap();
        assert!(kube.taint_rules().is_empty(), "{version}");
    }
    let post = |rule: Value| {
        let url = format!("{}/apis/resource.k8s.io/v1beta2/devicetaintrules", kube.url);
        async move {
            let r = reqwest::Client::new().post(url).json(&rule).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let rule = |taint: Value| {
        json!({"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
               "metadata": {"name": "x"}, "spec": {"deviceSelector": {"driver": DRIVER}, "taint": taint}})
    };
    let (code, body) = post(rule(json!({"effect": "NoSchedule"}))).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("spec.taint.key: Required value"), "{body}");
    let (code, body) =
        post(rule(json!({"key": "a/b", "effect": "NoSchedule", "colour": "red"}))).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("spec.taint.colour: strict decoding error: unknown field"), "{body}");
    let (code, body) = post(rule(json!({"key": "a/b", "effect": 1}))).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("spec.taint.effect: must be of type string"), "{body}");
    let mut wrong_version = rule(json!({"key": "a/b", "effect": "NoSchedule"}));
    wrong_version["apiVersion"] = json!("resource.k8s.io/v1");
    assert_eq!(post(wrong_version).await.0, 400);
    let (code, body) = post(rule(json!({"key": "a/b", "effect": "NoSchedule"}))).await;
    assert_eq!(code, 201, "{body}");
}

/// The whole path: XID 79 on GPU-bbbb fails it; the running controller taints its device and
/// not the Node (with `gpu.taint_on_failure` on too: the device taint is instead); a GPU reset
/// ends the failure and the rule goes.
#[tokio::test]
async fn the_controller_taints_a_failed_gpus_device_not_the_node() {
    let kube = FakeKube::start(NODE).await;
    kube.put_slice(slice(&["GPU-aaaa", "GPU-bbbb"]));
    let (node, gpu, _running) = controller_on(&kube).await;
    let (limit, every) = (Duration::from_secs(5), Duration::from_millis(20));
    gpu.inject_xid(1, 79);
    // NB: the device's rule is written before the Node: wait for both.
    let shown = || {
        let d = node.node_api.last();
        d.labels.get("vigil.dev/gpu-health").cloned().flatten() == Some("failed".into())
    };
    let tainted = eventually_every(limit, every, || kube.taint_rules().len() == 1 && shown()).await;
    assert!(tainted, "{:?}", kube.taint_rules());
    assert_eq!(kube.taint_rules()[0]["spec"]["deviceSelector"]["device"], "gpu-1");
    let d = node.node_api.last();
    assert!(
        !d.add_taints.iter().any(|t| t.key == "vigil.dev/gpu-failed"),
        "the Node is not tainted: {:?}",
        d.add_taints
    );
    assert_eq!(
        d.labels.get("vigil.dev/gpu-health").cloned().flatten().as_deref(),
        Some("failed"),
        "the Node still shows the GPU's health"
    );
    gpu.reset_gpu(1);
    let untainted = eventually_every(limit, every, || kube.taint_rules().is_empty()).await;
    assert!(untainted, "{:?}", kube.taint_rules());
}

/// A failed GPU no device of the node's slices stands for (the DRA driver's slices not there):
/// the Node taint stands in, rather than nothing at all.
#[tokio::test]
async fn without_its_device_a_failed_gpu_keeps_the_node_taint() {
    let kube = FakeKube::start(NODE).await;
    kube.put_slice(slice(&["GPU-aaaa"]));
    let (node, gpu, _running) = controller_on(&kube).await;
    gpu.inject_xid(1, 79);
    let (limit, every) = (Duration::from_secs(5), Duration::from_millis(20));
    let node_tainted = eventually_every(limit, every, || {
        node.node_api.last().add_taints.iter().any(|t| t.key == "vigil.dev/gpu-failed")
    })
    .await;
    assert!(node_tainted, "{:?}", node.node_api.last());
    assert!(kube.taint_rules().is_empty());
}

/// A GPU NVML finds healthy but the kubelet reports `Unhealthy` to the pod that holds it (the
/// device plugin's own health check, read from the node's pods over real HTTP): failed in
/// Vigil's verdict — its device tainted, the Node's `gpu-health` label `failed` — and kept
/// failed once the pod has gone (else its device would be handed out again), until the GPU is
/// reset. Another node's pod and an ended pod are not heard; a DRA claim's device is matched
/// through the node's ResourceSlices.
#[tokio::test]
async fn a_gpu_the_kubelet_reports_unhealthy_is_failed_until_it_is_reset() {
    let kube = FakeKube::start(NODE).await;
    kube.put_slice(slice(&["GPU-aaaa", "GPU-bbbb"]));
    let trainer = |node: &str, name: &str, gpu: &str, health: &str| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "ml", "name": name},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer"}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "main", "image": "trainer", "imageID": "", "ready": true, "restartCount": 0,
                "allocatedResourcesStatus": [{"name": "nvidia.com/gpu",
                    "resources": [{"resourceID": gpu, "health": health}]}]
            }]}
        })
    };
    // Another node's pod, and an ended pod, name GPU-aaaa: never this node's word.
    kube.put_pod(trainer("gpu-2", "elsewhere", "GPU-aaaa", "Unhealthy"));
    let mut ended = trainer(NODE, "ended", "GPU-aaaa", "Unhealthy");
    ended["status"]["phase"] = json!("Succeeded");
    kube.put_pod(ended);
    kube.put_pod(trainer(NODE, "trainer-0", "GPU-bbbb", "Unhealthy"));
    let (node, gpu, _running) = controller_with(&kube, true).await;
    let (limit, every) = (Duration::from_secs(30), Duration::from_millis(20));
    let health = || node.node_api.last().labels.get("vigil.dev/gpu-health").cloned().flatten();
    // NB: the device's rule is written before the Node: wait for both.
    let tainted = eventually_every(limit, every, || {
        kube.taint_rules().len() == 1 && health().as_deref() == Some("failed")
    })
    .await;
    assert!(tainted, "{:?} {:?}", kube.taint_rules(), health());
    assert_eq!(
        kube.taint_rules()[0]["spec"]["deviceSelector"]["device"],
        "gpu-1",
        "GPU-bbbb's device only"
    );
    let listed = kube.requests().iter().any(|(m, p, _)| m == "GET" && p == "/api/v1/pods");
    assert!(listed, "the node's pods were listed");
    // The pod ends (its status, and the kubelet's word, go with it): the GPU stays failed.
    kube.remove_pod("ml", "trainer-0");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(kube.taint_rules().len(), 1, "kept after the pod");
    assert_eq!(health().as_deref(), Some("failed"));
    // The GPU is reset: the failure ends, the rule goes.
    gpu.reset_gpu(1);
    let healed = eventually_every(limit, every, || {
        kube.taint_rules().is_empty() && health().as_deref() == Some("healthy")
    })
    .await;
    assert!(healed, "{:?} {:?}", kube.taint_rules(), health());

    // A DRA claim's device (`<driver>/<pool>/<device>`): its GPU found in the node's slices.
    let mut claim = trainer(NODE, "trainer-1", "", "Unhealthy");
    claim["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = json!([{
        "name": "claim:gpus/gpu",
        "resources": [{"resourceID": format!("{DRIVER}/{NODE}/gpu-0"), "health": "Unhealthy"}]
    }]);
    kube.put_pod(claim);
    let tainted = eventually_every(limit, every, || {
        let rules = kube.taint_rules();
        let failed = health().as_deref() == Some("failed");
        failed && rules.len() == 1 && rules[0]["spec"]["deviceSelector"]["device"] == "gpu-0"
    })
    .await;
    assert!(tainted, "GPU-aaaa's device: {:?} {:?}", kube.taint_rules(), health());
}

/// Cancels its tokens when dropped: the monitor thread and the controller stop with the test.
struct Running(Vec<CancellationToken>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.iter().for_each(CancellationToken::cancel);
    }
}

/// Node gpu-1 of the fleet harness with device taints on (and `gpu.taint_on_failure`), the
/// fake NVML (GPU 0 `GPU-aaaa`, GPU 1 `GPU-bbbb`) under the real monitor thread, and its
/// running controller, tainting through `kube`.
async fn controller_on(kube: &FakeKube) -> (common::fleet::Node, FakeGpu, Running) {
    controller_with(kube, false).await
}

/// As [`controller_on`]; with `kubelet`, the monitor hears the kubelet's word
/// (`vigil::accel::gpu::kubelet::follow`, listing the fake's pods every 200 ms, at once when NVML
/// first lists GPUs).
async fn controller_with(
    kube: &FakeKube,
    kubelet: bool,
) -> (common::fleet::Node, FakeGpu, Running) {
    let mut fleet = Fleet::builder()
        .node(NODE)
        .system_clock()
        .controllers()
        .unvalidated()
        .config(|_, cfg| {
            cfg.gpu.sample_interval = Duration::from_millis(50);
            cfg.gpu.taint_on_failure = true;
            cfg.gpu.device_taints = true;
            cfg.gpu.call_deadline = Duration::from_secs(2);
        })
        .build();
    let mut node = fleet.nodes.remove(0);
    let gpu = FakeGpu::new();
    gpu.add_gpu(0, "GPU-aaaa");
    gpu.add_gpu(1, "GPU-bbbb");
    let (tx, rx) = tokio::sync::watch::channel(GpuReport::default());
    let stop = CancellationToken::new();
    let cancel = CancellationToken::new();
    let (cfg, probe) = (node.cfg.gpu.clone(), Box::new(gpu.clone()));
    let monitor = if kubelet {
        let pods = vigil::kube::pods::KubePods::connect(&kube.url).await.unwrap();
        let (heard_tx, heard) = tokio::sync::watch::channel(Vec::new());
        let slices = Arc::new(client(kube).await);
        tokio::spawn(vigil::accel::gpu::kubelet::follow(
            rx.clone(),
            heard_tx,
            Arc::new(pods),
            Some(slices),
            NODE.into(),
            Duration::from_millis(200),
            cancel.clone(),
        ));
        spawn_monitor_with(probe, cfg, None, Some(heard), tx, stop.clone())
    } else {
        spawn_monitor(probe, cfg, tx, stop.clone())
    };
    monitor.expect("a monitor thread");
    let api = Arc::new(client(kube).await);
    let controller = node.controller.take().unwrap().with_device_taints(api);
    let (_, meta_rx) = tokio::sync::watch::channel(Default::default());
    tokio::spawn(controller.run(meta_rx, rx, CancellationToken::new(), cancel.clone()));
    (node, gpu, Running(vec![stop, cancel]))
}
