//! The Node's labels as sources (pure): what GKE's labels, taints and allocatable resources say
//! about the node ([`parse`]), the maintenance state GKE's own signals stand for
//! ([`labels_state`]), how that state joins the metadata server's ([`merge`]: the worse of the
//! two, so the label source never clears what the metadata source says). The node's place in the
//! fleet (`fleet.pool`/`fleet.slice` when set, else the labels) is `crate::vocab::node_info::place`.
//!
//! The keys, and where GKE documents them, are listed in docs/kubernetes.md ("GKE's node labels").

use crate::accel::tpu::policy::allocatable_chips;
use crate::clock::{parse_rfc3339, rfc3339, Millis};
use crate::maintenance::policy::signalled;
use crate::vocab::maintenance::{MaintenanceState, Phase, Source};
use crate::vocab::node_info::TPU_RESOURCE;
use crate::vocab::node_info::{GkeMaintenance, NodeInfo, Provisioning, RawNode, TpuTopology};

/// The node pool.
pub(crate) const POOL_LABEL: &str = "cloud.google.com/gke-nodepool";
/// `true` on Spot VMs.
pub(crate) const SPOT_LABEL: &str = "cloud.google.com/gke-spot";
/// `true` on (legacy) preemptible VMs.
pub(crate) const PREEMPTIBLE_LABEL: &str = "cloud.google.com/gke-preemptible";
/// `true` on flex-start (Dynamic Workload Scheduler) VMs.
pub(crate) const FLEX_START_LABEL: &str = "cloud.google.com/gke-flex-start";
/// The provisioning model: `standard`, `spot`, …
pub(crate) const PROVISIONING_LABEL: &str = "cloud.google.com/gke-provisioning";
/// The GPU type, e.g. `nvidia-h100-80gb`.
pub(crate) const GPU_ACCELERATOR_LABEL: &str = "cloud.google.com/gke-accelerator";
/// The TPU type, e.g. `tpu-v5p-slice`.
pub(crate) const TPU_ACCELERATOR_LABEL: &str = "cloud.google.com/gke-tpu-accelerator";
/// The TPU slice's topology, e.g. `2x2x4`.
pub(crate) const TPU_TOPOLOGY_LABEL: &str = "cloud.google.com/gke-tpu-topology";
/// Unix time (seconds) a scheduled host maintenance starts (GKE ≥ 1.31.1-gke.2008000, GPU and
/// TPU nodes).
pub(crate) const SCHEDULED_MAINTENANCE_LABEL: &str = "cloud.google.com/scheduled-maintenance-time";
/// `ONGOING` while GKE stops the node's workloads for a host maintenance.
pub(crate) const ACTIVE_MAINTENANCE_LABEL: &str = "cloud.google.com/active-node-maintenance";
/// The value of [`ACTIVE_MAINTENANCE_LABEL`] during the maintenance.
pub(crate) const ACTIVE_MAINTENANCE_ONGOING: &str = "ONGOING";
/// GKE's taint on a node about to be terminated (`NoSchedule`).
pub(crate) const IMPENDING_TERMINATION_TAINT: &str = "cloud.google.com/impending-node-termination";

/// Reasons (as `MaintenanceState::reasons`) of the label source.
pub(crate) const REASON_SCHEDULED: &str = "gke-scheduled-maintenance";
pub(crate) const REASON_ACTIVE: &str = "gke-active-node-maintenance";
pub(crate) const REASON_TERMINATION: &str = "gke-impending-node-termination";

/// A label's value when the key is present.
fn label<'a>(raw: &'a RawNode, key: &str) -> Option<&'a str> {
    raw.labels.get(key).map(String::as_str)
}

/// A `"true"`/`"false"` label: `Some(true)` only for `true`; a value that is neither is a
/// problem and counts as absent.
fn flag(raw: &RawNode, key: &str, problems: &mut Vec<String>) -> bool {
    match label(raw, key) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            problems
                .push(format!("label {key}={other:?} is neither \"true\" nor \"false\"; ignored"));
            false
        }
    }
}

/// A label that names something (pool, accelerator): an empty value is a problem.
fn name(raw: &RawNode, key: &str, problems: &mut Vec<String>) -> Option<String> {
    match label(raw, key) {
        None => None,
        Some("") => {
            problems.push(format!("label {key} is empty; ignored"));
            None
        }
        Some(v) => Some(v.to_string()),
    }
}

/// The provisioning model. A VM that may be preempted says so whatever else its labels say:
/// Spot (or preemptible) wins, then flex-start, then `gke-provisioning`.
fn provisioning(raw: &RawNode, problems: &mut Vec<String>) -> Option<Provisioning> {
    use Provisioning as P;
    let spot = flag(raw, SPOT_LABEL, problems);
    let preemptible = flag(raw, PREEMPTIBLE_LABEL, problems);
    let flex = flag(raw, FLEX_START_LABEL, problems);
    let model = name(raw, PROVISIONING_LABEL, problems).map(|v| match v.as_str() {
        "standard" => P::Standard,
        "spot" => P::Spot,
        _ => P::Other(v),
    });
    let flags = [(spot, P::Spot), (preemptible, P::Preemptible), (flex, P::FlexStart)];
    match (flags.into_iter().find_map(|(on, p)| on.then_some(p)), model) {
        (Some(f), Some(P::Standard)) => {
            let which = f.as_str();
            problems.push(format!(
                "label {PROVISIONING_LABEL}=standard disagrees with the node's {which} label; taken as {which}"
            ));
            Some(f)
        }
        (Some(f), _) => Some(f),
        (None, m) => m,
    }
}

/// `AxB` or `AxBxC`, every dimension a positive integer.
fn topology(raw: &RawNode, problems: &mut Vec<String>) -> Option<TpuTopology> {
    let text = label(raw, TPU_TOPOLOGY_LABEL)?;
    let chips = text.split('x').try_fold(1u64, |acc, d| {
        let n: u64 = d.parse().ok().filter(|n| *n > 0)?;
        acc.checked_mul(n)
    });
    match chips {
        Some(chips) if text.contains('x') => Some(TpuTopology { text: text.to_string(), chips }),
        _ => {
            problems.push(format!(
                "label {TPU_TOPOLOGY_LABEL}={text:?} is not a topology like 2x2x4; ignored"
            ));
            None
        }
    }
}

/// The host's TPU chips, `status.allocatable["google.com/tpu"]`: a whole number.
fn tpu_chips(raw: &RawNode, problems: &mut Vec<String>) -> Option<u64> {
    let q = raw.allocatable.get(TPU_RESOURCE)?;
    match allocatable_chips(q) {
        Some(n) => Some(u64::from(n)),
        None => {
            problems.push(format!(
                "allocatable {TPU_RESOURCE}={q:?} is not a whole number of chips; ignored"
            ));
            None
        }
    }
}

/// GKE's maintenance signals.
fn maintenance(raw: &RawNode, problems: &mut Vec<String>) -> GkeMaintenance {
    let scheduled_text = label(raw, SCHEDULED_MAINTENANCE_LABEL);
    let scheduled_at = scheduled_text.and_then(|t| match t.trim().parse::<i64>() {
        Ok(secs) if secs > 0 => secs.checked_mul(1000),
        _ => {
            problems.push(format!(
                "label {SCHEDULED_MAINTENANCE_LABEL}={t:?} is not a Unix time in seconds; a maintenance counts as scheduled with no known start"
            ));
            None
        }
    });
    let active = match label(raw, ACTIVE_MAINTENANCE_LABEL) {
        None => false,
        Some(ACTIVE_MAINTENANCE_ONGOING) => true,
        Some(other) => {
            problems.push(format!(
                "label {ACTIVE_MAINTENANCE_LABEL}={other:?} is not the documented {ACTIVE_MAINTENANCE_ONGOING}; ignored"
            ));
            false
        }
    };
    GkeMaintenance {
        scheduled: scheduled_text.is_some(),
        scheduled_at,
        active,
        terminating: raw.taints.iter().any(|t| t.key == IMPENDING_TERMINATION_TAINT),
    }
}

/// What the Node says about the node. Every key may be absent (a non-GKE cluster has none of
/// them); a value that is present but malformed is left out and named in `problems`.
pub(crate) fn parse(raw: &RawNode) -> NodeInfo {
    let mut problems = Vec::new();
    let tpu_topology = topology(raw, &mut problems);
    let tpu_chips_per_host = tpu_chips(raw, &mut problems);
    let multi_host_tpu = match (&tpu_topology, tpu_chips_per_host) {
        (Some(t), Some(per_host)) if per_host > 0 => Some(t.chips > per_host),
        _ => None,
    };
    NodeInfo {
        pool: name(raw, POOL_LABEL, &mut problems),
        provisioning: provisioning(raw, &mut problems),
        gpu_accelerator: name(raw, GPU_ACCELERATOR_LABEL, &mut problems),
        tpu_accelerator: name(raw, TPU_ACCELERATOR_LABEL, &mut problems),
        tpu_topology,
        tpu_chips_per_host,
        multi_host_tpu,
        maintenance: maintenance(raw, &mut problems),
        allocatable: raw.allocatable.clone(),
        taints: raw.taints.clone(),
        deleting: raw.deleting,
        shutting_down: raw.shutting_down.clone(),
        problems,
    }
}

/// The maintenance state GKE's signals stand for (the label source alone):
/// - the impending-termination taint: `terminating` (a preemption on a Spot or preemptible VM,
///   a host maintenance otherwise);
/// - `active-node-maintenance=ONGOING`: `ongoing`;
/// - `scheduled-maintenance-time`: `pending`, with the window's start from the label (none when
///   the value is not a time: caution then stands restarts down at once, as for a metadata
///   notice without a date).
pub(crate) fn labels_state(info: &NodeInfo) -> MaintenanceState {
    let m = &info.maintenance;
    let signals = [
        (m.terminating, REASON_TERMINATION),
        (m.active, REASON_ACTIVE),
        (m.scheduled, REASON_SCHEDULED),
    ];
    let preemptible = info.provisioning.as_ref().is_some_and(|p| p.preemptible());
    let worst_first = [m.terminating && preemptible, m.terminating, m.active, m.scheduled];
    MaintenanceState {
        window_start: m.scheduled_at.map(rfc3339),
        // NB: the labels do not say whether the event may be started early; only the metadata
        // server's `can_reschedule` lets opportunistic maintenance act (it stays false here).
        ..signalled(worst_first, &signals, Source::NodeLabels)
    }
}

/// A pending window's start for comparison: a start that is unknown or not a time is the
/// nearest of all (caution wins, as in `pending_near`).
fn start_key(st: &MaintenanceState) -> Millis {
    st.window_start.as_deref().and_then(parse_rfc3339).unwrap_or(Millis::MIN)
}

/// The one state the node acts on, from the metadata server's and the labels': the worse of the
/// two. The phase is the higher of both (none < pending < ongoing < terminating); between two
/// pending notices, the one whose window starts first (or has no known start). The window and
/// interruption come from the worse state (an ongoing or terminating one without a window shows
/// the other's); the reasons
/// and sources are both sources', metadata first; `can_reschedule` is the metadata server's
/// alone.
///
/// NB: the label source can only add to what the metadata source says, never lower or clear it:
/// a Node read that lacks GKE's labels (a cluster older than 1.31, a label GKE has already
/// removed) leaves a metadata notice exactly as it was.
pub(crate) fn merge(metadata: &MaintenanceState, labels: &MaintenanceState) -> MaintenanceState {
    let both_pending = labels.phase == Phase::Pending && metadata.phase == Phase::Pending;
    let labels_worse =
        labels.phase > metadata.phase || (both_pending && start_key(labels) < start_key(metadata));
    let (worse, other) = if labels_worse { (labels, metadata) } else { (metadata, labels) };
    // NB: a pending notice without a date keeps none (it is the nearest of all): only an
    // ongoing or terminating phase, which stands down whatever its window, shows the other's.
    let has_window = worse.window_start.is_some() || worse.window_end.is_some();
    let window = if has_window || worse.phase == Phase::Pending { worse } else { other };
    MaintenanceState {
        phase: worse.phase,
        window_start: window.window_start.clone(),
        window_end: window.window_end.clone(),
        can_reschedule: metadata.can_reschedule,
        reasons: union(&metadata.reasons, &labels.reasons),
        interruption: worse.interruption.or(other.interruption),
        sources: union(&metadata.sources, &labels.sources),
    }
}

/// `first`, then each of `then` not in it yet.
fn union<T: Copy + PartialEq>(first: &[T], then: &[T]) -> Vec<T> {
    let mut out = first.to_vec();
    for x in then {
        if !out.contains(x) {
            out.push(*x);
        }
    }
    out
}

#[cfg(test)]
#[path = "policy_info_tests.rs"]
mod tests;
