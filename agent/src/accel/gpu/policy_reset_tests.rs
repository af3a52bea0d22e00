//! Table-driven tests of a GPU failure's life: what starts one (a failing XID, the driver's
//! recovery action, a configured override), that it outlives normal samples, and which evidence
//! of a reset clears it (and which does not).

use super::*;
use crate::accel::gpu::model::{Failure, ResetMarks};
use crate::accel::gpu::model::{RecoveryAction, RemappedRows, MAX_CLEARED};

fn failed_with(s0: GpuSample, xid_no: u64) -> GpuReport {
    let cfg = cfg();
    let r = update(&GpuReport::default(), std::slice::from_ref(&s0), &[], T0, &cfg);
    update(&r, &[s0], &[xid(0, xid_no)], T0 + 1, &cfg)
}

#[test]
fn a_failure_outlives_normal_samples_and_clears_on_evidence_of_a_reset() {
    type Edit = fn(&mut GpuSample);
    // (name, sample at the failure, a later sample, cleared?, why fragment)
    let table: &[(&str, Edit, Edit, bool, &str)] = &[
        ("nothing changes", |_| {}, |_| {}, false, ""),
        (
            "remap applied",
            |s| s.remapped_rows = Some(RemappedRows { pending: true, ..Default::default() }),
            |s| s.remapped_rows = Some(RemappedRows::default()),
            true,
            "pending row remap was applied",
        ),
        (
            "remap still pending",
            |s| s.remapped_rows = Some(RemappedRows { pending: true, ..Default::default() }),
            |s| s.remapped_rows = Some(RemappedRows { pending: true, ..Default::default() }),
            false,
            "",
        ),
        (
            "remap unreadable now",
            |s| s.remapped_rows = Some(RemappedRows { pending: true, ..Default::default() }),
            |s| s.remapped_rows = None,
            false,
            "",
        ),
        (
            "pages retired",
            |s| s.retired_pages_pending = Some(true),
            |s| s.retired_pages_pending = Some(false),
            true,
            "pages pending retirement were retired",
        ),
        (
            "driver stops asking",
            |s| s.recovery_action = Some(RecoveryAction::GpuReset),
            |s| s.recovery_action = Some(RecoveryAction::None),
            true,
            "no longer asks for NVML_GPU_RECOVERY_ACTION_GPU_RESET",
        ),
        (
            "driver never asked",
            |s| s.recovery_action = Some(RecoveryAction::None),
            |s| s.recovery_action = Some(RecoveryAction::None),
            false,
            "",
        ),
        (
            "uncorrectable count back to 0",
            |s| s.ecc_volatile_uncorrected = Some(2),
            |s| s.ecc_volatile_uncorrected = Some(0),
            true,
            "volatile ECC counts went back from 2 to 0",
        ),
        (
            "corrected count lower",
            |s| s.ecc_volatile_corrected = Some(10),
            |s| s.ecc_volatile_corrected = Some(3),
            true,
            "from 10 to 3",
        ),
        (
            "counts grow",
            |s| s.ecc_volatile_uncorrected = Some(2),
            |s| s.ecc_volatile_uncorrected = Some(5),
            false,
            "",
        ),
        (
            "energy restarted",
            |s| s.energy_mj = Some(5_000_000),
            |s| s.energy_mj = Some(1_000),
            true,
            "energy counter restarted",
        ),
        (
            "energy grows",
            |s| s.energy_mj = Some(5_000_000),
            |s| s.energy_mj = Some(5_000_100),
            false,
            "",
        ),
    ];
    let cfg = cfg();
    for (name, at_failure, later, clears, why) in table {
        let mut s0 = sample(0);
        at_failure(&mut s0);
        let r = failed_with(s0.clone(), 95);
        assert_eq!(r.node, GpuHealth::Failed, "{name}");
        // Normal samples, as the failure left them: still failed.
        let r = update(&r, &[s0.clone()], &[], T0 + 2, &cfg);
        assert_eq!(r.node, GpuHealth::Failed, "{name}: sticky");
        let mut s1 = s0.clone();
        later(&mut s1);
        let r = update(&r, &[s1], &[], T0 + 3, &cfg);
        if *clears {
            assert_eq!(r.cleared.len(), 1, "{name}: {:?}", r.node_reasons);
            assert!(r.cleared[0].why.contains(why), "{name}: {}", r.cleared[0].why);
            assert!(
                r.cleared[0].causes.contains(&"XID 95 (uncontained ECC error)".to_string()),
                "{name}: {:?}",
                r.cleared[0].causes
            );
            assert_eq!(r.gpus[0].failure, None, "{name}");
            assert_ne!(r.node, GpuHealth::Failed, "{name}");
        } else {
            assert!(r.cleared.is_empty(), "{name}: {:?}", r.cleared);
            assert_eq!(r.node, GpuHealth::Failed, "{name}");
        }
    }
}

#[test]
fn marks_follow_the_samples_while_failed() {
    // The count rises after the XID (the error is counted a moment later); a reset then takes
    // it back below the highest value seen, not only below the value at the failure.
    let cfg = cfg();
    let r = failed_with(sample(0), 95);
    let mut s = sample(0);
    s.ecc_volatile_uncorrected = Some(1);
    let r = update(&r, &[s.clone()], &[], T0 + 2, &cfg);
    assert_eq!(r.gpus[0].failure.as_ref().unwrap().marks.ecc_volatile_uncorrected, Some(1));
    s.ecc_volatile_uncorrected = Some(0);
    let r = update(&r, &[s], &[], T0 + 3, &cfg);
    assert_eq!(r.cleared.len(), 1, "{:?}", r.node_reasons);
}

#[test]
fn the_drivers_recovery_action_fails_the_gpu_by_itself() {
    let cfg = cfg();
    // (action, expected Vigil action, advice fragment)
    for (a, want, advice) in [
        (RecoveryAction::GpuReset, XidAction::ResetGpu, "reset the GPU"),
        (RecoveryAction::NodeReboot, XidAction::RebootNode, "reboot the node"),
        (RecoveryAction::DrainP2p, XidAction::Drain, "drain"),
        (RecoveryAction::DrainAndReset, XidAction::Drain, "drain"),
    ] {
        let mut s = sample(0);
        s.recovery_action = Some(a);
        let r = update(&GpuReport::default(), &[s], &[], T0, &cfg);
        let g = &r.gpus[0];
        assert_eq!(g.health, GpuHealth::Failed, "{a:?}");
        assert_eq!(g.failure.as_ref().map(|f| f.action), Some(want), "{a:?}");
        assert!(g.reasons[0].contains(&a.nvml_name()), "{:?}", g.reasons);
        assert!(g.reasons[0].contains(advice), "{:?}", g.reasons);
    }
    let mut s = sample(0);
    s.recovery_action = Some(RecoveryAction::None);
    let r = update(&GpuReport::default(), &[s], &[], T0, &cfg);
    assert_eq!(r.node, GpuHealth::Healthy);
}

#[test]
fn restart_app_and_informational_xids_never_stand_a_worker_down() {
    let cfg = cfg();
    for x in [13, 31, 43, 63, 92, 94] {
        let r = failed_with(sample(0), x);
        assert!(!worker_on_failed_gpu(&r, None), "XID {x}");
        assert_eq!(r.gpus[0].failure, None, "XID {x}");
        assert_eq!(r.gpus[0].xid_counts.get(&x), Some(&1), "XID {x} still counted");
    }
    let r = failed_with(sample(0), 95);
    assert!(worker_on_failed_gpu(&r, None));
    let _ = cfg;
}

#[test]
fn overrides_change_the_class() {
    let mut cfg = cfg();
    cfg.xid_actions.insert("94".into(), XidAction::ResetGpu);
    cfg.xid_actions.insert("79".into(), XidAction::Informational);
    let r = update(&GpuReport::default(), &[sample(0)], &[xid(0, 94)], T0, &cfg);
    assert_eq!(r.node, GpuHealth::Failed);
    let r = update(&GpuReport::default(), &[sample(0)], &[xid(0, 79)], T0, &cfg);
    assert_eq!(r.node, GpuHealth::Healthy);
    // An XID outside the table, given an action: a known class, not "unknown".
    cfg.xid_actions.insert("999".into(), XidAction::RestartApp);
    let r = update(&GpuReport::default(), &[sample(0)], &[xid(0, 999)], T0, &cfg);
    assert_eq!(r.node, GpuHealth::Healthy, "a known class now, not 'unknown'");
}

/// A failure read from the state file: `kept`, with marks from the last process.
fn kept(marks: ResetMarks) -> GpuReport {
    GpuReport {
        gpus: vec![GpuStatus {
            index: 0,
            uuid: "GPU-0".into(),
            failure: Some(Failure {
                action: XidAction::ResetGpu,
                causes: vec!["XID 95 (uncontained ECC error)".into()],
                kept: true,
                marks_from_file: true,
                marks,
                ..Failure::default()
            }),
            ..GpuStatus::default()
        }],
        ..GpuReport::default()
    }
}

#[test]
fn across_an_agent_restart_counters_count_only_with_persistence_mode() {
    let cfg = cfg();
    let marks = ResetMarks {
        ecc_volatile_uncorrected: Some(2),
        energy_mj: Some(9_000_000),
        ..ResetMarks::default()
    };
    let seed = rejudge(&kept(marks), &cfg);
    assert_eq!(seed.node, GpuHealth::Failed);
    assert!(seed.node_reasons[0].contains("kept from before the agent restarted"));
    // (persistence mode, cleared?): without it the driver unloads when the agent exits, so the
    // counters restart with no reset at all.
    for (pm, clears) in [(Some(true), true), (Some(false), false), (None, false)] {
        let mut s = sample(0);
        s.ecc_volatile_uncorrected = Some(0);
        s.energy_mj = Some(10);
        s.persistence_mode = pm;
        let r = update(&seed, &[s.clone()], &[], T0, &cfg);
        assert_eq!(r.cleared.len(), usize::from(clears), "{pm:?}");
        if !clears {
            assert_eq!(r.node, GpuHealth::Failed, "{pm:?}");
            // From now on the marks are this process's own: a later drop counts.
            s.ecc_volatile_uncorrected = Some(1);
            let r = update(&r, &[s.clone()], &[], T0 + 1, &cfg);
            assert!(r.cleared.is_empty());
            s.ecc_volatile_uncorrected = Some(0);
            let r = update(&r, &[s], &[], T0 + 2, &cfg);
            assert_eq!(r.cleared.len(), 1, "{pm:?}");
        }
    }
    // A flag that cleared needs no persistence mode.
    let seed = kept(ResetMarks { remap_pending: Some(true), ..ResetMarks::default() });
    let r = update(&seed, &[sample(0)], &[], T0, &cfg);
    assert_eq!(r.cleared.len(), 1);
}

/// XIDs that arrive before the first sample (the first read failed) are no reading of the GPU:
/// a failure kept from the state file keeps its marks untrusted, and its GPU is not counted absent.
#[test]
fn xids_before_the_first_sample_read_no_counters() {
    let cfg = cfg();
    let marks = ResetMarks { ecc_volatile_uncorrected: Some(2), ..ResetMarks::default() };
    let mut r = rejudge(&kept(marks), &cfg);
    for i in 0..MISSING_ROUNDS {
        r = update_xids(&r, &[xid(0, 13)], T0 + i64::from(i), &cfg);
    }
    let g = r.gpu("GPU-0").expect("kept");
    assert!(!g.missing && g.missing_rounds == 0, "no read, nothing missed");
    assert_eq!(g.failure.as_ref().map(|f| f.action), Some(XidAction::ResetGpu));
    // No persistence mode: a count below the file's is the driver reloaded, not a reset.
    let r = update(&r, &[sample(0)], &[], T0 + 10, &cfg);
    assert!(r.cleared.is_empty(), "{:?}", r.cleared);
    assert_eq!(r.node, GpuHealth::Failed);
}

#[test]
fn a_kept_lost_gpu_is_missing_until_listed_again() {
    let cfg = cfg();
    let mut seed = kept(ResetMarks::default());
    if let Some(f) = seed.gpus[0].failure.as_mut() {
        f.causes.clear();
        f.lost = true;
    }
    let r = update(&seed, &[sample(1)], &[], T0, &cfg);
    let g = r.gpu("GPU-0").unwrap();
    assert!(g.missing, "lost before the restart: missing at once");
    assert_eq!(g.health, GpuHealth::Failed);
    let r = update(&r, &[sample(0), sample(1)], &[], T0 + 1, &cfg);
    assert_eq!(r.node, GpuHealth::Healthy);
    assert_eq!(r.cleared.len(), 1);
}

#[test]
fn clearings_are_numbered_and_bounded() {
    let cfg = cfg();
    let mut r = GpuReport::default();
    for i in 0..(MAX_CLEARED as i64 + 4) {
        let mut s = sample(0);
        s.retired_pages_pending = Some(true);
        r = update(&r, &[s.clone()], &[xid(0, 95)], T0 + 2 * i, &cfg);
        s.retired_pages_pending = Some(false);
        r = update(&r, &[s], &[], T0 + 2 * i + 1, &cfg);
    }
    assert_eq!(r.cleared.len(), MAX_CLEARED);
    let seqs: Vec<u64> = r.cleared.iter().map(|c| c.seq).collect();
    let first = MAX_CLEARED as u64 + 4 - MAX_CLEARED as u64 + 1;
    assert_eq!(seqs, (first..first + MAX_CLEARED as u64).collect::<Vec<_>>());
}
