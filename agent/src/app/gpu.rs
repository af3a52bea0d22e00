//! The GPU's health at start-up: the NVML monitor on its thread, the kubelet's reports it hears
//! on Kubernetes, and the DRA client of `gpu.device_taints`.

use std::sync::Arc;

use tokio::sync::watch;

use crate::accel::gpu::kubelet::follow;
use crate::accel::gpu::model::GpuReport;
use crate::accel::gpu::start;
use crate::http::health::Warnings;
use crate::kube::device_taints::KubeDeviceTaints;

impl super::Wiring {
    /// GPU health: the monitor, hearing the kubelet's reports on Kubernetes; and, with
    /// `gpu.device_taints`, the DRA client (whose ResourceSlices also name the GPU of a DRA
    /// claim's device the kubelet reports).
    pub(super) async fn gpu_health(
        &self,
        warnings: Warnings,
    ) -> (watch::Receiver<GpuReport>, Option<Arc<KubeDeviceTaints>>) {
        let (cfg, stop, tracker) = (&self.cfg, &self.stop, &self.tracker);
        // With `gpu.device_taints` (and the pods' API): the DRA client for a failed GPU's device
        // taint; none, with the reason logged, when it cannot be made (`gpu.taint_on_failure`'s
        // Node taint then stands in).
        let dra = if self.pods.is_some() && cfg.gpu.device_taints {
            let api = KubeDeviceTaints::connect(&cfg.kubernetes.api_url, &cfg.gpu.dra_api_version);
            let why =
                "gpu.device_taints: no client for resource.k8s.io; failed GPUs are not tainted";
            super::connected(cfg, api, why).await
        } else {
            None
        };
        let (gpu_tx, gpu_rx) = watch::channel(GpuReport::default());
        // On Kubernetes (`gpu.kubelet_health_interval` not 0): the reader of the GPUs the kubelet
        // reports `Unhealthy` (`crate::accel::gpu::kubelet`), heard by the GPU monitor.
        let every = cfg.gpu.kubelet_health_interval;
        let heard = self.pods.clone().filter(|_| !every.is_zero()).map(|pods| {
            let (tx, rx) = watch::channel(Vec::new());
            let node = cfg.node_name.clone();
            tracker.spawn(follow(gpu_rx.clone(), tx, pods, dra.clone(), node, every, stop.clone()));
            rx
        });
        // The GPU monitor. NVML calls block: it runs on its own thread and publishes reports.
        let (gpu_cfg, gpu_stop) = (cfg.gpu.clone(), stop.child_token());
        tracker.spawn(async move {
            // NB: the monitor's thread is detached: a wedged NVML call must not hold the exit.
            drop(start::start(&gpu_cfg, gpu_tx, gpu_stop, Some(warnings), heard).await);
        });
        (gpu_rx, dra)
    }
}
