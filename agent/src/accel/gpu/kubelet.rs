//! The kubelet's device health beside NVML's (issue 44, item 4): every
//! `gpu.kubelet_health_interval` the node's pods are listed (the same `list` the idle check
//! makes, one node's pods) and the GPUs the kubelet reports `Unhealthy` to them published to the
//! GPU monitor, which fails a GPU newly reported (`policy_kubelet::hear`) and keeps that failure
//! as an XID's: everything that reads GPU health follows (the Node's taint and condition, the
//! DRA device taint, the `gpu-failed` page, the metrics, the restart policy). On the executor,
//! apart from the monitor's thread: a slow API server never holds NVML's reports back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::accel::gpu::model::GpuReport;
use crate::accel::gpu::monitor::Throttled;
use crate::accel::gpu::policy_kubelet::KubeletReport;
use crate::kube::device_taints::KubeDeviceTaints;
use crate::kube::podresources::gpu_id;
use crate::kube::pods::{NodePod, PodApi, PodError};

/// The GPUs of these pods the kubelet reports `Unhealthy`, sorted: device-plugin GPUs
/// (`nvidia.com/…` resources whose ids name a whole GPU), and the devices of DRA claims
/// (`claim:<claim>/<request>`, named `<driver>/<pool>/<device>`: [`resolve`] finds their GPU). A
/// pod that has ended holds nothing.
pub(crate) fn reports_of(pods: &[NodePod]) -> Vec<KubeletReport> {
    let mut out = Vec::new();
    for p in pods.iter().filter(|p| !p.terminal()) {
        for d in &p.unhealthy {
            let plugin = d.resource.starts_with("nvidia.com/");
            let dra = d.resource.starts_with("claim:") && dra_id(&d.device).is_some();
            let device = if plugin { gpu_id(&d.device) } else { dra.then(|| d.device.clone()) };
            let Some(device) = device else { continue };
            let (container, resource) = (d.container.clone(), d.resource.clone());
            out.push(KubeletReport { device, pod: p.display(), container, resource });
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A DRA device's id as the kubelet reports it: (driver, pool, device). The driver is a DNS
/// subdomain and the device a DNS label (no `/` in either); a pool name may hold `/`.
fn dra_id(id: &str) -> Option<(&str, &str, &str)> {
    let (driver, rest) = id.split_once('/')?;
    let (pool, device) = rest.rsplit_once('/')?;
    (!driver.is_empty() && !pool.is_empty() && !device.is_empty()).then_some((driver, pool, device))
}

/// The reports with each DRA device replaced by its GPU's UUID, from this node's ResourceSlices
/// (the device's `uuid` attribute; a MIG device's `parentUUID`: its GPU). Without a client for
/// the slices (`gpu.device_taints` off), or for a device no slice lists, the report is left out:
/// never a guessed GPU. A driver's slices that cannot be read leave out its devices' reports
/// only (the error is the caller's to say; the device plugin's reports stand).
pub(crate) async fn resolve(
    reports: Vec<KubeletReport>,
    slices: Option<&KubeDeviceTaints>,
    node: &str,
) -> (Vec<KubeletReport>, Option<PodError>) {
    let mut error = None;
    let mut out = Vec::with_capacity(reports.len());
    let mut listed: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for r in reports {
        if !r.resource.starts_with("claim:") {
            out.push(r);
            continue;
        }
        let (Some(api), Some((driver, pool, name))) = (slices, dra_id(&r.device)) else { continue };
        if !listed.contains_key(driver) {
            let devices = api.devices(node, driver).await.unwrap_or_else(|e| {
                error = Some(e);
                Vec::new()
            });
            listed.insert(driver.to_string(), devices);
        }
        // NB: `get`, not an index (no panic path), though the driver's devices are listed by now.
        let mut listed_here = listed.get(driver).into_iter().flatten();
        let device = listed_here.find(|d| d.pool == pool && d.name == name);
        if let Some(uuid) = device.and_then(|d| d.parent_uuid.clone().or_else(|| d.uuid.clone())) {
            out.push(KubeletReport { device: uuid, ..r });
        }
    }
    out.sort();
    out.dedup();
    (out, error)
}

/// Publish on `tx` the GPUs the kubelet reports `Unhealthy` on this node, reading its pods
/// every `every` (not while NVML lists no GPU: nothing to match; at once when it first lists
/// some). A failed read keeps the last word (logged once a minute): an API server that is briefly
/// away neither fails nor heals a GPU.
pub async fn follow(
    mut nvml: watch::Receiver<GpuReport>,
    tx: watch::Sender<Vec<KubeletReport>>,
    pods: Arc<dyn PodApi>,
    slices: Option<Arc<KubeDeviceTaints>>,
    node: String,
    every: Duration,
    stop: CancellationToken,
) {
    let (mut errors, mut slice_errors) = (Throttled::default(), Throttled::default());
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut read = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = nvml.changed() => {
                let Ok(()) = changed else { return };
                // The first GPUs listed (NVML loads after the agent starts): read at once
                // rather than an interval later.
                if !read && !nvml.borrow_and_update().gpus.is_empty() {
                    tick.reset_immediately();
                }
            }
            _ = tick.tick() => {
                if nvml.borrow().gpus.is_empty() {
                    continue;
                }
                read = true;
                let listed = pods.node_pods(&node).await.inspect_err(|e| {
                    errors.warn("cannot list the node's pods: the kubelet's device health last read stands", e)
                });
                let Ok(list) = listed else { continue };
                errors.ok("the node's pods are readable again: the kubelet's device health is read");
                let (next, error) = resolve(reports_of(&list), slices.as_deref(), &node).await;
                match error {
                    Some(e) => slice_errors.warn("cannot read the node's ResourceSlices: a DRA claim's device the kubelet reports Unhealthy is not matched to its GPU", &e),
                    None => slice_errors.ok("the node's ResourceSlices are readable again"),
                }
                let said = tx.borrow().clone();
                if next != said {
                    log_change(&said, &next);
                    tx.send_replace(next);
                }
            }
        }
    }
}

/// One line for each GPU the kubelet begins or stops calling `Unhealthy`.
fn log_change(was: &[KubeletReport], now: &[KubeletReport]) {
    for r in now.iter().filter(|r| !was.contains(r)) {
        tracing::warn!(gpu = %r.device, pod = %r.pod, container = %r.container,
            "the kubelet reports GPU {} Unhealthy to pod {}: the GPU is failed until it is reset", r.device, r.pod);
    }
    for r in was.iter().filter(|r| !now.contains(r)) {
        tracing::info!(gpu = %r.device, pod = %r.pod,
            "the kubelet no longer reports GPU {} Unhealthy to pod {}", r.device, r.pod);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn pod(name: &str, phase: &str, devices: serde_json::Value) -> NodePod {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "ml", "name": name},
            "status": {"phase": phase, "containerStatuses": [{
                "name": "main", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "allocatedResourcesStatus": devices,
            }]}
        }))
        .unwrap();
        NodePod::from_pod(&p)
    }

    #[test]
    fn only_unhealthy_gpus_of_live_pods_are_reported() {
        let devices = json!([
            {"name": "nvidia.com/gpu", "resources": [
                {"resourceID": "GPU-aaaa", "health": "Healthy"},
                {"resourceID": "GPU-bbbb::2", "health": "Unhealthy"},
                {"resourceID": "nvidia3", "health": "Unknown"}]},
            {"name": "google.com/tpu", "resources": [{"resourceID": "0", "health": "Unhealthy"}]},
            {"name": "claim:gpu/req", "resources": [{"resourceID": "gpu.nvidia.com/n/gpu-1", "health": "Unhealthy"}]},
        ]);
        let pods =
            [pod("trainer-0", "Running", devices.clone()), pod("done", "Succeeded", devices)];
        let got = reports_of(&pods);
        let report = |device: &str, resource: &str| KubeletReport {
            device: device.into(),
            pod: "ml/trainer-0".into(),
            container: "main".into(),
            resource: resource.into(),
        };
        assert_eq!(
            got,
            [
                report("GPU-bbbb", "nvidia.com/gpu"),
                report("gpu.nvidia.com/n/gpu-1", "claim:gpu/req"),
            ],
            "a time-slicing replica names its GPU, a DRA claim its device; Healthy, Unknown, TPUs and ended pods are not reports"
        );
        assert_eq!(
            dra_id("gpu.nvidia.com/pool/a/gpu-1"),
            Some(("gpu.nvidia.com", "pool/a", "gpu-1")),
            "a pool name may hold /"
        );
        assert_eq!(dra_id("gpu-1"), None);
    }
}
