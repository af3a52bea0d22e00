//! `[kubernetes]`: the Node object Vigil publishes its state on.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad_if, http_or_empty, ConfigError, Switch};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// `auto` (on when running in a cluster), `on`, or `off`.
    #[educe(Default(expression = Switch::Auto))]
    pub enabled: Switch,
    /// API server URL; empty = in-cluster config or kubeconfig.
    pub api_url: String,
    /// Prefix of the labels, annotations and taint Vigil writes on its Node.
    #[educe(Default(expression = "vigil.dev/".into()))]
    pub(crate) label_prefix: String,
    /// Put a `NoSchedule` taint on the Node while termination is imminent.
    #[educe(Default(expression = true))]
    pub(crate) taint_on_termination: bool,
    /// How often the agent reads its Node (GKE's labels, taints and allocatable resources: the
    /// pool, the provisioning model, the accelerator, GKE's maintenance signals).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30)))]
    pub(crate) read_interval: Duration,
}

impl KubernetesConfig {
    /// An HTTP API URL (or none) and a label prefix Kubernetes accepts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        http_or_empty("kubernetes.api_url", &self.api_url, "")?;
        let why = "must be at least 1s (one GET of the Node each time)";
        bad_if(self.read_interval < Duration::from_secs(1), "kubernetes.read_interval", why)?;
        let why = "must be a DNS subdomain followed by `/`, e.g. `vigil.dev/`";
        bad_if(!valid_prefix(&self.label_prefix), "kubernetes.label_prefix", why)
    }
}

/// `example.com/` — a DNS subdomain and a slash, as Kubernetes label prefixes are.
fn valid_prefix(p: &str) -> bool {
    let Some(domain) = p.strip_suffix('/') else { return false };
    !domain.is_empty()
        && domain.len() <= 253
        && domain.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_names_keys;
    use super::valid_prefix;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[kubernetes]\napi_url = \"k8s:443\"", "kubernetes.api_url"),
            ("[kubernetes]\nlabel_prefix = \"vigil\"", "kubernetes.label_prefix"),
            ("[kubernetes]\nread_interval = \"500ms\"", "kubernetes.read_interval"),
        ]);
    }

    #[test]
    fn label_prefixes_are_dns_subdomains_and_a_slash() {
        for ok in ["vigil.dev/", "a/", "x-1.example.com/"] {
            assert!(valid_prefix(ok), "{ok}");
        }
        for bad in ["vigil.dev", "/", "Vigil.dev/", "-a.dev/", "a..b/", "a_b/"] {
            assert!(!valid_prefix(bad), "{bad}");
        }
    }
}
