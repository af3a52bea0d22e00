//! The node as its Kubernetes Node object describes it: the raw labels, taints and allocatable
//! resources the Node source reads ([`RawNode`]), and what Vigil makes of them ([`NodeInfo`]:
//! GKE's pool, provisioning model, accelerator and TPU topology, and GKE's own maintenance
//! signals). `crate::node::policy_info` computes the one from the other.

use std::collections::BTreeMap;

use crate::clock::Millis;

/// A taint of the Node, as the API server stores it (its `value` empty when it has none): the
/// shape of the taints Vigil owns.
pub(crate) type NodeTaint = super::node::Taint;

/// What the Node source read, unparsed: `metadata.labels`, `spec.taints` and
/// `status.allocatable` (quantities as the API server writes them, e.g. `"4"`, `"16Gi"`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawNode {
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) taints: Vec<NodeTaint>,
    pub(crate) allocatable: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp` is set: the Node is being deleted.
    pub(crate) deleting: bool,
    /// The kubelet's graceful node shutdown: its `Ready` condition is `False` with the reason or
    /// message "node is shutting down"; the text as read.
    pub(crate) shutting_down: Option<String>,
}

/// How the node's VM was provisioned, from GKE's labels.
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum Provisioning {
    /// On-demand (`cloud.google.com/gke-provisioning=standard`).
    Standard,
    /// A Spot VM (`cloud.google.com/gke-spot=true` or `gke-provisioning=spot`): preempted at
    /// any time with about 30 s of notice.
    Spot,
    /// A legacy preemptible VM (`cloud.google.com/gke-preemptible=true`).
    Preemptible,
    /// Flex-start (Dynamic Workload Scheduler, `cloud.google.com/gke-flex-start=true`): a VM of
    /// limited run time.
    FlexStart,
    /// A `gke-provisioning` value Vigil does not know, kept as GKE wrote it.
    Other(String),
}

impl Provisioning {
    /// The value for the node record and `vigil status`: the model's name, or GKE's own value.
    pub fn as_str(&self) -> &str {
        match self {
            Provisioning::Other(v) => v,
            known => known.metric_label(),
        }
    }

    /// The fixed metric label value (`other` for a value Vigil does not know).
    pub(crate) fn metric_label(&self) -> &'static str {
        self.into()
    }

    /// Whether the VM can be taken back at any time (its termination is a preemption).
    pub(crate) fn preemptible(&self) -> bool {
        matches!(self, Provisioning::Spot | Provisioning::Preemptible)
    }
}

/// A TPU slice's topology, `cloud.google.com/gke-tpu-topology` (e.g. `2x2x4`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TpuTopology {
    /// The label's value as GKE wrote it.
    pub(crate) text: String,
    /// The chips of the whole slice: the product of the dimensions.
    pub(crate) chips: u64,
}

/// GKE's own maintenance signals on the Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GkeMaintenance {
    /// `cloud.google.com/scheduled-maintenance-time` is set: a host maintenance is scheduled.
    pub(crate) scheduled: bool,
    /// Its value, the window's start (Unix seconds in the label, ms here); `None` when absent or
    /// not a number.
    pub(crate) scheduled_at: Option<Millis>,
    /// `cloud.google.com/active-node-maintenance=ONGOING`: GKE is stopping the node's workloads
    /// for a host maintenance.
    pub(crate) active: bool,
    /// The taint `cloud.google.com/impending-node-termination` (any effect): GKE is about to
    /// terminate the node.
    pub(crate) terminating: bool,
}

/// What Vigil knows of its node from the Node object, as of the last successful read.
///
/// Published on a `tokio::sync::watch` channel (`None` until the first read succeeds; see
/// `crate::node::info`) for every part of the engine that needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// `cloud.google.com/gke-nodepool`.
    pub(crate) pool: Option<String>,
    pub(crate) provisioning: Option<Provisioning>,
    /// `cloud.google.com/gke-accelerator`, e.g. `nvidia-h100-80gb`.
    pub(crate) gpu_accelerator: Option<String>,
    /// `cloud.google.com/gke-tpu-accelerator`, e.g. `tpu-v5p-slice`.
    pub(crate) tpu_accelerator: Option<String>,
    /// `cloud.google.com/gke-tpu-topology`.
    pub(crate) tpu_topology: Option<TpuTopology>,
    /// TPU chips on this host: the Node's allocatable `google.com/tpu`.
    pub(crate) tpu_chips_per_host: Option<u64>,
    /// Whether the node is one host of a multi-host TPU slice (the topology has more chips than
    /// this host); `None` when either number is unknown.
    pub(crate) multi_host_tpu: Option<bool>,
    pub(crate) maintenance: GkeMaintenance,
    /// `status.allocatable`, as read (quantities are strings, as the API writes them).
    pub(crate) allocatable: BTreeMap<String, String>,
    /// `spec.taints`, as read (every taint, whoever set it).
    pub(crate) taints: Vec<NodeTaint>,
    /// The Node is being deleted (`metadata.deletionTimestamp`).
    pub(crate) deleting: bool,
    /// The kubelet is shutting the node down (its `Ready` condition says so).
    pub(crate) shutting_down: Option<String>,
    /// Values that were present but could not be understood, one sentence each, naming the key
    /// (the source logs each once).
    pub(crate) problems: Vec<String>,
}

impl NodeInfo {
    /// The accelerator type: the GPU's, else the TPU's.
    pub(crate) fn accelerator(&self) -> Option<&str> {
        self.gpu_accelerator.as_deref().or(self.tpu_accelerator.as_deref())
    }
}

/// The extended resource GKE's TPU device plugin advertises, one per chip.
pub(crate) const TPU_RESOURCE: &str = "google.com/tpu";

/// The node's pool and slice for the fleet view and opportunistic maintenance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Place {
    /// Empty when neither the config nor the Node names one.
    pub(crate) pool: String,
    /// Empty when the node belongs to no slice.
    pub(crate) slice: String,
}

/// `fleet.pool` when set (an explicit override), else the Node's pool label; `fleet.slice` when
/// set, else the pool when the node is one host of a multi-host TPU slice (GKE makes each such
/// slice a node pool of its own), else none.
pub(crate) fn place(fleet: &crate::config::FleetConfig, info: Option<&NodeInfo>) -> Place {
    let pool = if fleet.pool.is_empty() {
        info.and_then(|i| i.pool.clone()).unwrap_or_default()
    } else {
        fleet.pool.clone()
    };
    let slice = if !fleet.slice.is_empty() {
        fleet.slice.clone()
    } else if info.is_some_and(|i| i.multi_host_tpu == Some(true)) {
        pool.clone()
    } else {
        String::new()
    };
    Place { pool, slice }
}
