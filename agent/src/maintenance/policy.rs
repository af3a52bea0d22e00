//! Maintenance decisions (pure): the phase from the metadata values, whether restarts stand
//! down, and the Vigil-owned fields of the Node for a maintenance state and a GPU report.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::{ms, Millis};
use crate::config::{CheckpointConfig, KubernetesConfig, OpportunisticConfig};
use crate::vocab::maintenance::{
    Interruption, MaintenanceEvent, MaintenanceState, Phase, RawMetadata, Source, UpcomingStatus,
};
use crate::vocab::node::{
    no_schedule_taint, problem_condition, EventType, NodeCondition, NodeDesired,
    MAINTENANCE_CONDITION, TERMINATION_TAINT,
};
use crate::vocab::stand_down::interrupting;

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

    let reasons = [
        (preempted, "preempted"),
        (terminate, "terminate-on-host-maintenance"),
        (migrate, "migrate-on-host-maintenance"),
        (pending, "upcoming-pending"),
        (ongoing, "upcoming-ongoing"),
    ];
    let upcoming = raw.upcoming.as_ref();
    MaintenanceState {
        window_start: upcoming.and_then(|u| u.window_start.clone()),
        window_end: upcoming.and_then(|u| u.window_end.clone()),
        can_reschedule: upcoming.is_some_and(|u| u.can_reschedule),
        ..signalled([preempted, terminate, migrate || ongoing, pending], &reasons, Source::Metadata)
    }
}

/// The state one source's signals stand for, the worst first: a preemption, a termination, an
/// ongoing maintenance, a pending one. `reasons` name the signals, each where it is on; the
/// window and `can_reschedule` are the caller's to add.
pub(crate) fn signalled(
    [preempted, terminating, ongoing, pending]: [bool; 4],
    reasons: &[(bool, &'static str)],
    source: Source,
) -> MaintenanceState {
    let (phase, interruption) = if preempted {
        (Phase::Terminating, Some(Interruption::Preemption))
    } else if terminating {
        (Phase::Terminating, Some(Interruption::HostMaintenance))
    } else if ongoing {
        (Phase::Ongoing, Some(Interruption::HostMaintenance))
    } else if pending {
        (Phase::Pending, None)
    } else {
        (Phase::None, None)
    };
    MaintenanceState {
        sources: if phase == Phase::None { vec![] } else { vec![source] },
        phase,
        reasons: reasons.iter().filter_map(|&(on, r)| on.then_some(r)).collect(),
        interruption,
        ..MaintenanceState::default()
    }
}

/// Whether opportunistic maintenance may act on this state: a pending event that can be
/// started early.
pub(crate) fn reschedulable(st: &MaintenanceState) -> bool {
    st.phase == Phase::Pending && st.can_reschedule
}

/// Whether an idle node may take the pool's claim: idle since `idle_since` for `idle_for`, with
/// at least `min_nodes` other nodes of the pool still serving ([`serves`]).
pub(crate) fn opportunistic_due(
    o: &OpportunisticConfig,
    now: Millis,
    idle_since: Millis,
    others_serving: usize,
) -> bool {
    now - idle_since >= ms(o.idle_for) && others_serving >= o.min_nodes as usize
}

/// Whether another node of the pool counts toward `min_nodes` through a claim that may last
/// until `until`: `health` — the fleet view's health of its record with the notice left out
/// (`crate::fleet::view::health`) — is `healthy` (a live heartbeat, no worker last seen hung,
/// errored or unreachable, its GPU not failed, its runtime listing its workers), and its
/// record's `maintenance` is `none`, or `pending` with a window known to start after `until`.
///
/// NB: a node with a *pending* notice still serves while its window is far: GCE announces a
/// pool's maintenance to several nodes at once, and counting them out let no node of the pool
/// claim. One whose window starts within the claim (or is unknown) is counted out: Compute
/// Engine may start it while this node is away. An ongoing or terminating one is subtracted.
/// The node holding the claim needs no subtracting: while it holds it, no other node can.
pub(crate) fn serves(
    maintenance: &str,
    window: Option<Millis>,
    health: &str,
    until: Millis,
) -> bool {
    let far = window.is_some_and(|w| w > until);
    let notice_serves =
        maintenance == Phase::None.as_str() || (maintenance == Phase::Pending.as_str() && far);
    notice_serves && health == "healthy"
}

/// A pool claim's value: the claiming node, and a nonce so that each claim is a new token.
pub(crate) fn claim_token(node: &str, nonce: u32) -> String {
    format!("{node}:{nonce:08x}")
}

/// The node a pool claim's value names ([`claim_token`]); `None` for a value of no claim.
pub(crate) fn claim_holder(value: &str) -> Option<&str> {
    value.rsplit_once(':').map(|(node, _)| node)
}

/// Whether the maintenance a held claim was taken for is over, after the agent has run for
/// `running_for`: the phase is back to none.
///
/// NB: an agent that has just started reads phase none until the metadata server first answers,
/// so a claim it adopted (taken before it restarted) is not released on that before
/// `metadata.first_read_wait`, the bound restarts wait for the same first answer.
pub(crate) fn claim_done(phase: Phase, running_for: Duration, first_read_wait: Duration) -> bool {
    phase == Phase::None && running_for >= first_read_wait
}

/// Whether the holder keeps its claim (and its label) after this poll's compare-and-renew:
/// `renewed` is Redis's answer (`None`: none came), `unrenewed_for` the time since the last
/// renewal Redis confirmed.
///
/// NB: a renewal that got no answer may not have happened, and the claim then lapses
/// `claim_ttl` after the last one that did, when another node of the pool may take it: the
/// label goes while that still leaves this poll and the next (a late tick, the Node's write).
pub(crate) fn still_held(
    renewed: Option<bool>,
    unrenewed_for: Duration,
    claim_ttl: Duration,
    poll: Duration,
) -> bool {
    renewed.unwrap_or(unrenewed_for + poll * 2 < claim_ttl)
}

/// The Vigil-owned Node fields for a maintenance state (pure).
pub fn node_desired(
    k: &KubernetesConfig,
    st: &MaintenanceState,
    last_checkpoint: Option<&str>,
    perform_maintenance: Option<bool>,
) -> NodeDesired {
    let p = &k.label_prefix;
    let scheduled = st.window_start.is_some() || st.window_end.is_some() || st.phase != Phase::None;
    let mut labels = BTreeMap::from([
        (format!("{p}maintenance"), Some(st.phase.as_str().to_string())),
        (format!("{p}can-reschedule"), scheduled.then(|| st.can_reschedule.to_string())),
    ]);
    let reasons = (!st.reasons.is_empty()).then(|| st.reasons.join(","));
    let mut annotations = BTreeMap::from([
        (format!("{p}maintenance-window-start"), st.window_start.clone()),
        (format!("{p}maintenance-window-end"), st.window_end.clone()),
        (format!("{p}maintenance-reasons"), reasons),
    ]);
    if let Some(c) = last_checkpoint {
        annotations.insert(format!("{p}last-checkpoint"), Some(c.to_string()));
    }
    if let Some(on) = perform_maintenance {
        labels.insert(PERFORM_MAINTENANCE_LABEL.to_string(), on.then(|| "true".to_string()));
    }
    let conditions = vec![maintenance_condition(st)];
    let mut d = NodeDesired { labels, annotations, conditions, ..NodeDesired::default() };
    let terminating = k.taint_on_termination && st.phase == Phase::Terminating;
    no_schedule_taint(&mut d, format!("{p}{TERMINATION_TAINT}"), terminating);
    d
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
        let (phase, reasons) = (st.phase.as_str(), st.reasons.join(","));
        let start = st.window_start.as_deref().unwrap_or("-");
        let end = st.window_end.as_deref().unwrap_or("-");
        format!("maintenance {phase} (reasons: {reasons}; window {start} – {end})")
    };
    problem_condition(MAINTENANCE_CONDITION, Some(st.phase != Phase::None), reason, message)
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
    due.then_some(match next.interruption {
        Some(Interruption::Preemption) => ("preemption", c.preemption_budget),
        _ => ("host-maintenance", c.maintenance_budget),
    })
}

/// Whether this transition starts an interruption (counted once, as GKE's interruption_count).
pub(crate) fn interruption_starts(prev: Phase, next: Phase) -> bool {
    !interrupting(prev) && interrupting(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::maintenance::UpcomingMaintenance;
    use Interruption::{HostMaintenance as HM, Preemption as PR};
    use MaintenanceEvent::{
        MigrateOnHostMaintenance as M, None as NONE, TerminateOnHostMaintenance as T,
    };
    use UpcomingStatus::{Ongoing as ONGOING, Pending as PENDING};

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
            settled: true,
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
        assert_eq!((s.window_start, s.window_end, s.can_reschedule), (None, None, false));
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
