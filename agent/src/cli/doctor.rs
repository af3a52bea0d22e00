//! `vigil doctor`: check the local node as deployed — config, Redis, Docker, NVML, the metadata
//! server, Kubernetes permissions, the opportunistic idle check's witnesses (`super::idle`), the
//! checkpoint budgets against the worker pods (`super::budget`) — one line each, `ok` / `warn` /
//! `fail` and what to do.

use std::time::Duration;

use crate::accel::gpu::nvml::{gpus_present, HostPaths};
use crate::accel::gpu::state::{StateStore, BOOT_ID_PATH};
use crate::clock::{Clock, SystemClock};
use crate::config::{Config, Switch};
use crate::coord::redis::RedisCoordinator;
use crate::coord::Coordinator;
use crate::kube::node::KubeNodeApi;
use crate::maintenance::metadata::{blind_hint, MetadataClient, MetadataError};

use super::check::{check, render, Check, Level};

/// Node clock skew against Redis above this is worth a warning (verdicts use Redis time, but
/// log timestamps and Docker start times are the node's).
const SKEW_WARN: i64 = 2_000;

/// `vigil doctor`: run every check (each bounded by a short timeout) and print them in order; a
/// failed one fails the command.
pub(super) async fn command(cfg: &Config) -> Result<(), super::CliError> {
    let mode =
        if cfg.dry_run { "observe mode (dry_run): restarts never run" } else { "restarts enabled" };
    let mut out = vec![Check::ok("config", format!("valid; node {}, {mode}", cfg.node_name))];
    out.push(redis(cfg).await);
    out.extend(runtime(cfg).await);
    out.push(nvml(cfg));
    out.push(tpu(cfg));
    let auto = cfg.gpu.enabled == Switch::Auto;
    if cfg.gpu.enabled == Switch::On || (auto && gpus_present(&HostPaths::default())) {
        out.push(gpu_state(cfg));
    }
    out.push(metadata(cfg).await);
    out.extend(kubernetes(cfg).await);
    out.extend(super::idle::checks(cfg).await);
    out.extend(budget(cfg).await);
    print!("{}", render(&out));
    if out.iter().any(|c| c.level == Level::Fail) {
        return Err(super::failed("doctor found failures (see above)"));
    }
    Ok(())
}

/// The checkpoint budgets against GCE's notices and this node's worker pods.
async fn budget(cfg: &Config) -> Vec<Check> {
    let r = super::budget::check(cfg, &cfg.node_name).await;
    if r.shortfalls.is_empty() {
        let level = if matches!(r.pods, Some(Err(_))) { Level::Warn } else { Level::Ok };
        return vec![check("budget", level, format!("fits: {}", r.summary()))];
    }
    // Each shortfall, then what was read.
    let details = r.shortfalls.iter().map(|f| format!("[{}] {}", f.code, f.detail));
    details.chain([r.summary()]).map(|d| Check::warn("budget", d)).collect()
}

async fn redis(cfg: &Config) -> Check {
    if cfg.embedded() {
        let text = "no REDIS_URL: embedded coordinator, safe for one agent on one node; set REDIS_URL for a fleet";
        return Check::warn("redis", text);
    }
    let coord = match RedisCoordinator::from_config(&cfg.redis) {
        Ok(c) => Box::new(c) as Box<dyn Coordinator>,
        Err(e) => return Check::fail("redis", format!("{e}; fix redis.url / REDIS_URL")),
    };
    let described = coord.describe();
    match coord.time().await.map(|t| SystemClock.now() - t) {
        Ok(skew) if skew.abs() > SKEW_WARN => Check::warn("redis", format!(
            "{described} reachable, but this node's clock is {skew} ms off Redis's: verdicts use Redis time; check NTP"
        )),
        Ok(skew) => Check::ok("redis", format!("{described} reachable; clock skew {skew} ms")),
        Err(e) => Check::fail("redis", format!(
            "{e}; restarts stay paused until it answers (check the address, AUTH, TLS, network policy)"
        )),
    }
}

/// The container runtime `vigil run` would use (`runtime.kind`, or the socket `auto` finds).
async fn runtime(cfg: &Config) -> Vec<Check> {
    let (rt, why) = crate::runtime::connect(cfg, None);
    let found = Check::ok("runtime", format!("{why}: {}", rt.describe()));
    let pinged = rt.ping().await;
    // NB: described after the first call, which tells Podman's API from Docker's.
    let described = rt.describe();
    if let Err(e) = pinged {
        let fix = if described.starts_with("docker") {
            "mount the socket (hostPath /var/run/docker.sock) and run in its group"
        } else if described.starts_with("podman") {
            "start Podman's API (systemctl enable --now podman.socket) and mount its socket (runtime.podman_socket)"
        } else {
            "mount the runtime's socket (hostPath /run/containerd/containerd.sock)"
        };
        return vec![found, Check::fail("runtime", format!("{e}; {fix}"))];
    }
    let label = &cfg.runtime.worker_label;
    let listed = match rt.list_workers().await {
        Ok(w) if w.is_empty() => Check::warn("runtime", format!(
            "{described} reachable, but no container (or pod) carries the label `{label}`: nothing will be watched"
        )),
        Ok(w) => {
            let names: Vec<_> = w.iter().map(|c| format!("{}={}", c.display(), c.worker)).collect();
            let names = names.join(", ");
            Check::ok("runtime", format!("{described} reachable; {} worker(s): {names}", w.len()))
        }
        Err(e) => Check::fail("runtime", e.to_string()),
    };
    let pods = if described.starts_with("cri") { Some(gpus_of_workers(cfg).await) } else { None };
    [found, listed].into_iter().chain(pods).collect()
}

/// On CRI: whether the workers' GPUs can be read (the kubelet's PodResources API).
async fn gpus_of_workers(cfg: &Config) -> Check {
    let empty = "runtime.pod_resources_socket is empty: every worker counts as using every GPU, so one failed GPU stands all of them down";
    let Some(src) = crate::runtime::devices(cfg) else {
        return Check::warn("pod-resources", empty);
    };
    match src.gpus().await {
        Ok(g) => {
            let text = format!("{} answers; {} container(s) with GPUs", src.describe(), g.len());
            Check::ok("pod-resources", text)
        }
        Err(e) => {
            let text = format!("{e}; until it answers every worker counts as using every GPU");
            Check::warn("pod-resources", text)
        }
    }
}

fn nvml(cfg: &Config) -> Check {
    use crate::accel::gpu::nvml::{GpuProbe, NvmlProbe};
    if cfg.gpu.enabled == Switch::Off {
        return Check::ok("nvml", "GPU monitoring disabled (gpu.enabled = off)");
    }
    if cfg.gpu.enabled == Switch::Auto && !gpus_present(&HostPaths::default()) {
        let text = "no NVIDIA GPU on this node (no /dev/nvidiaN, no NVIDIA PCI display device): GPU monitoring off; the agent looks again every 5m";
        return Check::ok("nvml", text);
    }
    match NvmlProbe::new(Some(cfg.gpu.library_path.as_str())) {
        Ok(mut p) => match p.sample() {
            Ok(gpus) => Check::ok("nvml", format!("NVML loaded; {} GPU(s)", gpus.len())),
            Err(e) => Check::warn("nvml", format!("NVML loaded, but reading failed: {e}")),
        },
        Err(e) => check(
            "nvml",
            if cfg.gpu.enabled == Switch::On { Level::Fail } else { Level::Warn },
            format!("waiting for the driver: this node has NVIDIA GPUs but {e}; the agent keeps trying (5s doubling to 5m) and starts GPU monitoring when NVML loads, with no restart"),
        ),
    }
}

/// The TPU chips as the monitor would read them: device files, PCI functions, the kernel log.
fn tpu(cfg: &Config) -> Check {
    use crate::accel::tpu::chips::FsProbe;
    let t = &cfg.tpu;
    if t.enabled == Switch::Off {
        return Check::ok("tpu", "TPU monitoring disabled (tpu.enabled = off)");
    }
    let log = Some(std::path::Path::new(&t.kernel_log)).filter(|_| !t.kernel_log.is_empty());
    let mut probe = FsProbe::new(&t.device_dir, &t.sys_dir, log, "/proc/uptime");
    let reading = match probe.read() {
        Ok(r) => r,
        Err(e) => {
            let level = if t.enabled == Switch::On { Level::Fail } else { Level::Warn };
            return check("tpu", level, e.to_string());
        }
    };
    // Opened by the read, on a TPU node only.
    let log_error = probe.kernel_log_error();
    let found = reading.device_files.len();
    if found == 0 && reading.chips.pci.is_empty() {
        let level = if t.enabled == Switch::On { Level::Warn } else { Level::Ok };
        return check("tpu", level, format!("no TPU chip in {}", t.device_dir));
    }
    let (files, pci) = (reading.device_files.join(", "), reading.chips.pci.len());
    let text = format!("{found} TPU chip device file(s) ({files}); {pci} TPU PCI function(s)");
    match (log_error, t.kernel_log.is_empty()) {
        (Some(e), _) => Check::warn("tpu", format!("{text}; {e}")),
        (None, true) => Check::ok("tpu", format!("{text}; kernel log off (tpu.kernel_log)")),
        (None, false) => Check::ok("tpu", format!("{text}; kernel log {} readable", t.kernel_log)),
    }
}

/// The GPU state file: failed GPUs kept across agent restarts (`gpu.state_file`).
fn gpu_state(cfg: &Config) -> Check {
    let Some(store) = StateStore::from_config(&cfg.gpu.state_file, BOOT_ID_PATH.as_ref()) else {
        let text = "gpu.state_file is empty: a failed GPU is forgotten when the agent restarts";
        return Check::warn("gpu-state", text);
    };
    let r = store.load();
    if let Some(w) = r.warning {
        return Check::warn("gpu-state", w);
    }
    let dir = store.path().parent().unwrap_or(std::path::Path::new("/"));
    if std::fs::metadata(dir).is_err() {
        let dir = dir.display();
        let text = format!("{dir} does not exist yet: the agent creates it; on Kubernetes mount a hostPath there so failures outlive the pod");
        return Check::warn("gpu-state", text);
    }
    let path = store.path().display();
    let failed: Vec<&str> = r.gpus.iter().map(|g| g.uuid.as_str()).collect();
    if failed.is_empty() {
        return Check::ok("gpu-state", format!("{path}: no GPU kept failed on this boot"));
    }
    Check::ok("gpu-state", format!("{path}: kept failed on this boot: {}", failed.join(", ")))
}

async fn metadata(cfg: &Config) -> Check {
    if cfg.metadata.enabled == Switch::Off {
        return Check::ok("metadata", "GCE metadata watcher disabled (metadata.enabled = off)");
    }
    let client = match MetadataClient::for_host(&cfg.metadata.host, Duration::from_secs(3)) {
        Ok(c) => c,
        Err(e) => return Check::fail("metadata", e.to_string()),
    };
    let base = client.base_url();
    let read = client.get(crate::maintenance::metadata::MAINTENANCE_EVENT_PATH, None);
    match tokio::time::timeout(Duration::from_secs(5), read).await {
        Ok(Ok(v)) => Check::ok(
            "metadata",
            format!("GCE metadata server answers; maintenance-event = {}", v.value.trim()),
        ),
        Ok(Err(MetadataError::NotFound { .. })) => Check::fail("metadata", blind_hint(base)),
        Ok(Err(e)) => check(
            "metadata",
            if cfg.metadata.enabled == Switch::On { Level::Fail } else { Level::Warn },
            format!("{e}; off GCE this is expected (set metadata.enabled = off to silence)"),
        ),
        Err(_) => Check::warn("metadata", format!("no answer from {base} within 5s")),
    }
}

/// A rule the doctor checks with a SelfSubjectAccessReview: (API group, resource, namespace,
/// verbs); its check is `rbac:` and the resource's last segment (`rbac:status`).
type Rule = (&'static str, &'static str, Option<&'static str>, &'static [&'static str]);

/// The writes the agent makes; `get` on the Node was just tried for real. Events go through
/// kube's events.k8s.io Recorder: `create` for a new one, `patch` to count a repeat.
const RBAC_RULES: [Rule; 10] = [
    ("", "nodes", None, &["patch"]),
    // The conditions VigilMaintenance / VigilGPUUnhealthy / VigilTPUUnhealthy.
    ("", "nodes/status", None, &["patch"]),
    // A CRI restart reads the pod and a Job's pods; the idle check and the budget check list
    // this node's pods.
    ("", "pods", None, &["get", "list"]),
    // A CRI restart reads the pod's controllers (docs/controllers.md).
    ("batch", "jobs", None, &["get"]),
    ("jobset.x-k8s.io", "jobsets", None, &["get"]),
    ("leaderworkerset.x-k8s.io", "leaderworkersets", None, &["get"]),
    // `gpu.device_taints`: a failed GPU's DRA device taint
    // (deploy/components/dra-device-taints).
    ("resource.k8s.io", "resourceslices", None, &["list"]),
    ("resource.k8s.io", "devicetaintrules", None, &["list", "get", "create", "delete"]),
    // The worker API's TokenReviews (worker_api.auth = "kubernetes").
    ("authentication.k8s.io", "tokenreviews", None, &["create"]),
    ("events.k8s.io", "events", Some("default"), &["create", "patch"]),
];

async fn kubernetes(cfg: &Config) -> Vec<Check> {
    if !cfg.kubernetes_on() {
        let text = "not in a cluster (kubernetes.enabled = auto/off): Node labels and Events off";
        return vec![Check::ok("kubernetes", text)];
    }
    let api = match KubeNodeApi::connect(&cfg.kubernetes.api_url).await {
        Ok(a) => a,
        Err(e) => return vec![Check::fail("kubernetes", e.to_string())],
    };
    let mut out = vec![match api.get_node(&cfg.node_name).await {
        Ok(()) => Check::ok("kubernetes", format!("node {} readable", cfg.node_name)),
        Err(e) => Check::fail("kubernetes", e.to_string()),
    }];
    let reviews_tokens = cfg.worker_api.listen.is_some()
        && cfg.worker_api.auth == crate::config::WorkerAuth::Kubernetes;
    for rule @ (_, resource, ..) in RBAC_RULES {
        let dra = matches!(resource, "resourceslices" | "devicetaintrules");
        if (resource == "tokenreviews" && !reviews_tokens) || (dra && !cfg.gpu.device_taints) {
            continue;
        }
        out.push(rbac_rule(&api, rule).await);
    }
    out
}

/// One RBAC rule, asked with access reviews, verb by verb.
async fn rbac_rule(api: &KubeNodeApi, (group, resource, ns, verbs): Rule) -> Check {
    let name = format!("rbac:{}", resource.rsplit('/').next().unwrap_or(resource));
    let what = if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
    let mut denied = Vec::new();
    let mut unknown = None;
    for verb in verbs {
        match api.can_i(group, verb, resource, ns).await {
            Ok(true) => {}
            Ok(false) => denied.push(*verb),
            Err(e) => unknown = Some(e),
        }
    }
    if !denied.is_empty() {
        let denied = denied.join(" and ");
        let text =
            format!("may NOT {denied} {what}: apply deploy/base/rbac.yaml (ClusterRole vigil)");
        Check::fail(name, text)
    } else if let Some(e) = unknown {
        Check::warn(name, format!("could not ask: {e}"))
    } else {
        Check::ok(name, format!("may {} {what}", verbs.join(" and ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg_with(state_file: &str) -> Config {
        let mut cfg = Config::default();
        cfg.gpu.state_file = state_file.into();
        cfg
    }

    #[test]
    fn the_gpu_state_check_says_what_is_kept_and_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let c = gpu_state(&cfg_with(""));
        assert_eq!(c.level, Level::Warn);
        assert!(c.detail.contains("forgotten"), "{}", c.detail);
        let missing_dir = dir.path().join("nope/gpu-state.json");
        let c = gpu_state(&cfg_with(missing_dir.to_str().unwrap()));
        assert_eq!(c.level, Level::Warn);
        assert!(c.detail.contains("hostPath"), "{}", c.detail);
        let file = dir.path().join("gpu-state.json");
        let c = gpu_state(&cfg_with(file.to_str().unwrap()));
        assert_eq!(c.level, Level::Ok, "{}", c.detail);
        assert!(c.detail.contains("no GPU kept failed"), "{}", c.detail);
        std::fs::write(&file, "{ torn").unwrap();
        let c = gpu_state(&cfg_with(file.to_str().unwrap()));
        assert_eq!(c.level, Level::Warn);
        assert!(c.detail.contains("corrupt"), "{}", c.detail);
    }
}
