//! `[docker]`: the Docker Engine API's address.

use serde::{Deserialize, Serialize};

use super::{bad_if, has_scheme, ConfigError};

/// The Docker Engine API. The keys that are not Docker-specific are in `[runtime]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct DockerConfig {
    /// `unix:///var/run/docker.sock` or `tcp://host:port`; env `DOCKER_HOST`.
    #[educe(Default(expression = "unix:///var/run/docker.sock".into()))]
    pub(crate) host: String,
}

impl DockerConfig {
    /// An address the Docker client can dial.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let why = format!("`{}` is not a unix://, tcp:// or http:// address", self.host);
        bad_if(!has_scheme(&self.host, &["unix://", "tcp://", "http://"]), "docker.host", why)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, parse};
    use super::super::RuntimeKind;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[("[docker]\nhost = \"/var/run/docker.sock\"", "docker.host")]);
    }

    #[test]
    fn keys_that_moved_to_runtime_are_refused_naming_their_new_place() {
        for key in [
            "worker_label = \"team.worker\"",
            "log_lines = 50",
            "log_timeout = \"5s\"",
            "stop_grace = \"5s\"",
            "restart_timeout = \"2m\"",
        ] {
            let err = parse(&format!("[docker]\n{key}\n")).unwrap_err().to_string();
            let name = key.split(' ').next().unwrap();
            assert!(
                err.contains(&format!("docker.{name} was removed: use runtime.{name}")),
                "{err}"
            );
        }
        let c = parse("[runtime]\nkind = \"podman\"\n").unwrap();
        assert_eq!(c.runtime.kind, RuntimeKind::Podman);
        assert_eq!(c.runtime.podman_socket, "/run/podman/podman.sock");
    }
}
