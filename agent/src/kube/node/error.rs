//! Why a Node call failed, in words the operator can act on: [`NodeError`], and the mapping from a
//! `kube` error of one API call ([`Call`]) to it (a 403 names the missing RBAC rule). Kept apart
//! from the client so the wording and the fixed metric labels (`op`) read, and are tested, in
//! one place.

/// Why a Node call failed, worded for the operator who has to fix it.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The Node does not exist: `NODE_NAME` is wrong, or the Node was deleted; `op` (`get` or
    /// `patch`) is the call that found it missing.
    #[error(
        "node {node:?} was not found by the Kubernetes API ({op}); check that NODE_NAME is this \
         machine's Node name (set it from spec.nodeName with the downward API)"
    )]
    NotFound { node: String, op: &'static str },
    /// RBAC refused the call: the agent's ClusterRole lacks a rule, `verb` (`get`, `patch` or
    /// `create`) on `resource` (`nodes` or `events`) of API `group` (`""`, core, for nodes;
    /// `events.k8s.io` for events).
    #[error(
        "the Kubernetes API refused to {verb} {resource} (403 Forbidden): the agent's \
         ClusterRole needs the rule {{apiGroups: [\"{group}\"], resources: [\"{resource}\"], \
         verbs: [\"{verb}\"]}} (Vigil needs get and patch on nodes, and create and patch on \
         events in events.k8s.io); the server said: {message}"
    )]
    Forbidden { verb: &'static str, resource: &'static str, group: &'static str, message: String },
    /// Every attempt lost the race with another writer of the Node.
    #[error(
        "could not patch node {node:?}: {attempts} attempts in a row conflicted with other \
         writers (409 Conflict); the next cycle tries again"
    )]
    Conflict { node: String, attempts: u32 },
    /// The Node the API returned has taints to replace but no `metadata.resourceVersion`, so the
    /// replacement could not be made conditional and might clobber another writer's taints.
    #[error(
        "node {node:?} as returned by the API has no metadata.resourceVersion, so its taints \
         cannot be replaced safely; nothing was written"
    )]
    NoResourceVersion { node: String },
    /// Any other answer from the API server, or the server could not be reached.
    #[error("Kubernetes API call `{verb} {resource}` for node {node:?} failed: {source}")]
    Api { verb: &'static str, resource: &'static str, node: String, source: kube::Error },
    /// The Node came back in a shape that could not be read as JSON.
    #[error("node {node:?} as returned by the API could not be read: {source}")]
    Decode { node: String, source: serde_json::Error },
    /// No Kubernetes client could be built (no kubeconfig, not in a cluster, bad URL).
    #[error(
        "cannot build a Kubernetes client ({context}): {source}; in a cluster, check the \
         ServiceAccount token mount; outside, check KUBECONFIG"
    )]
    Client { context: String, source: Box<dyn std::error::Error + Send + Sync> },
}

impl NodeError {
    /// No client: [`NodeError::Client`] with its context and cause.
    pub(super) fn client(context: impl Into<String>, source: impl Into<crate::BoxError>) -> Self {
        NodeError::Client { context: context.into(), source: source.into() }
    }

    /// The call that failed, as a fixed metric label: `get`, `patch` (of the Node) or `event`
    /// (creating or counting an Event).
    ///
    /// Client construction counts as `get`: it is what the first GET would have needed.
    pub fn op(&self) -> &'static str {
        match self {
            NodeError::NotFound { op, .. } => op,
            NodeError::Forbidden { verb, resource, .. } | NodeError::Api { verb, resource, .. } => {
                match (*resource, *verb) {
                    ("events", _) => "event",
                    (_, "patch") => "patch",
                    _ => "get",
                }
            }
            NodeError::Conflict { .. } | NodeError::NoResourceVersion { .. } => "patch",
            NodeError::Decode { .. } | NodeError::Client { .. } => "get",
        }
    }
}

/// The API calls Vigil makes, for error messages and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    GetNode,
    PatchNode,
    /// The strategic-merge PATCH of the Node's status (Vigil's conditions).
    PatchNodeStatus,
    /// The Recorder's POST of a new Event.
    CreateEvent,
    /// The Recorder's PATCH of an Event's `series`, counting a repeat.
    PatchEvent,
}

impl Call {
    /// The call's verb, resource and API group.
    fn parts(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Call::GetNode => ("get", "nodes", ""),
            Call::PatchNode => ("patch", "nodes", ""),
            Call::PatchNodeStatus => ("patch", "nodes/status", ""),
            Call::CreateEvent => ("create", "events", "events.k8s.io"),
            Call::PatchEvent => ("patch", "events", "events.k8s.io"),
        }
    }

    /// Turns a `kube` error into one the operator can act on.
    pub(super) fn error(self, node: &str, err: kube::Error) -> NodeError {
        let (verb, resource, group) = self.parts();
        if let kube::Error::Api(status) = &err {
            // The code is the HTTP status kube parsed the Status body from; the reason is the
            // fallback for a body without a code.
            if is_not_found(&err) {
                if resource != "events" {
                    return NodeError::NotFound { node: node.to_string(), op: verb };
                }
            } else if status.code == 403 || status.reason == "Forbidden" {
                let message = status.message.clone();
                return NodeError::Forbidden { verb, resource, group, message };
            }
        }
        NodeError::Api { verb, resource, node: node.to_string(), source: err }
    }
}

/// Whether the API server refused a write because the object changed since it was read.
pub(super) fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409 || status.reason == "Conflict")
}

/// Whether the API server answered 404.
pub(super) fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404 || status.reason == "NotFound")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_ops_are_fixed_labels() {
        let forbidden = |call: Call| {
            let (verb, resource, group) = call.parts();
            NodeError::Forbidden { verb, resource, group, message: String::new() }
        };
        assert_eq!(forbidden(Call::GetNode).op(), "get");
        assert_eq!(forbidden(Call::PatchNode).op(), "patch");
        assert_eq!(forbidden(Call::CreateEvent).op(), "event");
        assert_eq!(forbidden(Call::PatchEvent).op(), "event");
        let msg = forbidden(Call::PatchEvent).to_string();
        assert!(
            msg.contains(
                "{apiGroups: [\"events.k8s.io\"], resources: [\"events\"], verbs: [\"patch\"]}"
            ),
            "{msg}"
        );
        let nf = NodeError::NotFound { node: "n1".into(), op: "get" };
        assert_eq!(nf.op(), "get");
        assert!(nf.to_string().contains("NODE_NAME"), "{nf}");
        let msg = forbidden(Call::PatchNode).to_string();
        assert!(msg.contains("resources: [\"nodes\"], verbs: [\"patch\"]"), "{msg}");
    }
}
