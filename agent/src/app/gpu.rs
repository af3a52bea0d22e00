//! The GPU's health at start-up: the NVML monitor on its thread, the kubelet's reports it hears
//! on Kubernetes, and the DRA client of `gpu.device_taints`.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accel::gpu::model::GpuReport;
use crate::config::Config;
use crate::http::health::Warnings;
use crate::kube::pods::PodApi;

/// GPU health: the monitor, hearing the kubelet's reports on Kubernetes; and, with
/// `gpu.device_taints`, the DRA client (whose ResourceSlices also name the GPU of a DRA claim's
/// device the kubelet reports).
pub(super) async fn gpu_health(
    cfg: &Config,
    pods: Option<Arc<dyn PodApi>>,
    warnings: Warnings,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) -> (watch::Receiver<GpuReport>, Option<Arc<dyn crate::kube::device_taints::DeviceTaintApi>>) {
    let dra = match pods.is_some() {
        true => device_taints(cfg).await,
        false => None,
    };
    let kubelet = kubelet_device_health(cfg, pods, dra.clone(), tracker, stop);
    (gpu_monitor(cfg, warnings, kubelet, tracker, stop), dra)
}

/// The GPU monitor. NVML calls block: it runs on its own thread and publishes reports; with
/// `kubelet`, it hears the kubelet's reports too (and publishes on that reader's channel).
fn gpu_monitor(
    cfg: &Config,
    warnings: Warnings,
    kubelet: Option<(
        crate::accel::gpu::monitor::Kubelet,
        watch::Sender<GpuReport>,
        watch::Receiver<GpuReport>,
    )>,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) -> watch::Receiver<GpuReport> {
    let (heard, gpu_tx, gpu_rx) = match kubelet {
        Some((heard, tx, rx)) => (Some(heard), tx, rx),
        None => {
            let (tx, rx) = watch::channel(GpuReport::default());
            (None, tx, rx)
        }
    };
    let (gpu_cfg, gpu_stop) = (cfg.gpu.clone(), stop.child_token());
    tracker.spawn(async move {
        // NB: the monitor's thread is detached: a wedged NVML call must not hold the exit.
        let started =
            crate::accel::gpu::start::start(&gpu_cfg, gpu_tx, gpu_stop, Some(warnings), heard);
        drop(started.await);
    });
    gpu_rx
}

/// On Kubernetes (`gpu.kubelet_health_interval` not 0): the reader of the GPUs the kubelet
/// reports `Unhealthy` (`crate::accel::gpu::kubelet`), heard by the GPU monitor.
fn kubelet_device_health(
    cfg: &Config,
    pods: Option<Arc<dyn PodApi>>,
    slices: Option<Arc<dyn crate::kube::device_taints::DeviceTaintApi>>,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) -> Option<(
    crate::accel::gpu::monitor::Kubelet,
    watch::Sender<GpuReport>,
    watch::Receiver<GpuReport>,
)> {
    let every = cfg.gpu.kubelet_health_interval;
    let pods = pods.filter(|_| !every.is_zero())?;
    let (tx, rx) = watch::channel(Vec::new());
    let (gpu_tx, gpu_rx) = watch::channel(GpuReport::default());
    tracker.spawn(crate::accel::gpu::kubelet::follow(
        gpu_rx.clone(),
        tx,
        pods,
        slices,
        cfg.node_name.clone(),
        every,
        stop.clone(),
    ));
    Some((rx, gpu_tx, gpu_rx))
}

/// With `gpu.device_taints`: the DRA client for a failed GPU's device taint (none, with the
/// reason logged, when it cannot be made: `gpu.taint_on_failure`'s Node taint then stands in).
async fn device_taints(
    cfg: &Config,
) -> Option<Arc<dyn crate::kube::device_taints::DeviceTaintApi>> {
    if !cfg.gpu.device_taints {
        return None;
    }
    let g = &cfg.gpu;
    match crate::kube::device_taints::KubeDeviceTaints::connect(
        &cfg.kubernetes.api_url,
        &g.dra_api_version,
    )
    .await
    {
        Ok(api) => Some(Arc::new(api)),
        Err(e) => {
            tracing::error!(error = %e, "gpu.device_taints: no client for resource.k8s.io; failed GPUs are not tainted");
            None
        }
    }
}
