//! Tests of the node-level rules: stand-down, checkpoints, taints, conditions, the opportunistic
//! claim.
use super::*;
use crate::accel::gpu::model::GpuHealth;
use crate::accel::gpu::policy_node::gpu_condition;
use crate::accel::policy::desired;
use crate::config::MetadataConfig;
use crate::vocab::stand_down::{going_away, pending_near, stands_down, GOING_AWAY_TAINTS};

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
    assert_eq!(d.labels["vigil.dev/maintenance"].as_deref(), Some("terminating"));
    assert_eq!(d.annotations["vigil.dev/maintenance-reasons"].as_deref(), Some("preempted"));
    for phase in [Phase::None, Phase::Pending, Phase::Ongoing] {
        let d = node_desired(&k, &st(phase, vec![]), None, None);
        assert!(d.add_taints.is_empty());
        assert_eq!(d.remove_taints, vec!["vigil.dev/termination-imminent"]);
    }
    let off = KubernetesConfig { taint_on_termination: false, ..KubernetesConfig::default() };
    assert!(node_desired(&off, &st(Phase::Terminating, vec![]), None, None).add_taints.is_empty());
}

#[test]
fn clearing_removes_window_and_reasons() {
    let k = KubernetesConfig::default();
    let d = node_desired(&k, &MaintenanceState::default(), Some("x"), Some(false));
    assert_eq!(d.labels["vigil.dev/maintenance"].as_deref(), Some("none"));
    assert_eq!(d.labels["vigil.dev/can-reschedule"], None);
    assert_eq!(d.annotations["vigil.dev/maintenance-window-start"], None);
    assert_eq!(d.annotations["vigil.dev/maintenance-reasons"], None);
    assert_eq!(d.annotations["vigil.dev/last-checkpoint"].as_deref(), Some("x"));
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
    assert!(!pending_near(&pending, start - 3_600_001, hour), "days ahead: restarts go on");
    assert!(pending_near(&pending, start - 3_600_000, hour), "within the horizon");
    let unknown = MaintenanceState { window_start: None, ..pending.clone() };
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
    assert_eq!(first, Some(start - 3_600_000), "exactly one horizon before the window");
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
        let st = MaintenanceState { phase, ..MaintenanceState::default() };
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
    assert_eq!(checkpoint_for(Phase::Terminating, &preempted, true, &c), None);
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
    assert!(!reschedulable(&MaintenanceState { can_reschedule: false, ..pending }));
}

#[test]
fn a_pending_notice_alone_leaves_a_node_serving_for_min_nodes() {
    // The record's maintenance and window, its health with the notice left out → counts toward
    // min_nodes through a claim that may last until 1_000.
    let (far, near) = (Some(5_000), Some(900));
    #[rustfmt::skip]
    let table = [
        ("none",        None, "healthy",   true),
        // GCE's rolling maintenance: the other nodes of the pool have a notice pending too.
        ("pending",     far,  "healthy",   true),
        // ... but one whose window starts within the claim may go while this node is away,
        // and one of no known window might.
        ("pending",     near, "healthy",   false),
        ("pending",     None, "healthy",   false),
        ("ongoing",     far,  "healthy",   false),
        ("terminating", None, "healthy",   false),
        ("pending",     far,  "unhealthy", false),
        ("none",        None, "unhealthy", false),
        // Its runtime cannot list its workers: never counted healthy.
        ("pending",     far,  "unknown",   false),
        ("none",        None, "unknown",   false),
    ];
    for (maintenance, window, health, counts) in table {
        assert_eq!(
            serves(maintenance, window, health, 1_000),
            counts,
            "{maintenance} {window:?} {health}"
        );
    }
}

#[test]
fn a_claim_names_its_node() {
    let token = claim_token("gpu-1", 0xbad);
    assert_eq!(token, "gpu-1:00000bad");
    assert_eq!(claim_holder(&token), Some("gpu-1"));
    assert_eq!(claim_holder("gpu-10:00000bad"), Some("gpu-10"));
    assert_eq!(claim_holder("no-nonce"), None);
}

#[test]
fn a_held_claim_is_done_when_the_phase_is_none_once_the_metadata_could_have_answered() {
    let wait = Duration::from_secs(30);
    let at = Duration::from_secs;
    assert!(claim_done(Phase::None, at(30), wait));
    // Just started: none may be "not read yet", not "over".
    assert!(!claim_done(Phase::None, at(29), wait));
    for phase in [Phase::Pending, Phase::Ongoing, Phase::Terminating] {
        assert!(!claim_done(phase, at(3600), wait), "{phase:?}");
    }
}

#[test]
fn a_holder_keeps_its_claim_while_renewed_and_drops_its_label_before_it_can_lapse() {
    let ttl = Duration::from_secs(120);
    let poll = Duration::from_secs(15);
    let at = Duration::from_secs;
    assert!(still_held(Some(true), at(0), ttl, poll));
    // Expired or someone else's: the label goes at once.
    assert!(!still_held(Some(false), at(0), ttl, poll));
    // No answer: kept while the last confirmed renewal covers this poll and the next.
    assert!(still_held(None, at(15), ttl, poll));
    assert!(still_held(None, at(89), ttl, poll));
    assert!(!still_held(None, at(90), ttl, poll));
    // The shortest claim allowed (2 polls): the first unanswered renewal drops the label.
    assert!(!still_held(None, poll, poll * 2, poll));
}

#[test]
fn interruptions_count_once_per_episode() {
    assert!(interruption_starts(Phase::None, Phase::Terminating));
    assert!(interruption_starts(Phase::Pending, Phase::Ongoing));
    assert!(!interruption_starts(Phase::Ongoing, Phase::Terminating));
    assert!(!interruption_starts(Phase::None, Phase::Pending));
}

#[test]
fn the_gpu_condition_says_why_there_is_no_verdict() {
    use crate::accel::gpu::model::{GpuMonitorState as S, GpuReport};
    use crate::vocab::node::ConditionStatus;
    for (state, reason, says) in [
        (S::Off, "MonitoringOff", "gpu.enabled = off"),
        (S::NoGpu, "NoGpu", "no NVIDIA GPU"),
        (S::WaitingForDriver, "WaitingForDriver", "waiting for the NVIDIA driver"),
        (S::Starting, "Starting", "starting"),
    ] {
        // A failed verdict left over from before is no verdict now.
        let c =
            gpu_condition(&GpuReport { state, node: GpuHealth::Failed, ..GpuReport::default() });
        assert_eq!(c.status, ConditionStatus::Unknown, "{state:?}");
        assert_eq!(c.reason, reason);
        assert!(c.message.contains(says), "{state:?}: {}", c.message);
    }
}

#[test]
fn a_starting_gpu_monitor_leaves_the_nodes_gpu_fields_alone() {
    use crate::accel::gpu::model::{GpuMonitorState as S, GpuReport};
    let k = KubernetesConfig::default();
    let mut d = NodeDesired::default();
    let starting = GpuReport { state: S::Starting, ..GpuReport::default() };
    desired(&k, &starting, true, &mut d);
    assert_eq!(d, NodeDesired::default(), "nothing to write before the first report");
    let off = GpuReport { state: S::Off, ..GpuReport::default() };
    desired(&k, &off, true, &mut d);
    assert_eq!(d.labels.get("vigil.dev/gpu-health"), Some(&None), "off: the label goes");
    assert_eq!(d.remove_taints, vec!["vigil.dev/gpu-failed".to_string()]);
}

/// Issue 27: the agent's own SIGTERM asks for a checkpoint only when the node is going away.
#[test]
fn the_node_is_going_away_only_on_the_signals_that_say_so() {
    use crate::vocab::node_info::{NodeInfo, NodeTaint};
    let taint = |key: &str| NodeInfo {
        taints: vec![NodeTaint {
            key: key.into(),
            value: String::new(),
            effect: "NoSchedule".into(),
        }],
        ..NodeInfo::default()
    };
    let away = |phase, info: Option<&NodeInfo>| going_away(phase, info);
    assert!(away(Phase::Terminating, None).unwrap().contains("notice"));
    let deleting = NodeInfo { deleting: true, ..NodeInfo::default() };
    assert!(away(Phase::None, Some(&deleting)).unwrap().contains("deleted"));
    let shutting =
        NodeInfo { shutting_down: Some("node is shutting down".into()), ..NodeInfo::default() };
    assert!(away(Phase::None, Some(&shutting)).unwrap().contains("kubelet"));
    for (key, _) in GOING_AWAY_TAINTS {
        assert!(away(Phase::None, Some(&taint(key))).unwrap().contains(key));
    }
    let mut gke = NodeInfo::default();
    gke.maintenance.terminating = true;
    assert!(away(Phase::None, Some(&gke)).is_some());
    // A rollout: nothing says the node is going; nor a pending or ongoing maintenance, nor a
    // cordon or someone else's taint; nor nothing known at all.
    assert_eq!(away(Phase::None, Some(&NodeInfo::default())), None);
    assert_eq!(away(Phase::Pending, None), None);
    assert_eq!(away(Phase::Ongoing, None), None);
    assert_eq!(away(Phase::None, Some(&taint("node.kubernetes.io/unschedulable"))), None);
    assert_eq!(away(Phase::None, None), None);
}
