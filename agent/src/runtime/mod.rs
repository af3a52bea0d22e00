//! The container runtime: list opted-in workers, read their logs, restart one.
//!
//! Map: [`ContainerRuntime`] is the one trait; `connect` picks the implementation from
//! `runtime.kind` (or from the sockets the node has). `docker.rs`: Docker, and Podman through its
//! Docker-compatible API (`runtime.kind = podman`), with bollard. `cri.rs`: the Kubernetes CRI
//! (containerd, CRI-O), which reads a pod's `restartPolicy` through `crate::kube::pods` and a
//! container's GPUs through `crate::kube::podresources`; `cri_log.rs`: the CRI log format;
//! `cri_sandbox.rs`: a pod sandbox as the CRI adapter reads it.
//! `sim.rs`: the simulated runtime of the demo and the scenario tests.

pub mod container;
pub mod cri;
pub(crate) mod cri_log;
mod cri_remediation;
pub(crate) mod cri_sandbox;
pub mod docker;
#[cfg(feature = "demo")]
pub mod sim;

pub use container::Container;

use std::time::Duration;

use async_trait::async_trait;

use std::sync::Arc;

use crate::config::{Config, RuntimeKind};
use crate::http::server::Probe;
use crate::kube::podresources::PodResourcesClient;
use crate::kube::pods::PodApi;
use crate::vocab::workload::{Remediation, Stops};
use cri::{CriRuntime, CriSettings};
use docker::DockerRuntime;

/// Where containerd and CRI-O listen on a Kubernetes node, in the order `auto` tries them.
pub(crate) const CRI_SOCKETS: [&str; 2] =
    ["/run/containerd/containerd.sock", "/var/run/crio/crio.sock"];

/// The runtime chosen at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Docker at this host (`docker.host`).
    Docker(String),
    /// Podman's Docker-compatible API on this unix socket (a path).
    Podman(String),
    /// A CRI runtime on this unix socket.
    Cri(String),
}

/// Pick the runtime: `runtime.kind`, or for `auto` the socket that exists — Docker's
/// (`docker.host`), then rootful Podman's (`runtime.podman_socket`), then `runtime.cri_socket`,
/// then containerd's, then CRI-O's. Returns the choice and the line that says why (logged at
/// start-up, shown by `vigil doctor`).
///
/// NB: never "no runtime": when the socket is not there (yet), the agent still starts, fails
/// closed and reports `runtime-down` every cycle until it appears, rather than crash-looping.
pub(crate) fn choose(cfg: &Config, exists: impl Fn(&str) -> bool) -> (Choice, String) {
    let docker = Choice::Docker(cfg.docker.host.clone());
    let docker_socket = cfg.docker.host.strip_prefix("unix://");
    let configured = [cfg.runtime.cri_socket.as_str()];
    let cri_candidates: &[&str] = if configured[0].is_empty() { &CRI_SOCKETS } else { &configured };
    let found_cri = cri_candidates.iter().find(|p| exists(p));
    let podman_socket = cfg.runtime.podman_socket.as_str();
    let podman = Choice::Podman(podman_socket.to_string());
    let cri = |socket: &str| Choice::Cri(socket.to_string());
    match cfg.runtime.kind {
        RuntimeKind::Docker => (docker, "runtime.kind = docker".into()),
        RuntimeKind::Podman if exists(podman_socket) => (podman, "runtime.kind = podman".into()),
        RuntimeKind::Podman => {
            let why = format!("runtime.kind = podman, but no Podman socket at {podman_socket} (yet): enable podman.socket (or run `podman system service`) and mount it, or set runtime.podman_socket");
            (podman, why)
        }
        RuntimeKind::Cri => match found_cri {
            Some(p) => (cri(p), "runtime.kind = cri".into()),
            None => {
                let sockets = cri_candidates.join(" or ");
                let why = format!("runtime.kind = cri, but no CRI socket at {sockets} (yet): mount the runtime's socket, or set runtime.cri_socket");
                (cri(cri_candidates[0]), why)
            }
        },
        RuntimeKind::Auto => {
            if docker_socket.is_none_or(&exists) {
                return (docker, format!("runtime.kind = auto: {} found", cfg.docker.host));
            }
            if exists(podman_socket) {
                let why = format!(
                    "runtime.kind = auto: no Docker socket, Podman socket {podman_socket} found"
                );
                return (podman, why);
            }
            if let Some(p) = found_cri {
                let why = format!("runtime.kind = auto: no Docker socket, CRI socket {p} found");
                return (cri(p), why);
            }
            let host = &cfg.docker.host;
            let sockets = cri_candidates.join(", ");
            let why = format!("runtime.kind = auto, but none of the runtime sockets exists ({host}, {podman_socket}, {sockets}): using Docker, reported down until it answers; mount the node's runtime socket (docs/running.md)");
            (docker, why)
        }
    }
}

/// The runtime [`choose`] picks, connected lazily (a runtime that is down is reported per
/// cycle), and the line that says why.
pub fn connect(cfg: &Config, pods: Option<Arc<dyn PodApi>>) -> (Arc<dyn ContainerRuntime>, String) {
    let (choice, why) = choose(cfg, |p| std::path::Path::new(p).exists());
    let r = &cfg.runtime;
    let (label, checkpoint) = (&r.worker_label, &cfg.checkpoint.label);
    let timeout = r.restart_timeout + Duration::from_secs(5);
    let docker = |host: &str, podman| {
        Arc::new(DockerRuntime::new(host, podman, label, checkpoint, timeout, r.call_timeout))
    };
    let rt: Arc<dyn ContainerRuntime> = match choice {
        Choice::Docker(host) => docker(&host, false),
        Choice::Podman(socket) => docker(&format!("unix://{socket}"), true),
        Choice::Cri(socket) => {
            if pods.is_none() && !r.allow_pod_replacement {
                tracing::warn!("CRI runtime without the Kubernetes API: pods' restartPolicy cannot be read, so no pod is restarted (enable kubernetes.enabled, or set runtime.allow_pod_replacement = true)");
            }
            let s = CriSettings {
                socket,
                worker_label: r.worker_label.clone(),
                checkpoint_annotation: cfg.checkpoint.label.clone(),
                call_timeout: r.call_timeout,
                allow_pod_replacement: r.allow_pod_replacement,
                poll: Duration::from_millis(500),
            };
            Arc::new(CriRuntime::new(s, pods).with_devices(devices(cfg)))
        }
    };
    (rt, why)
}

/// Where a CRI runtime reads its workers' GPUs: the kubelet's PodResources API at
/// `runtime.pod_resources_socket`; `None` when that is empty (every worker on every GPU).
pub(crate) fn devices(cfg: &Config) -> Option<Arc<PodResourcesClient>> {
    let path = &cfg.runtime.pod_resources_socket;
    (!path.is_empty()).then(|| Arc::new(PodResourcesClient::new(path, cfg.runtime.call_timeout)))
}

#[cfg(test)]
mod choose_tests {
    use super::*;

    fn only(present: &'static [&'static str]) -> impl Fn(&str) -> bool {
        move |p: &str| present.contains(&p)
    }

    #[test]
    fn auto_prefers_docker_then_containerd_then_crio() {
        let cfg = Config::default();
        let (c, _) = choose(&cfg, only(&["/var/run/docker.sock", CRI_SOCKETS[0]]));
        assert!(matches!(c, Choice::Docker(_)));
        let (c, why) = choose(&cfg, only(&[CRI_SOCKETS[0], CRI_SOCKETS[1]]));
        assert_eq!(c, Choice::Cri(CRI_SOCKETS[0].into()));
        assert!(why.contains("no Docker socket"), "{why}");
        let (c, _) = choose(&cfg, only(&[CRI_SOCKETS[1]]));
        assert_eq!(c, Choice::Cri(CRI_SOCKETS[1].into()));
        let (c, why) = choose(&cfg, only(&[]));
        assert!(matches!(c, Choice::Docker(_)), "started, reported down");
        assert!(why.contains("none of the runtime sockets"), "{why}");
        assert!(why.contains(PODMAN), "{why}");
    }

    const PODMAN: &str = "/run/podman/podman.sock";

    #[test]
    fn auto_takes_rootful_podman_after_docker_and_before_cri() {
        let cfg = Config::default();
        let (c, _) = choose(&cfg, only(&["/var/run/docker.sock", PODMAN, CRI_SOCKETS[0]]));
        assert!(matches!(c, Choice::Docker(_)), "Docker's socket first");
        let (c, why) = choose(&cfg, only(&[PODMAN, CRI_SOCKETS[0], CRI_SOCKETS[1]]));
        assert_eq!(c, Choice::Podman(PODMAN.into()));
        assert_eq!(
            why,
            format!("runtime.kind = auto: no Docker socket, Podman socket {PODMAN} found")
        );
        let mut cfg = Config::default();
        cfg.runtime.podman_socket = "/srv/podman/api.sock".into();
        let (c, _) = choose(&cfg, only(&[PODMAN, CRI_SOCKETS[0]]));
        assert!(matches!(c, Choice::Cri(_)), "only the configured Podman socket counts");
    }

    #[test]
    fn podman_by_name_is_kept_and_a_missing_socket_is_named() {
        let mut cfg = Config::default();
        cfg.runtime.kind = RuntimeKind::Podman;
        let (c, why) = choose(&cfg, only(&["/var/run/docker.sock", PODMAN]));
        assert_eq!(c, Choice::Podman(PODMAN.into()));
        assert_eq!(why, "runtime.kind = podman");
        let (c, why) = choose(&cfg, only(&["/var/run/docker.sock"]));
        assert_eq!(c, Choice::Podman(PODMAN.into()), "reported per cycle when down");
        assert!(why.contains(&format!("no Podman socket at {PODMAN}")), "{why}");
    }

    #[test]
    fn an_explicit_kind_is_kept_and_a_missing_cri_socket_is_named() {
        let mut cfg = Config::default();
        cfg.runtime.kind = RuntimeKind::Docker;
        let (c, _) = choose(&cfg, |_| false);
        assert!(matches!(c, Choice::Docker(_)), "reported per cycle when down");
        cfg.runtime.kind = RuntimeKind::Cri;
        cfg.runtime.cri_socket = "/tmp/x/containerd.sock".into();
        let (c, why) = choose(&cfg, |_| false);
        assert_eq!(c, Choice::Cri("/tmp/x/containerd.sock".into()));
        assert!(why.contains("no CRI socket at /tmp/x/containerd.sock"), "{why}");
        let (c, why) = choose(&cfg, |p| p == "/tmp/x/containerd.sock");
        assert_eq!(c, Choice::Cri("/tmp/x/containerd.sock".into()));
        assert_eq!(why, "runtime.kind = cri");
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{runtime} is unreachable: {source}")]
    Unreachable { runtime: String, source: crate::BoxError },
    #[error("{runtime} refused `{op}` on container {container}: {detail}")]
    Refused { runtime: String, op: &'static str, container: String, detail: String },
    #[error("`{op}` on container {container} did not finish within {timeout:?}")]
    Timeout { op: &'static str, container: String, timeout: Duration },
}

/// What a call to the runtime gives: its answer, or the [`RuntimeError`] that stopped it.
pub(crate) type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// The adapters' errors (private: the adapters are this module's children).
impl RuntimeError {
    /// `rt` cannot be reached: `e`.
    fn unreachable(rt: &dyn ContainerRuntime, e: impl Into<crate::BoxError>) -> Self {
        RuntimeError::Unreachable { runtime: rt.describe(), source: e.into() }
    }

    /// `rt` refused `op` on container `id`: `why`.
    fn refused(rt: &dyn ContainerRuntime, op: &'static str, id: &str, why: &str) -> Self {
        let (runtime, container, detail) = (rt.describe(), id.to_string(), why.to_string());
        RuntimeError::Refused { runtime, op, container, detail }
    }
}

#[async_trait]
pub trait ContainerRuntime: Send + Sync {
    /// Where the runtime lives, for logs and alerts.
    fn describe(&self) -> String;
    /// Containers that carry the opt-in label, running or exited (on CRI: each container's
    /// newest attempt in a ready pod); nothing else is ever returned.
    async fn list_workers(&self) -> Result<Vec<Container>>;
    /// The container as it is now; `None` when it no longer exists.
    async fn inspect(&self, id: &str) -> Result<Option<Container>>;
    /// The last `lines` lines of its output (stdout and stderr interleaved).
    async fn logs(&self, id: &str, lines: usize) -> Result<String>;
    /// How a hung worker of this container is restarted (`crate::vocab::workload`): in place
    /// (Docker, Podman); on a CRI runtime, the way its pod's controllers restart it, read from
    /// the Kubernetes API — or refused, with why.
    /// `stops`: how many pods of its Job the restart judged stops (`Stops`).
    async fn remediation(&self, c: &Container, _stops: Stops) -> Remediation {
        // NB: a kubelet's container on Docker (cri-dockerd): a restart through the Docker API
        // goes behind its pod's controllers — no restart counted, a `Never` pod's container
        // started again, a JobSet or LeaderWorkerSet that restarts the whole job never told.
        // The CRI (cri-dockerd serves one) restarts it their way.
        let (None, Some(p)) = (&c.pod, &c.kube_pod) else { return Remediation::IN_PLACE };
        let pod = format!("{}/{}", p.namespace, p.name);
        let why = format!("the kubelet's container of pod {pod} (cri-dockerd): a restart through the Docker API would go behind its pod's controllers; point Vigil at the CRI (`runtime.kind = \"cri\"`, `runtime.cri_socket` = cri-dockerd's socket) to restart it their way");
        Remediation::Refuse(why)
    }
    /// Restart it: SIGTERM, wait `stop_grace`, SIGKILL, start (Docker); stop it and wait for
    /// kubelet's next attempt (CRI). A zero grace is a SIGKILL at once.
    async fn restart(&self, c: &Container, stop_grace: Duration) -> Result<()>;
    /// Stop it for its controller, nothing awaited after (the controller makes the next
    /// incarnation: [`Remediation::restarted_in_place`] is false): with `whole_pod`, every
    /// container of its pod (a `Never` pod fails only once all have ended), the worker first;
    /// a zero grace is a SIGKILL at once (exit 137).
    async fn fail(&self, c: &Container, _grace: Duration, _whole_pod: bool) -> Result<()> {
        self.kill(&c.id, "SIGKILL").await
    }
    /// The incarnation that runs in `c`'s place now: the same container (Docker restarts in
    /// place, with a new start time) or the next attempt in its pod (CRI). The restart is
    /// verified by it.
    async fn successor(&self, c: &Container) -> Result<Option<Container>> {
        self.inspect(&c.id).await
    }
    /// Send a signal (e.g. `SIGUSR1`) to the container's main process: a checkpoint request.
    async fn kill(&self, id: &str, signal: &str) -> Result<()>;
    /// The host pid of the process the runtime started in the container (its init); `None`
    /// when it runs none or this runtime cannot say. The worker API's unix-socket peers are
    /// proven against its cgroup.
    async fn init_pid(&self, _id: &str) -> Result<Option<i32>> {
        Ok(None)
    }
    /// Cheap liveness check for `/readyz`.
    async fn ping(&self) -> Result<()>;
}

/// `/readyz` pings the runtime through [`Probe`], so observe/ needs no runtime types.
#[async_trait]
impl Probe for Arc<dyn ContainerRuntime> {
    fn describe(&self) -> String {
        ContainerRuntime::describe(&**self)
    }

    async fn ping(&self) -> Result<(), crate::http::server::ProbeError> {
        Ok(ContainerRuntime::ping(&**self).await?)
    }
}

#[cfg(test)]
mod error_tests {
    use super::RuntimeError;

    #[test]
    fn an_unreachable_runtime_keeps_its_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = RuntimeError::Unreachable {
            runtime: "docker at unix:///var/run/docker.sock".into(),
            source: io.into(),
        };
        assert_eq!(
            e.to_string(),
            "docker at unix:///var/run/docker.sock is unreachable: connection refused"
        );
        let cause = std::error::Error::source(&e).expect("the cause is kept");
        let io = cause.downcast_ref::<std::io::Error>().expect("as its own type");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
