//! The Vigil-owned state of the Kubernetes Node: labels, annotations and taints Vigil wants, and
//! the type of the Events it records. The policy computes it (`crate::maintenance::policy`); the
//! Node adapter (`crate::kube::node`) makes the API server show it.

use std::collections::BTreeMap;

/// A taint Vigil owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// The state of Vigil-owned fields Vigil wants on the Node. Everything else on the Node
/// (labels, annotations, taints owned by others) must be left exactly as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeDesired {
    /// `Some(v)` sets, `None` removes. Only keys listed here are touched.
    pub labels: BTreeMap<String, Option<String>>,
    pub annotations: BTreeMap<String, Option<String>>,
    /// Taints to ensure present (matched by key + effect).
    pub add_taints: Vec<Taint>,
    /// Taint keys to ensure absent (any effect).
    ///
    /// A taint that `add_taints` asks for (same key and effect) is kept even when its key is
    /// listed here, so switching Vigil's taint from one effect to another is one change.
    pub remove_taints: Vec<String>,
    /// Node conditions Vigil owns (on the Node's status subresource), by type; other conditions
    /// (kubelet's `Ready`, node-problem-detector's) are never touched.
    pub conditions: Vec<NodeCondition>,
    /// Condition types Vigil wants off the Node (a retired type, or one with no verdict now);
    /// like [`NodeDesired::conditions`], only Vigil's own types are ever listed.
    pub remove_conditions: Vec<String>,
}

/// The status of a Node condition, as Kubernetes spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

/// A Node condition as node-problem-detector publishes them: remediation tools (medik8s NHC,
/// cluster autoscalers, dashboards) read conditions, not labels. Every Vigil condition has one
/// polarity, theirs: `True` means a problem (docs/kubernetes.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCondition {
    /// e.g. `VigilGPUUnhealthy`.
    pub kind: String,
    pub(crate) status: ConditionStatus,
    /// CamelCase, e.g. `Failed`, `Pending`.
    pub(crate) reason: String,
    pub(crate) message: String,
}

/// `Normal` or `Warning`, as Kubernetes Events have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    /// The Event's `type` field.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}
