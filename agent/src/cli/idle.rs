//! `vigil doctor`'s view of the opportunistic-maintenance idle check: whether each witness
//! (`crate::maintenance::policy_idle`) answers now. A witness that cannot answer keeps the node busy for
//! ever (unknown is not idle), so each gets its own line.

use super::check::Check;
use crate::config::{Config, Switch};
use crate::kube::pods::KubePods;

/// One line per witness; none when opportunistic maintenance is off.
pub(super) async fn checks(cfg: &Config) -> Vec<Check> {
    if !cfg.opportunistic.enabled {
        return Vec::new();
    }
    vec![pods(cfg).await, pod_resources(cfg).await, nvml(cfg)]
}

/// The items, comma-separated, or `none`.
fn joined(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    Some(items.join(", ")).filter(|_| !items.is_empty()).unwrap_or_else(|| "none".into())
}

const BUSY: &str = "until it answers the node never counts as idle (opportunistic maintenance)";

async fn pods(cfg: &Config) -> Check {
    if !cfg.kubernetes_on() {
        return Check::ok("idle:pods", "not on Kubernetes: not a witness");
    }
    match KubePods::list_node(&cfg.kubernetes.api_url, &cfg.node_name).await {
        Ok(pods) => {
            let held = pods.iter().filter(|p| p.accelerators && !p.terminal());
            let held = joined(held.map(|p| p.display()));
            let text =
                format!("{} pod(s) on this node; requesting accelerators: {held}", pods.len());
            Check::ok("idle:pods", text)
        }
        Err(e) => Check::warn("idle:pods", format!("{e}; {BUSY}")),
    }
}

async fn pod_resources(cfg: &Config) -> Check {
    let src = crate::runtime::devices(cfg).filter(|_| cfg.kubernetes_on());
    let why = "not a witness (not on Kubernetes, or runtime.pod_resources_socket = \"\")";
    let Some(src) = src else { return Check::ok("idle:pod-res", why) };
    match src.gpus().await {
        Ok(g) => {
            let held = joined(g.holders().iter().map(|(ns, p)| format!("{ns}/{p}")));
            let text = format!("{} answers; pods holding accelerators: {held}", src.describe());
            Check::ok("idle:pod-res", text)
        }
        Err(e) => Check::warn("idle:pod-res", format!("{e}; {BUSY}")),
    }
}

fn nvml(cfg: &Config) -> Check {
    if cfg.gpu.enabled == Switch::Off {
        return Check::ok("idle:nvml", "not a witness (gpu.enabled = off)");
    }
    use crate::accel::gpu::nvml::{GpuProbe, NvmlProbe};
    let sampled = NvmlProbe::new(Some(cfg.gpu.library_path.as_str())).and_then(|mut p| p.sample());
    let gpus = match sampled {
        Ok(gpus) => gpus,
        Err(e) => {
            let text = format!("{e}; {BUSY}; on a node without GPUs set gpu.enabled = off");
            return Check::warn("idle:nvml", text);
        }
    };
    let unread = gpus.iter().filter(|g| g.compute_processes.is_none());
    let unread: Vec<String> = unread.map(|g| g.index.to_string()).collect();
    if !unread.is_empty() {
        let unread = unread.join(", ");
        let text = format!("NVML cannot report the compute processes of GPU(s) {unread} (an old driver, or MIG without the privilege); {BUSY}");
        return Check::warn("idle:nvml", text);
    }
    let busy = gpus.iter().filter_map(|g| {
        g.compute_processes.filter(|&n| n > 0).map(|n| format!("GPU {}: {n}", g.index))
    });
    Check::ok("idle:nvml", format!("{} GPU(s); compute processes: {}", gpus.len(), joined(busy)))
}
