//! Pods from the Kubernetes API: only what the CRI restart needs to know, the pod's
//! `restartPolicy` (a stop restarts the container only under Always / OnFailure). RBAC: `get` on
//! `pods`.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

/// A pod's `spec.restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The API's spelling; an empty or missing policy is the API default, `Always`.
    pub fn parse(s: Option<&str>) -> Option<RestartPolicy> {
        match s.unwrap_or("Always") {
            "Always" | "" => Some(RestartPolicy::Always),
            "OnFailure" => Some(RestartPolicy::OnFailure),
            "Never" => Some(RestartPolicy::Never),
            _ => None,
        }
    }
}

#[async_trait]
pub trait PodApi: Send + Sync {
    /// The pod's restart policy; `Ok(None)` when the pod does not exist.
    async fn restart_policy(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<Option<RestartPolicy>, String>;
}

/// [`PodApi`] through `kube`.
pub struct KubePods {
    client: kube::Client,
}

impl KubePods {
    /// From `kubernetes.api_url`, or (empty) the in-cluster ServiceAccount / the kubeconfig.
    pub async fn connect(api_url: &str) -> Result<Self, String> {
        Ok(KubePods {
            client: kube_client(api_url).await?,
        })
    }
}

/// A client for `kubernetes.api_url`, or (empty) the in-cluster ServiceAccount / the
/// kubeconfig, with short deadlines: the callers (a read before a restart, a token review before
/// a worker's write) must not hang on a silent API server for kube's default 295 s.
pub(crate) async fn kube_client(api_url: &str) -> Result<kube::Client, String> {
    let mut config = if api_url.is_empty() {
        kube::Config::infer().await.map_err(|e| e.to_string())?
    } else {
        kube::Config::new(api_url.parse().map_err(|e| format!("{api_url:?}: {e}"))?)
    };
    config.connect_timeout = Some(std::time::Duration::from_secs(5));
    config.read_timeout = Some(std::time::Duration::from_secs(10));
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

#[async_trait]
impl PodApi for KubePods {
    async fn restart_policy(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<Option<RestartPolicy>, String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), api.get_opt(pod))
            .await
            .map_err(|_| "the Kubernetes API did not answer within 10s".to_string())?;
        match got {
            Ok(None) => Ok(None),
            Ok(Some(p)) => {
                let policy = p.spec.and_then(|s| s.restart_policy);
                RestartPolicy::parse(policy.as_deref())
                    .map(Some)
                    .ok_or_else(|| format!("unknown restartPolicy {policy:?}"))
            }
            Err(kube::Error::Api(e)) if e.code == 403 => Err(format!(
                "forbidden: the agent's ServiceAccount needs `get` on `pods` (deploy/base/rbac.yaml): {}",
                e.message
            )),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_with_the_api_default() {
        assert_eq!(RestartPolicy::parse(None), Some(RestartPolicy::Always));
        assert_eq!(RestartPolicy::parse(Some("")), Some(RestartPolicy::Always));
        assert_eq!(
            RestartPolicy::parse(Some("OnFailure")),
            Some(RestartPolicy::OnFailure)
        );
        assert_eq!(
            RestartPolicy::parse(Some("Never")),
            Some(RestartPolicy::Never)
        );
        assert_eq!(RestartPolicy::parse(Some("Sometimes")), None);
    }
}
