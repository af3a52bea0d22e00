//! The kubelet's word on a GPU (pure): a device the kubelet newly reports `Unhealthy` to a pod
//! that holds it (KEP-4680, `allocatedResourcesStatus`: the device plugin's own health check)
//! fails the GPU in Vigil's verdict as an XID that calls for a reset does — the Node's taint (or
//! the device's, under DRA), the `gpu-failed` page, `vigil_gpu_health`, no restart on it — and
//! the failure is kept the same way: across agent restarts (`gpu.state_file`) and until the GPU
//! shows it was reset (`crate::accel::gpu::policy::reset_evidence`), not merely until the pod
//! that held it has gone (its status goes with it, and the device would be handed out again).

use crate::accel::gpu::model::{selects, GpuReport};
use crate::accel::gpu::policy::{add_cause, rejudge};
use crate::config::{GpuConfig, XidAction};

/// A device the kubelet reports `Unhealthy` to a container of a pod on this node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeletReport {
    /// The device plugin's id, as a GPU is named (`GPU-…`, `nvidia0`, an index).
    pub device: String,
    /// `namespace/name` of the pod.
    pub pod: String,
    pub container: String,
    /// The resource (`nvidia.com/gpu`, or `claim:<claim>/<request>` under DRA).
    pub resource: String,
}

/// The reports of `now` that `before` did not have: only a report that appears fails a GPU (one
/// still standing after the GPU's reset fails it again only once the kubelet reports it anew).
pub fn new_reports(before: &[KubeletReport], now: &[KubeletReport]) -> Vec<KubeletReport> {
    now.iter().filter(|r| !before.contains(r)).cloned().collect()
}

/// `report` with each GPU that one of `new` names failed, the cause saying which pod's status
/// says so. A report naming a GPU NVML does not list is left out (never a guessed GPU).
pub fn hear(report: &GpuReport, new: &[KubeletReport], cfg: &GpuConfig) -> GpuReport {
    let mut next = report.clone();
    for g in &mut next.gpus {
        // NB: not a filter: the GPU is read to match a report, then written.
        for r in new {
            if selects(g, &r.device) {
                let cause = format!(
                    "the kubelet reports it Unhealthy to pod {} (container {}, {}: the device plugin's health check, allocatedResourcesStatus)",
                    r.pod, r.container, r.resource
                );
                add_cause(g, XidAction::ResetGpu, cause);
            }
        }
    }
    rejudge(&next, cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accel::gpu::model::{GpuHealth, GpuSample};
    use crate::accel::gpu::policy::update;

    fn sample(index: u32, uuid: &str, minor: u32) -> GpuSample {
        GpuSample {
            index,
            uuid: uuid.into(),
            minor_number: Some(minor),
            energy_mj: Some(1_000),
            ..GpuSample::default()
        }
    }

    fn report(cfg: &GpuConfig) -> GpuReport {
        let samples = [sample(0, "GPU-aaaa", 0), sample(1, "GPU-bbbb", 3)];
        update(&GpuReport::default(), &samples, &[], 0, cfg)
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
        let cfg = GpuConfig::default();
        let r = hear(&report(&cfg), &[said("GPU-bbbb")], &cfg);
        assert_eq!(r.gpus[0].health, GpuHealth::Healthy);
        assert_eq!(r.gpus[1].health, GpuHealth::Failed);
        assert_eq!(r.node, GpuHealth::Failed);
        let why = &r.node_reasons[0];
        assert!(
            why.starts_with("GPU 1 (GPU-bbbb): the kubelet reports it Unhealthy to pod ml/trainer-0 (container main, nvidia.com/gpu"),
            "{why}"
        );
        // GKE's device plugin names a GPU by its device file: the minor number, not the index.
        let r = hear(&report(&cfg), &[said("nvidia3")], &cfg);
        assert_eq!(r.gpus[1].health, GpuHealth::Failed);
        assert_eq!(r.gpus[0].health, GpuHealth::Healthy);
    }

    #[test]
    fn the_failure_outlives_the_pod_and_ends_with_a_reset() {
        let cfg = GpuConfig::default();
        let failed = hear(&report(&cfg), &[said("GPU-bbbb")], &cfg);
        // The pod is gone (nothing more heard), the GPU read again as it was: still failed.
        let same = [sample(0, "GPU-aaaa", 0), sample(1, "GPU-bbbb", 3)];
        let later = update(&failed, &same, &[], 1_000, &cfg);
        assert_eq!(later.gpus[1].health, GpuHealth::Failed);
        // The driver reloaded (the energy counter restarted): a reset, the failure cleared.
        let mut reset = same.clone();
        reset[1].energy_mj = Some(10);
        let healed = update(&later, &reset, &[], 2_000, &cfg);
        assert_eq!(healed.gpus[1].health, GpuHealth::Healthy);
        assert_eq!(healed.cleared.len(), 1, "a cleared failure is said");
    }

    #[test]
    fn only_new_reports_count_and_unknown_gpus_change_nothing() {
        let cfg = GpuConfig::default();
        let a = [said("GPU-aaaa")];
        let both = [said("GPU-aaaa"), said("GPU-bbbb")];
        assert_eq!(new_reports(&a, &both), [said("GPU-bbbb")]);
        assert!(new_reports(&both, &a).is_empty());
        assert_eq!(hear(&report(&cfg), &[], &cfg), report(&cfg));
        let r = hear(&report(&cfg), &[said("GPU-zzzz")], &cfg);
        assert_eq!(r.node, GpuHealth::Healthy);
    }
}
