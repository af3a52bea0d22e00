//! The kubelet's word on a GPU (pure): a device the kubelet reports `Unhealthy` to a pod that
//! holds it (KEP-4680, `allocatedResourcesStatus`: the device plugin's own health check) is a
//! failed GPU in Vigil's verdict — the Node's taint (or the device's, under DRA), the
//! `gpu-failed` page, `vigil_gpu_health` — beside what NVML says. It is a standing condition,
//! not a kept failure: it lasts while the kubelet says so, and NVML alone never clears it.

use crate::accel::gpu::model::{label, selects, GpuHealth, GpuReport};

/// A device the kubelet reports `Unhealthy` to a container of a pod on this node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeletReport {
    /// The device plugin's id, as a GPU is named (`GPU-…`, `nvidia0`, an index).
    pub device: String,
    /// `namespace/name` of the pod.
    pub pod: String,
    pub container: String,
    /// The resource (`nvidia.com/gpu`).
    pub resource: String,
}

/// `report` with every GPU the kubelet reports `Unhealthy` failed, saying which pod's status
/// says so; the node's verdict and reasons follow. A report naming a GPU NVML does not list is
/// left out (never a guessed GPU).
pub fn with_kubelet(report: &GpuReport, reports: &[KubeletReport]) -> GpuReport {
    let mut next = report.clone();
    if reports.is_empty() {
        return next;
    }
    for g in &mut next.gpus {
        let holders: Vec<String> = reports
            .iter()
            .filter(|r| selects(g, &r.device))
            .map(|r| format!("{} (container {}, {})", r.pod, r.container, r.resource))
            .collect();
        if holders.is_empty() {
            continue;
        }
        g.health = GpuHealth::Failed;
        g.reasons.push(format!(
            "{}: the kubelet reports it Unhealthy to pod {} (the device plugin's health check, allocatedResourcesStatus); it stays failed while the kubelet says so",
            label(g.index, &g.uuid),
            holders.join(", ")
        ));
    }
    next.node = next.gpus.iter().map(|g| g.health).max().unwrap_or_default();
    next.node_reasons = next
        .gpus
        .iter()
        .flat_map(|g| g.reasons.iter().cloned())
        .collect();
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accel::gpu::model::{GpuSample, GpuStatus};

    fn gpu(index: u32, uuid: &str, minor: u32) -> GpuStatus {
        GpuStatus {
            index,
            uuid: uuid.into(),
            sample: GpuSample {
                index,
                uuid: uuid.into(),
                minor_number: Some(minor),
                ..GpuSample::default()
            },
            ..GpuStatus::default()
        }
    }

    fn report() -> GpuReport {
        GpuReport {
            gpus: vec![gpu(0, "GPU-aaaa", 0), gpu(1, "GPU-bbbb", 3)],
            ..GpuReport::default()
        }
    }

    fn said(device: &str) -> KubeletReport {
        KubeletReport {
            device: device.into(),
            pod: "ml/trainer-0".into(),
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
        }
    }

    #[test]
    fn a_gpu_the_kubelet_calls_unhealthy_is_failed_saying_who_said_it() {
        let r = with_kubelet(&report(), &[said("GPU-bbbb")]);
        assert_eq!(r.gpus[0].health, GpuHealth::Healthy);
        assert_eq!(r.gpus[1].health, GpuHealth::Failed);
        assert_eq!(r.node, GpuHealth::Failed);
        let why = &r.node_reasons[0];
        assert!(
            why.starts_with("GPU 1 (GPU-bbbb): the kubelet reports it Unhealthy to pod ml/trainer-0 (container main, nvidia.com/gpu)"),
            "{why}"
        );
        // GKE's device plugin names a GPU by its device file: the minor number, not the index.
        let r = with_kubelet(&report(), &[said("nvidia3")]);
        assert_eq!(r.gpus[1].health, GpuHealth::Failed);
        assert_eq!(r.gpus[0].health, GpuHealth::Healthy);
    }

    #[test]
    fn nothing_said_or_a_gpu_nvml_does_not_list_changes_nothing() {
        assert_eq!(with_kubelet(&report(), &[]), report());
        assert_eq!(with_kubelet(&report(), &[said("GPU-zzzz")]), report());
    }

    #[test]
    fn nvml_reasons_stay_and_the_worst_verdict_wins() {
        let mut prev = report();
        prev.gpus[0].health = GpuHealth::Degraded;
        prev.gpus[0].reasons = vec!["GPU 0 (GPU-aaaa): a row remap is pending".into()];
        let r = with_kubelet(&prev, &[said("GPU-aaaa"), said("0")]);
        assert_eq!(r.gpus[0].health, GpuHealth::Failed);
        assert_eq!(r.gpus[0].reasons.len(), 2, "{:?}", r.gpus[0].reasons);
        assert_eq!(r.node, GpuHealth::Failed);
    }
}
