//! Pods from the Kubernetes API, one client for what the agent reads of them:
//! - a pod with its owners (`crate::kube::workloads`), for the CRI restart (a stop restarts the
//!   container only under Always / OnFailure). RBAC: `get` on `pods`;
//! - the pods bound to this node ([`NodePod`]), for the opportunistic-maintenance idle check
//!   (which of them request an accelerator) and the checkpoint-budget check (each worker pod's
//!   `terminationGracePeriodSeconds`), and the devices the kubelet reports `Unhealthy` to them
//!   (`crate::accel::gpu::kubelet`). RBAC: `list` on `pods`, with a `spec.nodeName` field
//!   selector, so the answer is one node's pods, not the cluster's.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use kube::api::{Api, ListParams};

use crate::kube::client::kube_client;
pub use crate::kube::client::{ConnectError, PodError};
use crate::kube::podresources::is_accelerator;

/// The API server's default `terminationGracePeriodSeconds`, which it sets on create.
pub(crate) const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// The lowest priority the kubelet's graceful node shutdown counts as critical (the
/// `system-cluster-critical` class's value; `system-node-critical` is above it).
pub(crate) const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// What the agent reads of one pod bound to this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`).
    pub(crate) phase: String,
    pub(crate) labels: BTreeMap<String, String>,
    /// A container or init container requests or limits an accelerator (`nvidia.com/*`,
    /// `google.com/tpu`).
    pub(crate) accelerators: bool,
    /// `spec.terminationGracePeriodSeconds` ([`DEFAULT_GRACE`] where unset).
    pub(crate) grace: Duration,
    /// `spec.priority` at or above [`CRITICAL_PRIORITY`]: graceful node shutdown stops it
    /// in the critical pods' phase, after the others.
    pub(crate) critical: bool,
    /// The devices the kubelet reports `Unhealthy` to its containers.
    pub(crate) unhealthy: Vec<UnhealthyDevice>,
}

/// A device allocated to a container that the kubelet reports `Unhealthy` in the pod's status
/// (KEP-4680, `status.containerStatuses[].allocatedResourcesStatus`, beta in 1.36): the device
/// plugin's (or DRA driver's) own health check, seen by the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnhealthyDevice {
    pub container: String,
    /// The resource (`nvidia.com/gpu`), or `claim:<claim>/<request>` under DRA.
    pub resource: String,
    /// The device plugin's id (`GPU-…`, `nvidia0`), or `<driver>/<pool>/<device>` under DRA.
    pub device: String,
}

/// The devices of these container statuses the kubelet reports `Unhealthy`.
fn unhealthy<'a>(statuses: impl Iterator<Item = &'a ContainerStatus>) -> Vec<UnhealthyDevice> {
    let resources =
        statuses.flat_map(|c| c.allocated_resources_status.iter().flatten().map(move |r| (c, r)));
    let devices = resources.flat_map(|(c, r)| r.resources.iter().flatten().map(move |d| (c, r, d)));
    devices
        .filter(|(_, _, d)| d.health.as_deref() == Some("Unhealthy"))
        .map(|(c, r, d)| UnhealthyDevice {
            container: c.name.clone(),
            resource: r.name.clone(),
            device: d.resource_id.clone(),
        })
        .collect()
}

impl NodePod {
    /// From the API's object.
    pub(crate) fn from_pod(p: &Pod) -> NodePod {
        let spec = p.spec.as_ref();
        let named =
            |m: &Option<BTreeMap<String, _>>| m.iter().flatten().any(|(k, _)| is_accelerator(k));
        let wants = |c: &Container| {
            c.resources.as_ref().is_some_and(|r| named(&r.requests) || named(&r.limits))
        };
        let accelerators = spec.is_some_and(|s| {
            s.containers.iter().any(wants) || s.init_containers.iter().flatten().any(wants)
        });
        let grace_seconds = spec.and_then(|s| s.termination_grace_period_seconds);
        let status = p.status.as_ref();
        let statuses = status.into_iter().flat_map(|s| {
            let all = s.container_statuses.iter().flatten();
            all.chain(s.init_container_statuses.iter().flatten())
        });
        NodePod {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
            labels: p.metadata.labels.clone().unwrap_or_default(),
            accelerators,
            grace: grace_seconds.map_or(DEFAULT_GRACE, |g| Duration::from_secs(g.max(0) as u64)),
            critical: spec.and_then(|s| s.priority).is_some_and(|v| v >= CRITICAL_PRIORITY),
            unhealthy: unhealthy(statuses),
        }
    }

    /// Succeeded or Failed: its containers are gone, and so is what they held.
    pub(crate) fn terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }

    /// A running (or starting) pod carrying the opt-in label `worker_label`: a worker's pod.
    pub(crate) fn is_worker(&self, worker_label: &str) -> bool {
        !self.terminal() && self.labels.contains_key(worker_label)
    }

    /// `namespace/name`.
    pub(crate) fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

use crate::vocab::workload::Workload;

/// What a pods call gives: its answer, or the [`PodError`] that stopped it.
type Result<T, E = PodError> = std::result::Result<T, E>;

#[async_trait]
pub trait PodApi: Send + Sync {
    /// Every pod bound to `node`, in every namespace.
    async fn node_pods(&self, node: &str) -> Result<Vec<NodePod>>;

    /// The pod with its owners (`crate::kube::workloads`), for the choice of how a hung worker
    /// of `container` is restarted; `Ok(None)` when the pod does not exist.
    async fn workload(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<Option<Workload>>;
}

/// [`PodApi`] through `kube`.
pub struct KubePods {
    client: kube::Client,
}

impl KubePods {
    /// From `kubernetes.api_url`, or (empty) the in-cluster ServiceAccount / the kubeconfig.
    pub async fn connect(api_url: &str) -> Result<Self, ConnectError> {
        Ok(KubePods { client: kube_client(api_url).await? })
    }

    /// Every pod bound to `node`, through a client made for this one call (`vigil doctor`'s
    /// idle check, the checkpoint-budget check).
    pub(crate) async fn list_node(api_url: &str, node: &str) -> Result<Vec<NodePod>> {
        KubePods::connect(api_url).await?.node_pods(node).await
    }
}

#[async_trait]
impl PodApi for KubePods {
    async fn workload(&self, ns: &str, pod: &str, container: &str) -> Result<Option<Workload>> {
        crate::kube::workloads::read(&self.client, ns, pod, container).await
    }

    async fn node_pods(&self, node: &str) -> Result<Vec<NodePod>> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = PodError::bounded(api.list(&params), "list", "pods").await?;
        Ok(list.items.iter().map(NodePod::from_pod).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::workload::RestartPolicy;

    #[test]
    fn policies_parse_with_the_api_default() {
        assert_eq!(RestartPolicy::parse(None), Some(RestartPolicy::Always));
        assert_eq!(RestartPolicy::parse(Some("")), Some(RestartPolicy::Always));
        assert_eq!(RestartPolicy::parse(Some("OnFailure")), Some(RestartPolicy::OnFailure));
        assert_eq!(RestartPolicy::parse(Some("Never")), Some(RestartPolicy::Never));
        assert_eq!(RestartPolicy::parse(Some("Sometimes")), None);
    }

    fn pod(v: serde_json::Value) -> NodePod {
        NodePod::from_pod(&serde_json::from_value(v).unwrap())
    }

    #[test]
    fn a_pod_is_read_with_the_api_defaults() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ml"},
            "spec": {"containers": [{"name": "c"}]}
        }));
        assert_eq!(p.display(), "ml/a");
        assert_eq!(p.grace, DEFAULT_GRACE);
        assert!(!p.accelerators && !p.critical && !p.terminal());
    }

    #[test]
    fn accelerators_are_read_from_requests_limits_and_init_containers() {
        let cases = [
            (
                serde_json::json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
                true,
            ),
            (
                serde_json::json!({"containers": [{"name": "c", "resources": {"requests": {"google.com/tpu": "4"}}}]}),
                true,
            ),
            (
                serde_json::json!({"containers": [{"name": "c"}], "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}),
                true,
            ),
            (
                serde_json::json!({"containers": [{"name": "c", "resources": {"limits": {"cpu": "4", "memory": "1Gi"}}}]}),
                false,
            ),
        ];
        for (spec, want) in cases {
            let p = pod(
                serde_json::json!({"metadata": {"name": "a", "namespace": "ml"}, "spec": spec.clone()}),
            );
            assert_eq!(p.accelerators, want, "{spec}");
        }
    }

    #[test]
    fn grace_priority_and_phase_are_read() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "a", "namespace": "kube-system", "labels": {"vigil.worker": "w0"}},
            "spec": {"containers": [{"name": "c"}], "terminationGracePeriodSeconds": 10, "priority": 2000001000},
            "status": {"phase": "Succeeded"}
        }));
        assert_eq!(p.grace, Duration::from_secs(10));
        assert!(p.critical && p.terminal());
        assert!(!p.is_worker("vigil.worker"), "a finished pod is no one's worker");
        assert_eq!(p.labels.get("vigil.worker").map(String::as_str), Some("w0"));
    }
}
