//! What forbids restarts on the node right now, in the words the features share: the node's
//! maintenance facts (written by the Node controller, read by the restart path at each worker's
//! evaluation and again right before the command) and a drain by the platform or a person.
//! Pure functions of the state and the clock handed in.

use std::time::Duration;

use crate::clock::{ms, parse_rfc3339, Millis, Monotonic};
use crate::config::MetadataConfig;
use crate::vocab::maintenance::{MaintenanceState, Phase};
use crate::vocab::node_info::NodeInfo;

/// Whether a pending window starts within `horizon` of `now` (ms). An unknown or unparseable
/// start counts as near: without a date, caution wins.
pub(crate) fn pending_near(st: &MaintenanceState, now: Millis, horizon: Duration) -> bool {
    let start = st.window_start.as_deref().and_then(parse_rfc3339);
    st.phase == Phase::Pending && start.is_none_or(|start| start - now <= ms(horizon))
}

/// Whether this phase interrupts the workers (they may stall, the node may go).
pub(crate) fn interrupting(phase: Phase) -> bool {
    matches!(phase, Phase::Ongoing | Phase::Terminating)
}

/// What the restart path needs to know about the node's maintenance (written by the node
/// controller, read by the hang path at each worker's evaluation).
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    pub maintenance: MaintenanceState,
    /// When the last interrupting phase (ongoing, terminating) ended, on the coordinator's
    /// clock: restarts stay suppressed for `metadata.settle` after it.
    pub interruption_ended: Option<Millis>,
    /// What the agent has not read yet since it started, and until when restarts wait for it
    /// (see [`unread`]): until the first answers come, "no maintenance" is only the default,
    /// and a restart due at start-up (an incident an earlier incarnation opened) must not run
    /// on it. `None` (the default, for a cycle with no controller) once everything was read.
    pub unread: Option<Unread>,
}

/// What restarts wait for at start-up, and the latest they wait (`metadata.first_read_wait`
/// after the start): the bound holds here, where the restart path reads it, whatever the
/// controller that clears it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unread {
    pub what: &'static str,
    /// On the monotonic clock of the process (not the coordinator's: a start-up bound).
    pub until: Monotonic,
}

impl NodeFacts {
    /// What restarts still wait for at `at` (`None` once read, or past the bound).
    pub fn unread_at(&self, at: Monotonic) -> Option<&'static str> {
        self.unread.filter(|u| at < u.until).map(|u| u.what)
    }

    /// Whether restarts stand down at `now`, a pure function of the maintenance state and the
    /// clock, evaluated by the restart path at every cycle and again right before the command.
    ///
    /// Ongoing and terminating always; a pending notice only once its window starts within
    /// `metadata.pending_horizon` (GCE posts PENDING notices days ahead, and a hung worker must
    /// not wait days; as the window approaches, the same notice starts standing restarts down);
    /// and for `metadata.settle` after an interrupting phase ended at `interruption_ended`. Every
    /// time is on the coordinator's clock.
    pub fn stands_down(&self, now: Millis, m: &MetadataConfig) -> bool {
        let st = &self.maintenance;
        interrupting(st.phase)
            || pending_near(st, now, m.pending_horizon)
            || self.interruption_ended.is_some_and(|ended| now - ended < ms(m.settle))
    }
}

/// The node's facts as the controller and the agent share them.
pub type SharedFacts = std::sync::Arc<std::sync::RwLock<NodeFacts>>;

/// What restarts still wait for, given whether the metadata server has answered (or is off) and
/// whether the Node was read (or there is none to read): `None` when nothing.
pub fn unread(metadata_read: bool, node_read: bool) -> Option<&'static str> {
    match (metadata_read, node_read) {
        (true, true) => None,
        (false, true) => Some("the metadata server's maintenance state"),
        (true, false) => Some("the Node (its maintenance labels, cordon and taints)"),
        (false, false) => Some("the metadata server's maintenance state and the Node"),
    }
}

/// [`NodeFacts::stands_down`] of a maintenance state and the end of the last interruption.
#[cfg(any(test, feature = "bench"))]
pub fn stands_down(
    st: &MaintenanceState,
    interruption_ended: Option<Millis>,
    now: Millis,
    m: &MetadataConfig,
) -> bool {
    let facts = NodeFacts { maintenance: st.clone(), interruption_ended, unread: None };
    facts.stands_down(now, m)
}

/// Taints that say the node is being removed, and what each means.
pub(crate) const GOING_AWAY_TAINTS: [(&str, &str); 3] = [
    ("ToBeDeletedByClusterAutoscaler", "the cluster autoscaler is removing it"),
    ("karpenter.sh/disrupted", "Karpenter is removing it"),
    ("node.kubernetes.io/out-of-service", "it was marked out of service"),
];

/// The taint the node lifecycle controller sets on a cordoned Node (`spec.unschedulable`):
/// `kubectl drain`, GKE's node auto-repair and upgrades cordon a node before they drain it.
pub(crate) const CORDON_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Why the platform or a person is taking the node's workloads away, if they are: then a restart
/// races them (it would start what a drain is stopping, on a node about to be repaired or
/// removed), and Vigil stands restarts down. The node going away (`going_away`), or cordoned.
pub(crate) fn being_drained(info: Option<&NodeInfo>) -> Option<String> {
    if let Some(why) = going_away(Phase::None, info) {
        return Some(format!("the node is going away ({why})"));
    }
    let cordoned = info?.taints.iter().any(|t| t.key == CORDON_TAINT);
    cordoned.then(|| format!("the node is cordoned ({CORDON_TAINT}): a drain, GKE's auto-repair or an upgrade is taking its workloads away"))
}

/// Why the node is going away, if it is: the one case where the agent's own SIGTERM is worth a
/// checkpoint of every worker (`checkpoint.on_sigterm = "node-going-away"`). A rollout of the
/// agent, or a restart of its service, leaves the workers running: no reason then (`None`).
pub(crate) fn going_away(phase: Phase, info: Option<&NodeInfo>) -> Option<String> {
    if phase == Phase::Terminating {
        return Some("a termination or preemption notice".into());
    }
    let info = info?;
    if info.deleting {
        return Some("the Node is being deleted".into());
    }
    if let Some(why) = &info.shutting_down {
        return Some(format!("the kubelet is shutting the node down ({why})"));
    }
    if info.maintenance.terminating {
        return Some("GKE's impending-node-termination taint".into());
    }
    let taint = GOING_AWAY_TAINTS.iter().find(|(key, _)| info.taints.iter().any(|t| t.key == *key));
    taint.map(|(key, why)| format!("taint {key}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 31, item 4: a cordon (a drain, GKE's auto-repair, an upgrade) or the node going
    /// away stands restarts down, naming why; Vigil's own taints do not.
    #[test]
    fn a_cordoned_or_departing_node_is_being_drained() {
        use crate::vocab::node_info::NodeTaint;
        let taint = |key: &str| NodeTaint {
            key: key.into(),
            value: String::new(),
            effect: "NoSchedule".into(),
        };
        let mut info = NodeInfo::default();
        assert_eq!(being_drained(Some(&info)), None);
        assert_eq!(being_drained(None), None);
        info.taints = vec![taint("vigil.dev/termination-imminent")];
        assert_eq!(being_drained(Some(&info)), None, "Vigil's own taint");
        info.taints.push(taint(CORDON_TAINT));
        assert!(being_drained(Some(&info)).unwrap().starts_with("the node is cordoned"));
        let mut away = NodeInfo { deleting: true, ..NodeInfo::default() };
        assert!(being_drained(Some(&away)).unwrap().contains("being deleted"));
        away.deleting = false;
        away.taints = vec![taint("ToBeDeletedByClusterAutoscaler")];
        assert!(being_drained(Some(&away)).unwrap().contains("cluster autoscaler"));
    }
}
