//! This machine's Node object, read from the API server: its labels, taints and allocatable
//! resources ([`RawNode`]), which GKE fills with the node's pool, provisioning model,
//! accelerator, TPU topology and its own maintenance signals. One GET per call, bounded by
//! `crate::kube::client::CALL_TIMEOUT`. RBAC: `get` on `nodes` (already needed to patch the Node).

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::kube::client::CALL_TIMEOUT;
use crate::vocab::node_info::{NodeTaint, RawNode};

#[async_trait]
pub trait NodeReader: Send + Sync {
    /// The Node `node` as the API server has it now.
    async fn read(&self, node: &str) -> Result<RawNode, NodeReadError>;
}

/// Why the Node could not be read, worded for the operator, the cause kept.
#[derive(Debug, thiserror::Error)]
pub enum NodeReadError {
    #[error("the Kubernetes API did not answer a read of node {node:?} within {after:?}")]
    Timeout { node: String, after: Duration },
    #[error("forbidden: the agent's ServiceAccount needs `get` on `nodes` (deploy/base/rbac.yaml): {message}")]
    Forbidden { message: String },
    #[error(
        "node {node:?} was not found; check that NODE_NAME is this machine's Node name: {message}"
    )]
    NotFound { node: String, message: String },
    #[error("reading node {node:?}: {source}")]
    Api { node: String, source: kube::Error },
}

/// [`NodeReader`] through `kube`.
pub struct KubeNodeReader {
    client: kube::Client,
}

impl KubeNodeReader {
    /// From `kubernetes.api_url`, or (empty) the in-cluster ServiceAccount / the kubeconfig.
    pub async fn connect(api_url: &str) -> Result<Self, super::client::ConnectError> {
        Ok(KubeNodeReader { client: super::client::kube_client(api_url).await? })
    }
}

/// The parts of a Node Vigil reads.
pub(crate) fn raw_node(node: &Node) -> RawNode {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let taints = node.spec.iter().flat_map(|s| s.taints.iter().flatten());
    let taints = taints.map(|t| NodeTaint {
        key: t.key.clone(),
        value: t.value.clone().unwrap_or_default(),
        effect: t.effect.clone(),
    });
    let allocatable = node.status.iter().flat_map(|s| s.allocatable.iter().flatten());
    let allocatable = allocatable.map(|(k, q)| (k.clone(), q.0.clone())).collect();
    // NB: the kubelet's graceful node shutdown says so in the Ready condition ("node is
    // shutting down", Kubernetes' "Node shutdowns" page); nothing else on the Node does.
    let mut conditions = node.status.iter().flat_map(|s| s.conditions.iter().flatten());
    let not_ready = conditions.find(|c| c.type_ == "Ready" && c.status == "False");
    let texts = not_ready.into_iter().flat_map(|c| [c.reason.as_deref(), c.message.as_deref()]);
    let says_so = |t: &&str| t.to_ascii_lowercase().contains("shutting down");
    let shutting_down = texts.flatten().find(says_so).map(str::to_string);
    let deleting = node.metadata.deletion_timestamp.is_some();
    RawNode { labels, taints: taints.collect(), allocatable, deleting, shutting_down }
}

#[async_trait]
impl NodeReader for KubeNodeReader {
    async fn read(&self, node: &str) -> Result<RawNode, NodeReadError> {
        let api: Api<Node> = Api::all(self.client.clone());
        match tokio::time::timeout(CALL_TIMEOUT, api.get(node)).await {
            Err(_) => Err(NodeReadError::Timeout { node: node.to_string(), after: CALL_TIMEOUT }),
            Ok(Ok(n)) => Ok(raw_node(&n)),
            Ok(Err(kube::Error::Api(e))) if e.code == 403 => {
                Err(NodeReadError::Forbidden { message: e.message })
            }
            Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                Err(NodeReadError::NotFound { node: node.to_string(), message: e.message })
            }
            Ok(Err(source)) => Err(NodeReadError::Api { node: node.to_string(), source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 27: what says the node is going away — a deletion under way, the kubelet's
    /// graceful shutdown in the Ready condition — and what does not (NotReady for another
    /// reason).
    #[test]
    fn a_node_being_deleted_or_shutting_down_is_read_so() {
        let node = |v: serde_json::Value| raw_node(&serde_json::from_value::<Node>(v).unwrap());
        let deleting = node(serde_json::json!({
            "metadata": {"name": "n", "deletionTimestamp": "2026-12-02T07:00:00Z"}
        }));
        assert!(deleting.deleting && deleting.shutting_down.is_none());
        let ready = |status: &str, reason: &str, message: &str| {
            node(serde_json::json!({
                "metadata": {"name": "n"},
                "status": {"conditions": [{"type": "Ready", "status": status,
                    "reason": reason, "message": message}]}
            }))
        };
        let shutting = ready("False", "KubeletNotReady", "node is shutting down");
        assert_eq!(shutting.shutting_down.as_deref(), Some("node is shutting down"));
        assert!(!shutting.deleting);
        assert_eq!(ready("False", "KubeletNotReady", "PLEG is not healthy").shutting_down, None);
        assert_eq!(ready("True", "KubeletReady", "node is shutting down").shutting_down, None);
    }

    #[test]
    fn a_node_is_read_as_the_api_writes_it() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "labels": {"cloud.google.com/gke-nodepool": "p"}},
            "spec": {"taints": [
                {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"},
                {"key": "k", "value": "v", "effect": "NoExecute"}
            ]},
            "status": {"allocatable": {"google.com/tpu": "4", "memory": "16Gi"}}
        }))
        .unwrap();
        let raw = raw_node(&node);
        assert_eq!(raw.labels["cloud.google.com/gke-nodepool"], "p");
        assert_eq!(raw.taints.len(), 2);
        assert_eq!(raw.taints[0].value, "");
        assert_eq!(raw.taints[1].effect, "NoExecute");
        assert_eq!(raw.allocatable["google.com/tpu"], "4");
        assert_eq!(raw.allocatable["memory"], "16Gi");
        let bare: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(raw_node(&bare), RawNode::default());
    }
}
