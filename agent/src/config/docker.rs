//! `[docker]`: the Docker Engine API's address, and the deprecated spellings of keys that moved
//! to `[runtime]`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, ConfigError, RuntimeConfig};

/// The Docker Engine API. The keys that are not Docker-specific moved to `[runtime]`; the old
/// spellings still work, with a deprecation line at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DockerConfig {
    /// `unix:///var/run/docker.sock` or `tcp://host:port`; env `DOCKER_HOST`.
    pub host: String,
    /// Deprecated: `runtime.worker_label`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_label: Option<String>,
    /// Deprecated: `runtime.log_lines`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_lines: Option<usize>,
    /// Deprecated: `runtime.log_timeout`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub log_timeout: Option<Duration>,
    /// Deprecated: `runtime.stop_grace`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub stop_grace: Option<Duration>,
    /// Deprecated: `runtime.restart_timeout`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub restart_timeout: Option<Duration>,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            host: "unix:///var/run/docker.sock".into(),
            worker_label: None,
            log_lines: None,
            log_timeout: None,
            stop_grace: None,
            restart_timeout: None,
        }
    }
}

impl DockerConfig {
    /// Move the deprecated keys to `runtime`, returning a warning for each.
    /// NB: the old key wins when both are set: it is the one the operator wrote last time.
    pub(super) fn move_deprecated(&mut self, r: &mut RuntimeConfig) -> Vec<String> {
        let mut moved = Vec::new();
        if let Some(v) = self.worker_label.take() {
            r.worker_label = v;
            moved.push("worker_label");
        }
        if let Some(v) = self.log_lines.take() {
            r.log_lines = v;
            moved.push("log_lines");
        }
        if let Some(v) = self.log_timeout.take() {
            r.log_timeout = v;
            moved.push("log_timeout");
        }
        if let Some(v) = self.stop_grace.take() {
            r.stop_grace = v;
            moved.push("stop_grace");
        }
        if let Some(v) = self.restart_timeout.take() {
            r.restart_timeout = v;
            moved.push("restart_timeout");
        }
        moved
            .into_iter()
            .map(|k| format!("docker.{k} is deprecated: use runtime.{k}"))
            .collect()
    }

    /// An address the Docker client can dial.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.host.starts_with("unix://")
            || self.host.starts_with("tcp://")
            || self.host.starts_with("http://"))
        {
            return bad(
                "docker.host",
                format!(
                    "`{}` is not a unix://, tcp:// or http:// address",
                    self.host
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::{assert_names_keys, parse};
    use super::super::RuntimeKind;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[("[docker]\nhost = \"/var/run/docker.sock\"", "docker.host")]);
    }

    #[test]
    fn old_docker_keys_still_work_and_say_so() {
        let c =
            parse("[docker]\nworker_label = \"team.worker\"\nrestart_timeout = \"2m\"\n").unwrap();
        assert_eq!(c.runtime.worker_label, "team.worker");
        assert_eq!(c.runtime.restart_timeout, Duration::from_secs(120));
        assert_eq!(c.docker.worker_label, None, "moved, not kept twice");
        assert_eq!(
            c.deprecated,
            vec![
                "docker.worker_label is deprecated: use runtime.worker_label",
                "docker.restart_timeout is deprecated: use runtime.restart_timeout",
            ]
        );
        let c = parse("[runtime]\nkind = \"cri\"\n").unwrap();
        assert_eq!(c.runtime.kind, RuntimeKind::Cri);
        let c = parse("[runtime]\nkind = \"podman\"\n").unwrap();
        assert_eq!(c.runtime.kind, RuntimeKind::Podman);
        assert_eq!(c.runtime.podman_socket, "/run/podman/podman.sock");
        assert!(c.deprecated.is_empty());
    }
}
