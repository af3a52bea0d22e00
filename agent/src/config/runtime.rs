//! `[runtime]`: the container runtime the agent speaks to, and the runtime-neutral settings of
//! a restart (label, logs, grace, deadlines).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad_if, ConfigError};

/// Which container runtime the agent speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RuntimeKind {
    /// The socket that exists: Docker's (`docker.host`), then rootful Podman's
    /// (`runtime.podman_socket`), then containerd's, then CRI-O's.
    Auto,
    /// The Docker Engine API at `docker.host`.
    Docker,
    /// Podman's Docker-compatible API at `runtime.podman_socket` (`podman system service`).
    Podman,
    /// The Kubernetes CRI (containerd, CRI-O).
    Cri,
}

/// The runtime-neutral settings of the container runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// `auto`, `docker`, `podman` or `cri`.
    #[educe(Default(expression = RuntimeKind::Auto))]
    pub(crate) kind: RuntimeKind,
    /// Podman's API socket (its Docker-compatible API); the rootful default is
    /// `/run/podman/podman.sock`.
    #[educe(Default(expression = "/run/podman/podman.sock".into()))]
    pub(crate) podman_socket: String,
    /// The CRI socket; empty = the first that exists of `/run/containerd/containerd.sock` and
    /// `/var/run/crio/crio.sock`.
    pub(crate) cri_socket: String,
    /// Opt-in label (a container label on Docker, a pod label on CRI); its value is the worker id.
    #[educe(Default(expression = "vigil.worker".into()))]
    pub(crate) worker_label: String,
    /// Log lines collected before a restart and attached to the alert.
    #[educe(Default(expression = 100))]
    pub(crate) log_lines: usize,
    /// Time allowed for log collection.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(20)))]
    pub log_timeout: Duration,
    /// Grace between SIGTERM and SIGKILL when a worker is restarted.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30)))]
    pub stop_grace: Duration,
    /// Time allowed for the whole restart (on CRI: until kubelet's next attempt runs); must
    /// exceed `stop_grace + call_timeout`.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(90)))]
    pub restart_timeout: Duration,
    /// Deadline of every runtime call but the restart (list, inspect, logs, signal, ping): a
    /// runtime that accepts and never answers is noticed this soon. The restart's stop is never
    /// bound by it: it gets the whole stop grace plus this margin.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(10)))]
    pub call_timeout: Duration,
    /// CRI: also restart pods whose restartPolicy is Never (which ends the pod), or whose policy
    /// cannot be read (the Kubernetes API off; a failing one is waited for).
    pub(crate) allow_pod_replacement: bool,
    /// CRI: the kubelet's PodResources socket, where each worker's GPUs are read; empty = off
    /// (every worker counts as using every GPU).
    #[educe(Default(expression = "/var/lib/kubelet/pod-resources/kubelet.sock".into()))]
    pub pod_resources_socket: String,
}

impl RuntimeConfig {
    /// A label to select workers by, a restart deadline a hung worker fits in, and every socket
    /// an absolute path (the optional ones may be empty).
    pub fn validate(&self) -> Result<(), ConfigError> {
        bad_if(self.worker_label.is_empty(), "runtime.worker_label", "must not be empty")?;
        // Longer than the stop grace plus a call: a hung worker is killed only when the grace ends.
        let restart_needs = self.stop_grace + self.call_timeout;
        let timeout = humantime::format_duration(self.restart_timeout);
        let why = format!(
            "{timeout} is not longer than runtime.stop_grace + runtime.call_timeout = {}: a worker that ignores SIGTERM \
             (any hung one) is killed only when the stop grace ends, and starting it again takes up to a call's time; \
             we would give up before the runtime's SIGKILL",
            humantime::format_duration(restart_needs)
        );
        bad_if(self.restart_timeout <= restart_needs, "runtime.restart_timeout", why)?;
        // (key, path, whether empty is allowed, and what empty means)
        for (key, path, optional, off) in [
            ("runtime.podman_socket", &self.podman_socket, false, ""),
            ("runtime.cri_socket", &self.cri_socket, true, ""),
            ("runtime.pod_resources_socket", &self.pod_resources_socket, true, " (empty = off)"),
        ] {
            let why = format!("`{path}` is not an absolute path to a unix socket{off}");
            bad_if(!(path.starts_with('/') || optional && path.is_empty()), key, why)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, parse};

    #[test]
    fn a_restart_timeout_shorter_than_the_stop_grace_plus_a_call_says_why() {
        let err =
            parse("[runtime]\nstop_grace = \"45s\"\nrestart_timeout = \"50s\"\n").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("runtime.restart_timeout"), "{text}");
        assert!(text.contains("stop_grace + runtime.call_timeout = 55s"), "{text}");
        assert!(text.contains("ignores SIGTERM"), "{text}");
        // The default grace and call deadline fit the default restart timeout with room.
        assert!(parse("[runtime]\nstop_grace = \"45s\"\nrestart_timeout = \"56s\"\n").is_ok());
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[runtime]\nworker_label = \"\"", "runtime.worker_label"),
            (
                "[runtime]\nstop_grace = \"90s\"\nrestart_timeout = \"60s\"",
                "runtime.restart_timeout",
            ),
            (
                // The stop grace plus one call's time is the least a restart can take.
                "[runtime]\nstop_grace = \"60s\"\nrestart_timeout = \"70s\"",
                "runtime.restart_timeout",
            ),
            ("[runtime]\ncall_timeout = \"0s\"", "runtime.call_timeout"),
            ("[runtime]\nkind = \"rkt\"", "runtime.kind"),
            ("[runtime]\npodman_socket = \"podman.sock\"", "runtime.podman_socket"),
            ("[runtime]\ncri_socket = \"containerd.sock\"", "runtime.cri_socket"),
            ("[runtime]\npod_resources_socket = \"kubelet.sock\"", "runtime.pod_resources_socket"),
        ]);
    }
}
