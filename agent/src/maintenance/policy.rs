//! Maintenance decisions (pure): the phase from the metadata values, whether restarts stand
//! down, and the Vigil-owned fields of the Node for a maintenance state and a GPU report.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::{ms, parse_rfc3339, Millis};
use crate::config::{CheckpointConfig, KubernetesConfig, MetadataConfig, OpportunisticConfig};
use crate::maintenance::model::{
    Interruption, MaintenanceEvent, MaintenanceState, Phase, RawMetadata, Source, UpcomingStatus,
};
use crate::vocab::node::{
    problem_condition, EventType, NodeCondition, NodeDesired, Taint, MAINTENANCE_CONDITION,
    TERMINATION_TAINT,
};
use crate::vocab::node_info::NodeInfo;

/// The label GKE reads to start a rescheduleable maintenance now.
pub const PERFORM_MAINTENANCE_LABEL: &str = "cloud.google.com/perform-maintenance";

/// Derive the maintenance state from the latest raw values of all three keys.
///
/// NB: the phase is a pure function of the *latest* value of every key, never of the order they
/// changed in, so `preempted=FALSE` cannot clear a termination announced by `maintenance-event`
/// (a public handler that reacted to each key as an event had exactly that bug).
pub fn derive(raw: &RawMetadata) -> MaintenanceState {
    let event = raw.maintenance_event;
    let status = raw.upcoming.as_ref().map(|u| u.status);
    let preempted = raw.preempted == Some(true);
    let terminate = event == Some(MaintenanceEvent::TerminateOnHostMaintenance);
    let migrate = event == Some(MaintenanceEvent::MigrateOnHostMaintenance);
    let ongoing = status == Some(UpcomingStatus::Ongoing);
    let pending = status == Some(UpcomingStatus::Pending);

    let mut reasons = Vec::new();
    if preempted {
        reasons.push("preempted");
    }
    if terminate {
        reasons.push("terminate-on-host-maintenance");
    }
    if migrate {
        reasons.push("migrate-on-host-maintenance");
    }
    if pending {
        reasons.push("upcoming-pending");
    }
    if ongoing {
        reasons.push("upcoming-ongoing");
    }

    let (phase, interruption) = if preempted {
        (Phase::Terminating, Some(Interruption::Preemption))
    } else if terminate {
        (Phase::Terminating, Some(Interruption::HostMaintenance))
    } else if migrate || ongoing {
        (Phase::Ongoing, Some(Interruption::HostMaintenance))
    } else if pending {
        (Phase::Pending, None)
    } else {
        (Phase::None, None)
    };

    let upcoming = raw.upcoming.as_ref();
    MaintenanceState {
        sources: if phase == Phase::None {
            vec![]
        } else {
            vec![Source::Metadata]
        },
        phase,
        window_start: upcoming.and_then(|u| u.window_start.clone()),
        window_end: upcoming.and_then(|u| u.window_end.clone()),
        can_reschedule: upcoming.is_some_and(|u| u.can_reschedule),
        reasons,
        interruption,
    }
}

/// Whether a pending window starts within `horizon` of `now` (ms). An unknown or unparseable
/// start counts as near: without a date, caution wins.
pub(crate) fn pending_near(st: &MaintenanceState, now: Millis, horizon: Duration) -> bool {
    if st.phase != Phase::Pending {
        return false;
    }
    match st.window_start.as_deref().and_then(parse_rfc3339) {
        Some(start) => start - now <= ms(horizon),
        None => true,
    }
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
}

impl NodeFacts {
    /// Whether restarts stand down at `now` (see [`stands_down`]).
    pub fn stands_down(&self, now: Millis, m: &MetadataConfig) -> bool {
        stands_down(&self.maintenance, self.interruption_ended, now, m)
    }
}

/// The node's facts as the controller and the agent share them.
pub type SharedFacts = std::sync::Arc<std::sync::RwLock<NodeFacts>>;

/// Whether restarts stand down at `now`, a pure function of the maintenance state and the clock,
/// evaluated by the restart path at every cycle and again right before the command.
///
/// Ongoing and terminating always; a pending notice only once its window starts within
/// `metadata.pending_horizon` (GCE posts PENDING notices days ahead, and a hung worker must not
/// wait days; as the window approaches, the same notice starts standing restarts down); and for
/// `metadata.settle` after an interrupting phase ended at `interruption_ended`. Every time is on
/// the coordinator's clock.
pub fn stands_down(
    st: &MaintenanceState,
    interruption_ended: Option<Millis>,
    now: Millis,
    m: &MetadataConfig,
) -> bool {
    if interrupting(st.phase) || pending_near(st, now, m.pending_horizon) {
        return true;
    }
    interruption_ended.is_some_and(|ended| now - ended < ms(m.settle))
}

/// Whether opportunistic maintenance may act on this state: a pending event that can be
/// started early.
pub(crate) fn reschedulable(st: &MaintenanceState) -> bool {
    st.phase == Phase::Pending && st.can_reschedule
}

/// Whether an idle node may take the pool's claim: idle since `idle_since` for `idle_for`, with
/// at least `min_nodes` other healthy nodes left in the pool.
pub(crate) fn opportunistic_due(
    o: &OpportunisticConfig,
    now: Millis,
    idle_since: Millis,
    others_healthy: usize,
) -> bool {
    now - idle_since >= ms(o.idle_for) && others_healthy >= o.min_nodes as usize
}

/// The Vigil-owned Node fields for a maintenance state (pure).
pub fn node_desired(
    k: &KubernetesConfig,
    st: &MaintenanceState,
    last_checkpoint: Option<&str>,
    perform_maintenance: Option<bool>,
) -> NodeDesired {
    let p = &k.label_prefix;
    let mut labels = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    labels.insert(
        format!("{p}maintenance"),
        Some(st.phase.as_str().to_string()),
    );
    let scheduled = st.window_start.is_some() || st.window_end.is_some() || st.phase != Phase::None;
    labels.insert(
        format!("{p}can-reschedule"),
        scheduled.then(|| st.can_reschedule.to_string()),
    );
    annotations.insert(
        format!("{p}maintenance-window-start"),
        st.window_start.clone(),
    );
    annotations.insert(format!("{p}maintenance-window-end"), st.window_end.clone());
    annotations.insert(
        format!("{p}maintenance-reasons"),
        (!st.reasons.is_empty()).then(|| st.reasons.join(",")),
    );
    if let Some(c) = last_checkpoint {
        annotations.insert(format!("{p}last-checkpoint"), Some(c.to_string()));
    }
    if let Some(on) = perform_maintenance {
        labels.insert(
            PERFORM_MAINTENANCE_LABEL.to_string(),
            on.then(|| "true".to_string()),
        );
    }
    let taint_key = format!("{p}{TERMINATION_TAINT}");
    let (add_taints, remove_taints) = if k.taint_on_termination && st.phase == Phase::Terminating {
        (
            vec![Taint {
                key: taint_key,
                value: "true".into(),
                effect: "NoSchedule".into(),
            }],
            vec![],
        )
    } else {
        (vec![], vec![taint_key])
    };
    NodeDesired {
        labels,
        annotations,
        add_taints,
        remove_taints,
        conditions: vec![maintenance_condition(st)],
        remove_conditions: Vec::new(),
    }
}

/// `VigilMaintenance`: True while any maintenance is scheduled or under way, with the phase as
/// the reason (`None`, `Pending`, `Ongoing`, `Terminating`) — the same fact as the
/// `maintenance` label.
pub(crate) fn maintenance_condition(st: &MaintenanceState) -> NodeCondition {
    let reason = match st.phase {
        Phase::None => "None",
        Phase::Pending => "Pending",
        Phase::Ongoing => "Ongoing",
        Phase::Terminating => "Terminating",
    };
    let message = if st.phase == Phase::None {
        "no maintenance or preemption notice".to_string()
    } else {
        format!(
            "maintenance {} (reasons: {}; window {} – {})",
            st.phase.as_str(),
            st.reasons.join(","),
            st.window_start.as_deref().unwrap_or("-"),
            st.window_end.as_deref().unwrap_or("-"),
        )
    };
    problem_condition(
        MAINTENANCE_CONDITION,
        Some(st.phase != Phase::None),
        reason,
        message,
    )
}

/// The Event reason and type for entering a phase.
pub fn event_for(phase: Phase) -> (&'static str, EventType) {
    match phase {
        Phase::None => ("VigilMaintenanceCleared", EventType::Normal),
        Phase::Pending => ("VigilMaintenancePending", EventType::Normal),
        Phase::Ongoing => ("VigilMaintenanceOngoing", EventType::Warning),
        Phase::Terminating => ("VigilTerminationImminent", EventType::Warning),
    }
}

/// Whether a phase change asks the workers to checkpoint, and why, with which budget.
///
/// NB: a termination is always checkpointed, even after an ongoing migration already was; an
/// ongoing one once per episode (`checkpointed_episode`).
pub(crate) fn checkpoint_for(
    prev: Phase,
    next: &MaintenanceState,
    checkpointed_episode: bool,
    c: &CheckpointConfig,
) -> Option<(&'static str, Duration)> {
    let due = match next.phase {
        Phase::Terminating => prev != Phase::Terminating,
        Phase::Ongoing => !checkpointed_episode,
        Phase::None | Phase::Pending => false,
    };
    if !due {
        return None;
    }
    Some(if next.interruption == Some(Interruption::Preemption) {
        ("preemption", c.preemption_budget)
    } else {
        ("host-maintenance", c.maintenance_budget)
    })
}

/// Whether this transition starts an interruption (counted once, as GKE's interruption_count).
pub(crate) fn interruption_starts(prev: Phase, next: Phase) -> bool {
    !interrupting(prev) && interrupting(next)
}

/// Taints that say the node is being removed, and what each means.
pub(crate) const GOING_AWAY_TAINTS: [(&str, &str); 3] = [
    (
        "ToBeDeletedByClusterAutoscaler",
        "the cluster autoscaler is removing it",
    ),
    ("karpenter.sh/disrupted", "Karpenter is removing it"),
    (
        "node.kubernetes.io/out-of-service",
        "it was marked out of service",
    ),
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
    info?
        .taints
        .iter()
        .any(|t| t.key == CORDON_TAINT)
        .then(|| format!("the node is cordoned ({CORDON_TAINT}): a drain, GKE's auto-repair or an upgrade is taking its workloads away"))
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
    GOING_AWAY_TAINTS
        .iter()
        .find(|(key, _)| info.taints.iter().any(|t| t.key == *key))
        .map(|(key, why)| format!("taint {key}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintenance::model::UpcomingMaintenance;
    use Interruption::{HostMaintenance as HM, Preemption as PR};
    use MaintenanceEvent::{
        MigrateOnHostMaintenance as M, None as NONE, TerminateOnHostMaintenance as T,
    };
    use UpcomingStatus::{Ongoing as ONGOING, Pending as PENDING};

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
        assert!(being_drained(Some(&info))
            .unwrap()
            .starts_with("the node is cordoned"));
        let mut away = NodeInfo {
            deleting: true,
            ..NodeInfo::default()
        };
        assert!(being_drained(Some(&away))
            .unwrap()
            .contains("being deleted"));
        away.deleting = false;
        away.taints = vec![taint("ToBeDeletedByClusterAutoscaler")];
        assert!(being_drained(Some(&away))
            .unwrap()
            .contains("cluster autoscaler"));
    }

    fn raw(
        event: Option<MaintenanceEvent>,
        status: Option<UpcomingStatus>,
        preempted: Option<bool>,
    ) -> RawMetadata {
        RawMetadata {
            maintenance_event: event,
            upcoming: status.map(|status| UpcomingMaintenance {
                status,
                can_reschedule: true,
                window_start: Some("2024-12-01T19:00:01Z".into()),
                window_end: Some("2024-12-01T21:00:01Z".into()),
                ..Default::default()
            }),
            preempted,
        }
    }

    #[test]
    fn derive_table() {
        use Phase as P;
        /// event, upcoming status, preempted → phase, interruption, reasons.
        type Row<'a> = (
            Option<MaintenanceEvent>,
            Option<UpcomingStatus>,
            Option<bool>,
            Phase,
            Option<Interruption>,
            &'a [&'a str],
        );
        #[rustfmt::skip]
        let table: &[Row] = &[
            // event       upcoming       preempted    phase           interruption reasons
            (None,       None,          None,        P::None,        None,        &[]),
            (Some(NONE), None,          Some(false), P::None,        None,        &[]),
            (Some(NONE), Some(PENDING), Some(false), P::Pending,     None,        &["upcoming-pending"]),
            (Some(NONE), Some(ONGOING), Some(false), P::Ongoing,     Some(HM),    &["upcoming-ongoing"]),
            (Some(M),    None,          Some(false), P::Ongoing,     Some(HM),    &["migrate-on-host-maintenance"]),
            (Some(M),    Some(PENDING), None,        P::Ongoing,     Some(HM),    &["migrate-on-host-maintenance", "upcoming-pending"]),
            (Some(T),    None,          Some(false), P::Terminating, Some(HM),    &["terminate-on-host-maintenance"]),
            (Some(T),    Some(ONGOING), None,        P::Terminating, Some(HM),    &["terminate-on-host-maintenance", "upcoming-ongoing"]),
            (Some(NONE), None,          Some(true),  P::Terminating, Some(PR),    &["preempted"]),
            (Some(T),    None,          Some(true),  P::Terminating, Some(PR),    &["preempted", "terminate-on-host-maintenance"]),
            (None,       Some(PENDING), Some(true),  P::Terminating, Some(PR),    &["preempted", "upcoming-pending"]),
            (Some(M),    Some(ONGOING), Some(true),  P::Terminating, Some(PR),    &["preempted", "migrate-on-host-maintenance", "upcoming-ongoing"]),
            // preempted=FALSE next to a termination notice: still terminating.
            (Some(T),    Some(PENDING), Some(false), P::Terminating, Some(HM),    &["terminate-on-host-maintenance", "upcoming-pending"]),
        ];
        for (i, (event, status, preempted, phase, interruption, reasons)) in
            table.iter().enumerate()
        {
            let s = derive(&raw(*event, *status, *preempted));
            assert_eq!(s.phase, *phase, "row {i}");
            assert_eq!(s.interruption, *interruption, "row {i}");
            assert_eq!(s.reasons, reasons.to_vec(), "row {i}");
        }
    }

    #[test]
    fn derive_copies_the_window() {
        let s = derive(&raw(Some(NONE), Some(PENDING), Some(false)));
        assert_eq!(s.window_start.as_deref(), Some("2024-12-01T19:00:01Z"));
        assert_eq!(s.window_end.as_deref(), Some("2024-12-01T21:00:01Z"));
        assert!(s.can_reschedule);
        let s = derive(&raw(Some(NONE), None, Some(false)));
        assert_eq!(
            (s.window_start, s.window_end, s.can_reschedule),
            (None, None, false)
        );
    }

    #[test]
    fn preempted_false_never_clears_a_pending_termination() {
        // The order a handler sees the keys in must not matter: TERMINATE then preempted=FALSE.
        let mut r = raw(Some(T), None, None);
        assert_eq!(derive(&r).phase, Phase::Terminating);
        r.preempted = Some(false);
        assert_eq!(derive(&r).phase, Phase::Terminating);
        r.preempted = Some(true);
        r.preempted = Some(false);
        let s = derive(&r);
        assert_eq!(s.phase, Phase::Terminating);
        assert_eq!(s.interruption, Some(HM));
        // Only the event itself going back to NONE ends it.
        r.maintenance_event = Some(NONE);
        assert_eq!(derive(&r).phase, Phase::None);
    }
}

#[cfg(test)]
#[path = "policy_node_tests.rs"]
mod node_tests;
