//! The Vigil-owned state of the Kubernetes Node — labels, annotations, taints and conditions
//! Vigil wants, the type of the Events it records — and the names of Vigil's taints and
//! conditions. The features' policies compute it (maintenance, GPU and TPU health); the Node
//! adapter (`crate::kube::node`) makes the API server show it; `vigil cleanup` removes it.

use std::collections::BTreeMap;

use crate::config::KubernetesConfig;

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

/// The taint (after the label prefix) while termination is imminent.
pub(crate) const TERMINATION_TAINT: &str = "termination-imminent";
/// The taint (after the label prefix) while a GPU has failed.
pub(crate) const GPU_FAILED_TAINT: &str = "gpu-failed";
/// The taint (after the label prefix) while the node's TPU chips have failed.
pub(crate) const TPU_FAILED_TAINT: &str = "tpu-failed";

/// The keys of every taint Vigil may set on its Node (`vigil cleanup` removes these, whatever
/// their effect).
pub fn taint_keys(k: &KubernetesConfig) -> Vec<String> {
    let p = &k.label_prefix;
    vec![
        format!("{p}{TERMINATION_TAINT}"),
        format!("{p}{GPU_FAILED_TAINT}"),
        format!("{p}{TPU_FAILED_TAINT}"),
    ]
}

/// The types of every Node condition Vigil sets (`vigil cleanup` removes these).
pub const CONDITIONS: [&str; 3] = [MAINTENANCE_CONDITION, GPU_CONDITION, TPU_CONDITION];

// NB: one polarity for every Vigil condition, node-problem-detector's and the kubelet's pressure
// conditions': `True` means a problem (docs/kubernetes.md says why).

/// The condition type of the maintenance state: True while a notice stands.
pub(crate) const MAINTENANCE_CONDITION: &str = "VigilMaintenance";
/// The condition type of the GPU health: True while a GPU has failed.
pub(crate) const GPU_CONDITION: &str = "VigilGPUUnhealthy";
/// The condition type of the TPU health: True while the TPU chips have failed.
pub(crate) const TPU_CONDITION: &str = "VigilTPUUnhealthy";

/// A condition in Vigil's polarity: `problem` Some(true) is `True`, Some(false) `False`, and
/// `None` (no verdict) `Unknown`.
pub(crate) fn problem_condition(
    kind: &str,
    problem: Option<bool>,
    reason: &str,
    message: String,
) -> NodeCondition {
    NodeCondition {
        kind: kind.into(),
        status: match problem {
            Some(true) => ConditionStatus::True,
            Some(false) => ConditionStatus::False,
            None => ConditionStatus::Unknown,
        },
        reason: reason.into(),
        message,
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s[..cut].to_string()
}

/// A hardware failure's `<key>=true:NoSchedule` taint on the Node while `on`, removed otherwise
/// (the GPU and TPU failure taints).
pub(crate) fn failure_taint(d: &mut NodeDesired, key: String, on: bool) {
    if on {
        d.add_taints.push(Taint {
            key,
            value: "true".into(),
            effect: "NoSchedule".into(),
        });
    } else {
        d.remove_taints.push(key);
    }
}
