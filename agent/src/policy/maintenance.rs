//! Maintenance decisions (pure): the phase from the metadata values, whether restarts stand
//! down, and the Vigil-owned fields of the Node for a maintenance state and a GPU report.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::{ms, parse_rfc3339, Millis};
use crate::config::{CheckpointConfig, KubernetesConfig, MetadataConfig, OpportunisticConfig};
use crate::model::gpu::{GpuHealth, GpuReport};
use crate::model::maintenance::{
    Interruption, MaintenanceEvent, MaintenanceState, Phase, RawMetadata, Source, UpcomingStatus,
};
use crate::model::node::{ConditionStatus, EventType, NodeCondition, NodeDesired, Taint};

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
        // NB: the migration of a condition whose polarity changed (docs/upgrading.md): the old
        // type comes off the Node as soon as an agent of this version writes it.
        remove_conditions: RETIRED_CONDITIONS.iter().map(|c| c.to_string()).collect(),
    }
}

/// The taint (after the label prefix) while termination is imminent.
pub const TERMINATION_TAINT: &str = "termination-imminent";
/// The taint (after the label prefix) while a GPU has failed.
pub const GPU_FAILED_TAINT: &str = "gpu-failed";
/// The taint (after the label prefix) while the node's TPU chips have failed.
pub const TPU_FAILED_TAINT: &str = "tpu-failed";

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

/// The types of every Node condition Vigil sets or once set (`vigil cleanup` removes these).
pub const CONDITIONS: [&str; 4] = [
    MAINTENANCE_CONDITION,
    GPU_CONDITION,
    TPU_CONDITION,
    RETIRED_CONDITIONS[0],
];

// NB: one polarity for every Vigil condition, node-problem-detector's and the kubelet's pressure
// conditions': `True` means a problem (docs/kubernetes.md says why).

/// The condition type of the maintenance state: True while a notice stands.
pub const MAINTENANCE_CONDITION: &str = "VigilMaintenance";
/// The condition type of the GPU health: True while a GPU has failed.
pub const GPU_CONDITION: &str = "VigilGPUUnhealthy";
/// The condition type of the TPU health: True while the TPU chips have failed.
pub const TPU_CONDITION: &str = "VigilTPUUnhealthy";
/// Condition types earlier versions set, removed by the agent when it writes its own:
/// `VigilGPUHealthy` (True = healthy, before the polarity was made one for all).
pub const RETIRED_CONDITIONS: [&str; 1] = ["VigilGPUHealthy"];

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

/// `VigilMaintenance`: True while any maintenance is scheduled or under way, with the phase as
/// the reason (`None`, `Pending`, `Ongoing`, `Terminating`) — the same fact as the
/// `maintenance` label.
pub fn maintenance_condition(st: &MaintenanceState) -> NodeCondition {
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

/// `VigilGPUUnhealthy`: True when a GPU failed, False when healthy or degraded (still usable;
/// the reason and message say why), Unknown without GPU monitoring — the same fact as the
/// `gpu-health` label.
pub fn gpu_condition(report: &GpuReport) -> NodeCondition {
    let (problem, reason) = match (report.monitoring(), report.node) {
        (false, _) => (None, "MonitoringOff"),
        (true, GpuHealth::Healthy) => (Some(false), "Healthy"),
        (true, GpuHealth::Degraded) => (Some(false), "Degraded"),
        (true, GpuHealth::Failed) => (Some(true), "Failed"),
    };
    let message = if !report.monitoring() {
        "GPU monitoring is off (no NVML, or gpu.enabled = off)".to_string()
    } else if report.node_reasons.is_empty() {
        format!("GPU health {}", report.node.as_str())
    } else {
        truncate(&report.node_reasons.join("; "), 1000)
    };
    problem_condition(GPU_CONDITION, problem, reason, message)
}

/// `s` cut to at most `max` bytes on a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s[..cut].to_string()
}

/// Add the GPU fields to the Node's desired state (pure): the node's GPU health label, the
/// reasons, and the optional `NoSchedule` taint while a GPU has failed.
pub fn gpu_desired(k: &KubernetesConfig, report: &GpuReport, taint: bool, d: &mut NodeDesired) {
    let p = &k.label_prefix;
    d.labels.insert(
        format!("{p}gpu-health"),
        report
            .monitoring()
            .then(|| report.node.as_str().to_string()),
    );
    let reasons = truncate(&report.node_reasons.join("; "), 1000);
    d.annotations.insert(
        format!("{p}gpu-health-reasons"),
        (!reasons.is_empty()).then_some(reasons),
    );
    let key = format!("{p}{GPU_FAILED_TAINT}");
    if taint && report.monitoring() && report.node == GpuHealth::Failed {
        d.add_taints.push(Taint {
            key,
            value: "true".into(),
            effect: "NoSchedule".into(),
        });
    } else {
        d.remove_taints.push(key);
    }
    d.conditions.push(gpu_condition(report));
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

/// The Event reason and type for the node's GPU health changing to `health`.
pub(crate) fn gpu_event_for(health: GpuHealth) -> (&'static str, EventType) {
    match health {
        GpuHealth::Failed => ("VigilGpuFailed", EventType::Warning),
        GpuHealth::Degraded => ("VigilGpuDegraded", EventType::Warning),
        GpuHealth::Healthy => ("VigilGpuHealthy", EventType::Normal),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::maintenance::UpcomingMaintenance;
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
mod node_tests {
    use super::*;

    fn st(phase: Phase, reasons: Vec<&'static str>) -> MaintenanceState {
        MaintenanceState {
            phase,
            reasons,
            window_start: Some("2026-11-30T10:00:00Z".into()),
            window_end: Some("2026-11-30T12:00:00Z".into()),
            can_reschedule: true,
            ..MaintenanceState::default()
        }
    }

    #[test]
    fn terminating_sets_the_taint_and_everything_else_removes_it() {
        let k = KubernetesConfig::default();
        let d = node_desired(&k, &st(Phase::Terminating, vec!["preempted"]), None, None);
        assert_eq!(d.add_taints.len(), 1);
        assert_eq!(d.add_taints[0].key, "vigil.dev/termination-imminent");
        assert_eq!(d.add_taints[0].effect, "NoSchedule");
        assert_eq!(
            d.labels["vigil.dev/maintenance"].as_deref(),
            Some("terminating")
        );
        assert_eq!(
            d.annotations["vigil.dev/maintenance-reasons"].as_deref(),
            Some("preempted")
        );
        for phase in [Phase::None, Phase::Pending, Phase::Ongoing] {
            let d = node_desired(&k, &st(phase, vec![]), None, None);
            assert!(d.add_taints.is_empty());
            assert_eq!(d.remove_taints, vec!["vigil.dev/termination-imminent"]);
        }
        let off = KubernetesConfig {
            taint_on_termination: false,
            ..KubernetesConfig::default()
        };
        assert!(
            node_desired(&off, &st(Phase::Terminating, vec![]), None, None)
                .add_taints
                .is_empty()
        );
    }

    #[test]
    fn clearing_removes_window_and_reasons() {
        let k = KubernetesConfig::default();
        let d = node_desired(&k, &MaintenanceState::default(), Some("x"), Some(false));
        assert_eq!(d.labels["vigil.dev/maintenance"].as_deref(), Some("none"));
        assert_eq!(d.labels["vigil.dev/can-reschedule"], None);
        assert_eq!(d.annotations["vigil.dev/maintenance-window-start"], None);
        assert_eq!(d.annotations["vigil.dev/maintenance-reasons"], None);
        assert_eq!(
            d.annotations["vigil.dev/last-checkpoint"].as_deref(),
            Some("x")
        );
        assert_eq!(d.labels[PERFORM_MAINTENANCE_LABEL], None);
    }

    #[test]
    fn a_pending_notice_stands_restarts_down_only_near_its_window() {
        // 2026-11-30T10:00:00Z
        let start = 1_796_032_800_000;
        let hour = Duration::from_secs(3600);
        let pending = MaintenanceState {
            phase: Phase::Pending,
            window_start: Some("2026-11-30T10:00:00Z".into()),
            ..MaintenanceState::default()
        };
        assert!(
            !pending_near(&pending, start - 3_600_001, hour),
            "days ahead: restarts go on"
        );
        assert!(
            pending_near(&pending, start - 3_600_000, hour),
            "within the horizon"
        );
        let unknown = MaintenanceState {
            window_start: None,
            ..pending.clone()
        };
        assert!(pending_near(&unknown, 0, hour), "no date: caution wins");
    }

    /// The notice is posted days ahead and never changes: the clock alone moves it inside the
    /// horizon. The stand-down is a function of (state, now), so it follows.
    #[test]
    fn the_same_pending_notice_stands_down_as_its_window_approaches() {
        let start = 1_796_032_800_000; // 2026-11-30T10:00:00Z
        let day = 24 * 3_600_000;
        let m = MetadataConfig::default(); // pending_horizon 1h
        let pending = MaintenanceState {
            phase: Phase::Pending,
            window_start: Some("2026-11-30T10:00:00Z".into()),
            ..MaintenanceState::default()
        };
        let mut now = start - 3 * day;
        let mut first = None;
        while now < start {
            if stands_down(&pending, None, now, &m) {
                first.get_or_insert(now);
            } else {
                assert!(first.is_none(), "once near, it stays near");
            }
            now += 60_000;
        }
        assert_eq!(
            first,
            Some(start - 3_600_000),
            "exactly one horizon before the window"
        );
    }

    #[test]
    fn settle_keeps_restarts_suppressed_after_maintenance() {
        let m = MetadataConfig::default(); // settle 5m
        let ended = 1_000_000;
        let none = MaintenanceState::default();
        assert!(stands_down(&none, Some(ended), ended + 299_999, &m));
        assert!(!stands_down(&none, Some(ended), ended + 300_000, &m));
        assert!(!stands_down(&none, None, ended, &m));
        for phase in [Phase::Ongoing, Phase::Terminating] {
            let st = MaintenanceState {
                phase,
                ..MaintenanceState::default()
            };
            assert!(stands_down(&st, None, 0, &m), "{phase:?}");
        }
    }

    #[test]
    fn checkpoints_once_per_ongoing_episode_and_on_every_termination() {
        let c = CheckpointConfig::default();
        let ongoing = st(Phase::Ongoing, vec!["upcoming-ongoing"]);
        assert_eq!(
            checkpoint_for(Phase::None, &ongoing, false, &c),
            Some(("host-maintenance", c.maintenance_budget))
        );
        assert_eq!(checkpoint_for(Phase::Pending, &ongoing, true, &c), None);
        let preempted = MaintenanceState {
            interruption: Some(Interruption::Preemption),
            ..st(Phase::Terminating, vec!["preempted"])
        };
        assert_eq!(
            checkpoint_for(Phase::Ongoing, &preempted, true, &c),
            Some(("preemption", c.preemption_budget))
        );
        assert_eq!(
            checkpoint_for(Phase::Terminating, &preempted, true, &c),
            None
        );
        let none = MaintenanceState::default();
        assert_eq!(checkpoint_for(Phase::Terminating, &none, true, &c), None);
    }

    #[test]
    fn opportunistic_needs_idle_time_and_spare_nodes() {
        let o = OpportunisticConfig::default(); // idle 30m, min 1
        let idle = 30 * 60_000;
        assert!(opportunistic_due(&o, idle, 0, 1));
        assert!(!opportunistic_due(&o, idle - 1, 0, 1));
        assert!(!opportunistic_due(&o, idle, 0, 0));
        let pending = MaintenanceState {
            phase: Phase::Pending,
            can_reschedule: true,
            ..MaintenanceState::default()
        };
        assert!(reschedulable(&pending));
        assert!(!reschedulable(&MaintenanceState {
            can_reschedule: false,
            ..pending
        }));
    }

    #[test]
    fn interruptions_count_once_per_episode() {
        assert!(interruption_starts(Phase::None, Phase::Terminating));
        assert!(interruption_starts(Phase::Pending, Phase::Ongoing));
        assert!(!interruption_starts(Phase::Ongoing, Phase::Terminating));
        assert!(!interruption_starts(Phase::None, Phase::Pending));
    }
}
