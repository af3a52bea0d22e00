use super::*;
use crate::config::FleetConfig;
use crate::vocab::maintenance::Interruption;
use crate::vocab::node_info::{place, NodeTaint, Place};

fn raw(labels: &[(&str, &str)]) -> RawNode {
    RawNode {
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..RawNode::default()
    }
}

fn with_tpu(labels: &[(&str, &str)], chips: &str) -> RawNode {
    let mut r = raw(labels);
    r.allocatable.insert(TPU_RESOURCE.into(), chips.into());
    r
}

fn taint(key: &str, effect: &str) -> NodeTaint {
    NodeTaint { key: key.into(), value: String::new(), effect: effect.into() }
}

/// The problems of one parse, each checked to name its key.
fn problems_of(r: &RawNode, key: &str) -> usize {
    let info = parse(r);
    for p in &info.problems {
        assert!(p.contains(key), "{p:?} does not name {key}");
    }
    info.problems.len()
}

#[test]
fn a_node_without_gke_labels_says_nothing() {
    let info = parse(&RawNode::default());
    assert_eq!(info, NodeInfo::default());
    assert_eq!(labels_state(&info), MaintenanceState::default());
    assert_eq!(info.accelerator(), None);
}

#[test]
fn pool_and_accelerators_present_absent_empty() {
    for (key, get) in [
        (POOL_LABEL, (|i: &NodeInfo| i.pool.clone()) as fn(&NodeInfo) -> Option<String>),
        (GPU_ACCELERATOR_LABEL, |i: &NodeInfo| i.gpu_accelerator.clone()),
        (TPU_ACCELERATOR_LABEL, |i: &NodeInfo| i.tpu_accelerator.clone()),
    ] {
        assert_eq!(get(&parse(&raw(&[(key, "x-1")]))), Some("x-1".into()), "{key}");
        assert_eq!(get(&parse(&raw(&[]))), None, "{key}");
        let empty = raw(&[(key, "")]);
        assert_eq!(get(&parse(&empty)), None, "{key}");
        assert_eq!(problems_of(&empty, key), 1, "{key}");
    }
    let gpu = parse(&raw(&[(GPU_ACCELERATOR_LABEL, "nvidia-h100-80gb")]));
    assert_eq!(gpu.accelerator(), Some("nvidia-h100-80gb"));
    let tpu = parse(&raw(&[(TPU_ACCELERATOR_LABEL, "tpu-v5p-slice")]));
    assert_eq!(tpu.accelerator(), Some("tpu-v5p-slice"));
}

#[test]
fn provisioning_table() {
    use Provisioning::*;
    /// Labels → provisioning, problems.
    type Row<'a> = (&'a [(&'a str, &'a str)], Option<Provisioning>, usize);
    #[rustfmt::skip]
    let table: &[Row] = &[
        (&[],                                                     None,               0),
        (&[(PROVISIONING_LABEL, "standard")],                     Some(Standard),     0),
        (&[(PROVISIONING_LABEL, "spot")],                         Some(Spot),         0),
        (&[(PROVISIONING_LABEL, "reservation-bound")],            Some(Other("reservation-bound".into())), 0),
        (&[(PROVISIONING_LABEL, "")],                             None,               1),
        (&[(SPOT_LABEL, "true")],                                 Some(Spot),         0),
        (&[(SPOT_LABEL, "false")],                                None,               0),
        (&[(SPOT_LABEL, "yes")],                                  None,               1),
        (&[(SPOT_LABEL, "true"), (PROVISIONING_LABEL, "spot")],   Some(Spot),         0),
        // A VM that may be preempted says so, whatever else its labels say.
        (&[(SPOT_LABEL, "true"), (PROVISIONING_LABEL, "standard")], Some(Spot),       1),
        (&[(SPOT_LABEL, "false"), (PROVISIONING_LABEL, "standard")], Some(Standard),  0),
        (&[(PREEMPTIBLE_LABEL, "true")],                          Some(Preemptible),  0),
        (&[(PREEMPTIBLE_LABEL, "1")],                             None,               1),
        (&[(FLEX_START_LABEL, "true")],                           Some(FlexStart),    0),
        (&[(FLEX_START_LABEL, "TRUE")],                           None,               1),
        (&[(FLEX_START_LABEL, "true"), (PROVISIONING_LABEL, "standard")], Some(FlexStart), 1),
        (&[(SPOT_LABEL, "true"), (FLEX_START_LABEL, "true")],     Some(Spot),         0),
    ];
    for (i, (labels, want, problems)) in table.iter().enumerate() {
        let info = parse(&raw(labels));
        assert_eq!(&info.provisioning, want, "row {i}");
        assert_eq!(info.problems.len(), *problems, "row {i}: {:?}", info.problems);
    }
    assert_eq!(Provisioning::Other("x".into()).as_str(), "x");
    assert_eq!(Provisioning::Other("x".into()).metric_label(), "other");
    assert!(Provisioning::Spot.preemptible() && Provisioning::Preemptible.preemptible());
    assert!(!Provisioning::FlexStart.preemptible());
}

#[test]
fn tpu_topology_and_hosts() {
    let topo = |t: &str, chips: &str| parse(&with_tpu(&[(TPU_TOPOLOGY_LABEL, t)], chips));
    // v5p 2x2x4 = 16 chips, 4 per host: one host of four.
    let multi = topo("2x2x4", "4");
    assert_eq!(multi.tpu_topology.as_ref().map(|t| t.chips), Some(16));
    assert_eq!(multi.tpu_chips_per_host, Some(4));
    assert_eq!(multi.multi_host_tpu, Some(true));
    // ct5lp-hightpu-4t 2x2 and ct4p 2x2x1: single-host slices.
    assert_eq!(topo("2x2", "4").multi_host_tpu, Some(false));
    assert_eq!(topo("2x2x1", "4").multi_host_tpu, Some(false));
    assert_eq!(topo("1x1", "1").multi_host_tpu, Some(false));
    for bad in ["", "2", "2x", "x2", "2x0", "2xa", "2x-1", "2 x2", "99999999999x99999999999"] {
        let info = topo(bad, "4");
        assert_eq!(info.tpu_topology, None, "{bad:?}");
        assert_eq!(info.multi_host_tpu, None, "{bad:?}");
        assert_eq!(
            problems_of(&with_tpu(&[(TPU_TOPOLOGY_LABEL, bad)], "4"), TPU_TOPOLOGY_LABEL),
            1
        );
    }
    // The allocatable count: a whole number as the API writes it; anything else is unknown.
    assert_eq!(topo("2x2x4", "0").multi_host_tpu, None, "no chips yet");
    for bad in ["four", "4.5", "-1", ""] {
        let r = with_tpu(&[(TPU_TOPOLOGY_LABEL, "2x2x4")], bad);
        let info = parse(&r);
        assert_eq!(info.tpu_chips_per_host, None, "{bad:?}");
        assert_eq!(info.multi_host_tpu, None, "{bad:?}");
        assert_eq!(problems_of(&r, TPU_RESOURCE), 1);
    }
    // No allocatable: the topology alone says nothing about hosts.
    let info = parse(&raw(&[(TPU_TOPOLOGY_LABEL, "4x4")]));
    assert_eq!((info.tpu_chips_per_host, info.multi_host_tpu), (None, None));
    // Allocatable and taints are carried as read.
    let r = with_tpu(&[], "4");
    assert_eq!(parse(&r).allocatable[TPU_RESOURCE], "4");
}

#[test]
fn gke_maintenance_signals_present_absent_malformed() {
    let m = |r: &RawNode| parse(r).maintenance;
    assert_eq!(m(&raw(&[])), GkeMaintenance::default());
    let s = m(&raw(&[(SCHEDULED_MAINTENANCE_LABEL, "1733083200")]));
    assert!(s.scheduled && !s.active && !s.terminating);
    assert_eq!(s.scheduled_at, Some(1_733_083_200_000));
    for bad in ["soon", "", "-5", "0", "1733083200.5"] {
        let r = raw(&[(SCHEDULED_MAINTENANCE_LABEL, bad)]);
        let s = m(&r);
        assert!(s.scheduled, "{bad:?}: present means scheduled");
        assert_eq!(s.scheduled_at, None, "{bad:?}");
        assert_eq!(problems_of(&r, SCHEDULED_MAINTENANCE_LABEL), 1);
    }
    assert!(m(&raw(&[(ACTIVE_MAINTENANCE_LABEL, "ONGOING")])).active);
    for other in ["ongoing", "COMPLETE", ""] {
        let r = raw(&[(ACTIVE_MAINTENANCE_LABEL, other)]);
        assert!(!m(&r).active, "{other:?}");
        assert_eq!(problems_of(&r, ACTIVE_MAINTENANCE_LABEL), 1);
    }
    for effect in ["NoSchedule", "NoExecute"] {
        let mut r = raw(&[]);
        r.taints =
            vec![taint("other/taint", "NoSchedule"), taint(IMPENDING_TERMINATION_TAINT, effect)];
        assert!(m(&r).terminating, "{effect}");
        assert_eq!(parse(&r).taints.len(), 2);
    }
    let mut r = raw(&[]);
    r.taints = vec![taint("cloud.google.com/impending-node-termination-x", "NoSchedule")];
    assert!(!m(&r).terminating, "only the exact key");
}

#[test]
fn labels_state_table() {
    let spot = (SPOT_LABEL, "true");
    let sched = (SCHEDULED_MAINTENANCE_LABEL, "1796032800"); // 2026-11-30T10:00:00Z
    let active = (ACTIVE_MAINTENANCE_LABEL, "ONGOING");
    let st = |labels: &[(&str, &str)], tainted: bool| {
        let mut r = raw(labels);
        if tainted {
            r.taints = vec![taint(IMPENDING_TERMINATION_TAINT, "NoSchedule")];
        }
        labels_state(&parse(&r))
    };
    let s = st(&[sched], false);
    assert_eq!(s.phase, Phase::Pending);
    assert_eq!(s.window_start.as_deref(), Some("2026-11-30T10:00:00.000Z"));
    assert_eq!(
        (s.reasons.clone(), s.sources.clone()),
        (vec![REASON_SCHEDULED], vec![Source::NodeLabels])
    );
    assert!(!s.can_reschedule && s.interruption.is_none());
    let s = st(&[sched, active], false);
    assert_eq!((s.phase, s.interruption), (Phase::Ongoing, Some(Interruption::HostMaintenance)));
    assert_eq!(s.reasons, vec![REASON_ACTIVE, REASON_SCHEDULED]);
    let s = st(&[active], true);
    assert_eq!(
        (s.phase, s.interruption),
        (Phase::Terminating, Some(Interruption::HostMaintenance))
    );
    let s = st(&[spot], true);
    assert_eq!((s.phase, s.interruption), (Phase::Terminating, Some(Interruption::Preemption)));
    assert_eq!(s.reasons, vec![REASON_TERMINATION]);
    let s = st(&[spot], false);
    assert_eq!(s, MaintenanceState::default(), "Spot alone is no notice");
    let s = st(&[(SCHEDULED_MAINTENANCE_LABEL, "soon")], false);
    assert_eq!((s.phase, s.window_start), (Phase::Pending, None), "no date: caution wins");
}

fn state(
    phase: Phase,
    source: Source,
    window: Option<&str>,
    reason: &'static str,
) -> MaintenanceState {
    MaintenanceState {
        phase,
        window_start: window.map(str::to_string),
        window_end: window.map(|_| "2026-12-01T00:00:00Z".to_string()),
        can_reschedule: source == Source::Metadata,
        reasons: if phase == Phase::None { vec![] } else { vec![reason] },
        interruption: matches!(phase, Phase::Ongoing | Phase::Terminating)
            .then_some(Interruption::HostMaintenance),
        sources: if phase == Phase::None { vec![] } else { vec![source] },
    }
}

#[test]
fn merge_takes_the_worse_phase_and_never_lowers_the_metadata_one() {
    use Phase::{Ongoing, Pending, Terminating};
    let phases = [Phase::None, Pending, Ongoing, Terminating];
    for m in phases {
        for l in phases {
            let meta = state(m, Source::Metadata, Some("2026-11-30T10:00:00Z"), "upcoming-pending");
            let labels =
                state(l, Source::NodeLabels, Some("2026-11-30T10:00:00Z"), REASON_SCHEDULED);
            let got = merge(&meta, &labels);
            assert_eq!(got.phase, m.max(l), "{m:?} + {l:?}");
            assert!(got.phase >= meta.phase, "the labels never lower metadata");
            assert_eq!(got.can_reschedule, meta.can_reschedule, "metadata's alone");
            let mut want_sources = meta.sources.clone();
            want_sources.extend(labels.sources.clone());
            assert_eq!(got.sources, want_sources, "{m:?} + {l:?}");
            assert_eq!(got.reasons.len(), meta.reasons.len() + labels.reasons.len());
        }
    }
    // Nothing from the labels: the metadata state, exactly.
    let meta = state(Ongoing, Source::Metadata, None, "upcoming-ongoing");
    assert_eq!(merge(&meta, &MaintenanceState::default()), meta);
    // The labels alone: theirs, exactly.
    let labels = state(Terminating, Source::NodeLabels, None, REASON_TERMINATION);
    assert_eq!(merge(&MaintenanceState::default(), &labels), labels);
}

#[test]
fn merge_of_two_pending_notices_keeps_the_nearer_window() {
    let far =
        state(Phase::Pending, Source::Metadata, Some("2026-12-05T10:00:00Z"), "upcoming-pending");
    let near = state(
        Phase::Pending,
        Source::NodeLabels,
        Some("2026-11-30T10:00:00.000Z"),
        REASON_SCHEDULED,
    );
    let got = merge(&far, &near);
    assert_eq!(got.window_start.as_deref(), Some("2026-11-30T10:00:00.000Z"));
    assert!(got.can_reschedule, "still the metadata's");
    let got = merge(&near_meta(), &far_labels());
    assert_eq!(got.window_start.as_deref(), Some("2026-11-30T10:00:00Z"));
    // A notice without a date is the nearest of all.
    let undated = state(Phase::Pending, Source::NodeLabels, None, REASON_SCHEDULED);
    assert_eq!(merge(&far, &undated).window_start, None);
    // A worse phase without a window borrows the other's.
    let ongoing = state(Phase::Ongoing, Source::NodeLabels, None, REASON_ACTIVE);
    let got = merge(&far, &ongoing);
    assert_eq!(
        (got.phase, got.window_start.as_deref()),
        (Phase::Ongoing, Some("2026-12-05T10:00:00Z"))
    );
}

fn near_meta() -> MaintenanceState {
    state(Phase::Pending, Source::Metadata, Some("2026-11-30T10:00:00Z"), "upcoming-pending")
}

fn far_labels() -> MaintenanceState {
    state(Phase::Pending, Source::NodeLabels, Some("2026-12-05T10:00:00Z"), REASON_SCHEDULED)
}

/// The label source stands restarts down through the very rule the metadata source uses.
#[test]
fn a_gke_label_stands_restarts_down_like_a_metadata_notice() {
    use crate::config::MetadataConfig;
    use crate::vocab::stand_down::stands_down;
    let m = MetadataConfig::default(); // pending_horizon 1h
    let start = 1_796_032_800_000; // 2026-11-30T10:00:00Z
    let info = parse(&raw(&[(SCHEDULED_MAINTENANCE_LABEL, "1796032800")]));
    let st = merge(&MaintenanceState::default(), &labels_state(&info));
    assert!(!stands_down(&st, None, start - 3_600_001, &m), "days ahead: restarts go on");
    assert!(stands_down(&st, None, start - 3_600_000, &m), "within the horizon");
    let info = parse(&raw(&[(ACTIVE_MAINTENANCE_LABEL, "ONGOING")]));
    assert!(stands_down(&labels_state(&info), None, 0, &m));
}

#[test]
fn place_prefers_the_config_then_the_labels() {
    let cfg = |pool: &str, slice: &str| FleetConfig {
        pool: pool.into(),
        slice: slice.into(),
        ..FleetConfig::default()
    };
    let gpu = parse(&raw(&[(POOL_LABEL, "gpu-pool")]));
    let tpu = parse(&with_tpu(&[(POOL_LABEL, "tpu-pool"), (TPU_TOPOLOGY_LABEL, "2x2x4")], "4"));
    let single = parse(&with_tpu(&[(POOL_LABEL, "v5e"), (TPU_TOPOLOGY_LABEL, "2x2")], "4"));
    let p = |pool: &str, slice: &str| Place { pool: pool.into(), slice: slice.into() };
    assert_eq!(place(&cfg("", ""), None), p("", ""), "not read yet: none");
    assert_eq!(place(&cfg("", ""), Some(&gpu)), p("gpu-pool", ""));
    assert_eq!(place(&cfg("mine", ""), Some(&gpu)), p("mine", ""), "config wins");
    assert_eq!(place(&cfg("mine", ""), None), p("mine", ""));
    assert_eq!(
        place(&cfg("", ""), Some(&tpu)),
        p("tpu-pool", "tpu-pool"),
        "a multi-host slice is its pool"
    );
    assert_eq!(
        place(&cfg("", ""), Some(&single)),
        p("v5e", ""),
        "a single-host slice is no fleet slice"
    );
    assert_eq!(place(&cfg("", "s1"), Some(&tpu)), p("tpu-pool", "s1"), "config wins");
    assert_eq!(place(&cfg("over", ""), Some(&tpu)), p("over", "over"));
}
