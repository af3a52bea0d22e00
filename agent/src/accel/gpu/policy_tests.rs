//! Table-driven tests of the GPU health rules, with a fixed `now`: in a file of their own so the
//! rules in gpu.rs read in one screenful.

use super::*;
use crate::accel::gpu::model::RemappedRows;
use std::time::Duration;

const T0: i64 = 1_000_000;

fn cfg() -> GpuConfig {
    GpuConfig { evidence_window: Duration::from_secs(600), ..GpuConfig::default() }
}

fn sample(index: u32) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-{index}"),
        name: "test".into(),
        ecc_volatile_uncorrected: Some(0),
        retired_pages_pending: Some(false),
        remapped_rows: Some(RemappedRows::default()),
        ..GpuSample::default()
    }
}

fn xid(index: u32, xid: u64) -> XidEvent {
    XidEvent { index, uuid: format!("GPU-{index}"), xid }
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn xid_rules() {
    // (xids on GPU 0, expected GPU 0 health, expected reason fragment)
    let table: &[(&[u64], GpuHealth, Option<&str>)] = &[
        (&[], GpuHealth::Healthy, None),
        (&[79], GpuHealth::Failed, Some("XID 79 (GPU has fallen off the bus); reboot the node")),
        (&[48], GpuHealth::Failed, Some("XID 48 (double-bit ECC error); reset the GPU")),
        (&[95], GpuHealth::Failed, Some("XID 95 (uncontained ECC error)")),
        (&[64], GpuHealth::Failed, Some("XID 64")),
        (&[74], GpuHealth::Failed, Some("XID 74 (NVLink error)")),
        (&[109], GpuHealth::Failed, Some("XID 109 (context switch timeout)")),
        // NVIDIA: survivable. 63 runs until the next reset, 94 ends only the application, 92
        // is informational.
        (&[63], GpuHealth::Healthy, None),
        (&[94], GpuHealth::Healthy, None),
        (&[92], GpuHealth::Healthy, None),
        (&[13], GpuHealth::Healthy, None),
        (&[43], GpuHealth::Healthy, None),
        (&[13, 31, 43, 45, 68, 94], GpuHealth::Healthy, None),
        (
            &[999],
            GpuHealth::Degraded,
            Some("XID 999 seen 1 time(s) recently"),
        ),
        (&[13, 999, 79], GpuHealth::Failed, Some("XID 79")),
        (&[95, 79], GpuHealth::Failed, Some("XID 95 (uncontained ECC error), XID 79 (GPU has fallen off the bus); reboot the node")),
    ];
    let cfg = cfg();
    for (xids, want, why) in table {
        let events: Vec<_> = xids.iter().map(|&x| xid(0, x)).collect();
        let r = update(&GpuReport::default(), &[sample(0), sample(1)], &events, T0, &cfg);
        let g = &r.gpus[0];
        assert_eq!(g.health, *want, "xids {xids:?}");
        assert_eq!(r.node, *want, "node, xids {xids:?}");
        assert_eq!(r.gpus[1].health, GpuHealth::Healthy, "other GPU, xids {xids:?}");
        match why {
            Some(why) => {
                assert!(g.reasons.iter().any(|r| r.contains(why)), "{xids:?}: {:?}", g.reasons)
            }
            None => assert!(g.reasons.is_empty(), "{xids:?}: {:?}", g.reasons),
        }
        for x in *xids {
            assert_eq!(g.xid_counts.get(x), Some(&1), "xid {x} counted");
            assert!(g.recent_xids.contains(&(*x, T0)), "xid {x} recent");
        }
        assert_eq!(r.node_reasons, g.reasons);
    }
}

#[test]
fn hardware_xid_is_sticky_past_the_window() {
    let cfg = cfg();
    let r = update(&GpuReport::default(), &[sample(0)], &[xid(0, 79)], T0, &cfg);
    let later = T0 + ms(cfg.evidence_window) * 10;
    let r = update(&r, &[sample(0)], &[], later, &cfg);
    assert_eq!(r.gpus[0].health, GpuHealth::Failed);
    assert!(r.gpus[0].recent_xids.is_empty(), "trimmed from the recent list");
    assert_eq!(r.gpus[0].xid_counts.get(&79), Some(&1), "but still counted");
}

#[test]
fn unknown_xid_degrades_only_within_the_window() {
    let cfg = cfg();
    let w = ms(cfg.xid_threshold.window);
    let r0 = update(&GpuReport::default(), &[sample(0)], &[xid(0, 999)], T0, &cfg);
    // (age, health): the boundary (exactly the window) still counts.
    for (age, want) in [
        (0, GpuHealth::Degraded),
        (w - 1, GpuHealth::Degraded),
        (w, GpuHealth::Degraded),
        (w + 1, GpuHealth::Healthy),
    ] {
        let r = update(&r0, &[sample(0)], &[], T0 + age, &cfg);
        assert_eq!(r.gpus[0].health, want, "age {age}");
        assert_eq!(r.gpus[0].xid_counts.get(&999), Some(&1));
    }
}

#[test]
fn an_unknown_xid_under_its_threshold_is_counted_but_does_not_degrade() {
    let mut cfg = cfg();
    cfg.xid_threshold.count = 3;
    cfg.xid_threshold.window = Duration::from_secs(60);
    let mut r = GpuReport::default();
    // (seconds after T0, health after the event): three within a minute count; every gap is
    // under a minute, so it is one episode throughout.
    for (at, want) in [
        (0, GpuHealth::Healthy),
        (40, GpuHealth::Healthy),
        (90, GpuHealth::Healthy),
        (140, GpuHealth::Healthy),
        (150, GpuHealth::Degraded),
    ] {
        r = update(&r, &[sample(0)], &[xid(0, 999)], T0 + at * 1000, &cfg);
        assert_eq!(r.gpus[0].health, want, "at {at}s");
    }
    assert_eq!(r.begun.len(), 1, "one episode: every gap under the window");
    assert_eq!(r.gpus[0].xid_counts.get(&999), Some(&5));
    // Quiet for a window: the episode ends and the GPU is healthy again.
    let r = update(&r, &[sample(0)], &[], T0 + 211_000, &cfg);
    assert_eq!(r.gpus[0].health, GpuHealth::Healthy);
    assert!(r.gpus[0].episodes.is_empty());
}

#[test]
fn a_storm_of_one_xid_is_one_begun_episode_in_the_report() {
    let cfg = cfg();
    let mut r = GpuReport::default();
    for i in 0..1000 {
        let storm = [xid(0, 13), xid(0, 13), xid(1, 13)];
        r = update(&r, &[sample(0), sample(1)], &storm, T0 + i, &cfg);
    }
    let begun: Vec<_> = r.begun.iter().map(|b| (b.gpu.as_str(), b.xid)).collect();
    assert_eq!(begun, [("GPU 0 (GPU-0)", 13), ("GPU 1 (GPU-1)", 13)]);
    assert_eq!(r.gpus[0].episodes[0].count, 2000);
    assert_eq!(r.gpus[0].xid_counts.get(&13), Some(&2000));
    assert_eq!(r.node, GpuHealth::Healthy, "an application's XID is no verdict");
}

#[test]
fn sample_rules() {
    type Edit = fn(&mut GpuSample);
    let table: &[(&str, Edit, GpuHealth, Option<&str>)] = &[
        ("clean", |_| {}, GpuHealth::Healthy, None),
        ("ecc unknown", |s| s.ecc_volatile_uncorrected = None, GpuHealth::Healthy, None),
        ("ecc 0", |s| s.ecc_volatile_uncorrected = Some(0), GpuHealth::Healthy, None),
        (
            "ecc 1",
            |s| s.ecc_volatile_uncorrected = Some(1),
            GpuHealth::Degraded,
            Some("1 uncorrectable ECC"),
        ),
        ("aggregate only", |s| s.ecc_aggregate_uncorrected = Some(7), GpuHealth::Healthy, None),
        ("corrected only", |s| s.ecc_volatile_corrected = Some(1000), GpuHealth::Healthy, None),
        (
            "pending retire",
            |s| s.retired_pages_pending = Some(true),
            GpuHealth::Degraded,
            Some("pending retirement"),
        ),
        ("pending unknown", |s| s.retired_pages_pending = None, GpuHealth::Healthy, None),
        ("retired, not pending", |s| s.retired_pages = Some(5), GpuHealth::Healthy, None),
        (
            "remap failure",
            |s| s.remapped_rows = Some(RemappedRows { failure: true, ..Default::default() }),
            GpuHealth::Failed,
            Some("row remapping failed"),
        ),
        (
            "remap pending",
            |s| s.remapped_rows = Some(RemappedRows { pending: true, ..Default::default() }),
            GpuHealth::Degraded,
            Some("row remap is pending; the GPU runs on until its next reset"),
        ),
        (
            "remapped rows, no failure",
            |s| {
                s.remapped_rows =
                    Some(RemappedRows { correctable: 3, uncorrectable: 1, ..Default::default() })
            },
            GpuHealth::Healthy,
            None,
        ),
        ("no remap counters", |s| s.remapped_rows = None, GpuHealth::Healthy, None),
        (
            "hot and throttled",
            |s| {
                s.temperature_c = Some(95);
                s.throttle_reasons = vec!["hw-thermal"];
            },
            GpuHealth::Healthy,
            None,
        ),
    ];
    let cfg = cfg();
    for (name, edit, want, why) in table {
        let mut s = sample(1);
        edit(&mut s);
        let r = update(&GpuReport::default(), &[sample(0), s.clone()], &[], T0, &cfg);
        let g = r.gpu("1").expect("gpu 1");
        assert_eq!(g.health, *want, "{name}");
        assert_eq!(r.node, *want, "{name}: node");
        assert_eq!(g.sample, s, "{name}: last sample kept");
        match why {
            Some(why) => {
                assert!(g.reasons.iter().any(|r| r.contains(why)), "{name}: {:?}", g.reasons);
                assert!(g.reasons[0].starts_with("GPU 1 (GPU-1): "), "{name}: {:?}", g.reasons);
            }
            None => assert!(g.reasons.is_empty(), "{name}: {:?}", g.reasons),
        }
    }
}

#[test]
fn degraded_conditions_clear_when_the_sample_clears() {
    let cfg = cfg();
    let mut bad = sample(0);
    bad.retired_pages_pending = Some(true);
    let r = update(&GpuReport::default(), &[bad], &[], T0, &cfg);
    assert_eq!(r.node, GpuHealth::Degraded);
    let r = update(&r, &[sample(0)], &[], T0 + 1, &cfg);
    assert_eq!(r.node, GpuHealth::Healthy);
    assert!(r.node_reasons.is_empty());
}

#[test]
fn missing_gpu_is_failed_and_keeps_its_last_sample() {
    let cfg = cfg();
    let mut s1 = sample(1);
    s1.temperature_c = Some(61);
    let r = update(&GpuReport::default(), &[sample(0), s1.clone()], &[], T0, &cfg);
    // One or two failed reads are not a lost GPU.
    let r = update(&r, &[sample(0)], &[], T0 + 1, &cfg);
    assert!(r.gpu("GPU-1").is_some_and(|g| !g.missing && g.health == GpuHealth::Healthy));
    let r = update(&r, &[sample(0)], &[], T0 + 1, &cfg);
    assert!(r.gpu("GPU-1").is_some_and(|g| !g.missing));
    let r = update(&r, &[sample(0)], &[], T0 + 1, &cfg);
    assert_eq!(r.gpus.len(), 2);
    let g = r.gpu("GPU-1").expect("still listed");
    assert!(g.missing);
    assert_eq!(g.health, GpuHealth::Failed);
    assert_eq!(
        g.reasons,
        vec!["GPU 1 (GPU-1): no longer visible to NVML (fell off the bus?); reboot the node"
            .to_string()]
    );
    assert_eq!(g.sample, s1);
    assert_eq!(r.node, GpuHealth::Failed);
    assert_eq!(r.gpu("0").map(|g| g.health), Some(GpuHealth::Healthy));
    // Still missing on the next round; back when NVML lists it again (an XID is what sticks),
    // and the clearing says so.
    let r = update(&r, &[sample(0)], &[], T0 + 2, &cfg);
    assert!(r.gpu("1").is_some_and(|g| g.missing));
    assert!(r.cleared.is_empty());
    let r = update(&r, &[sample(0), sample(1)], &[], T0 + 3, &cfg);
    assert!(r.gpu("1").is_some_and(|g| !g.missing && g.health == GpuHealth::Healthy));
    assert_eq!(r.cleared.len(), 1);
    assert_eq!(r.cleared[0].why, "NVML lists the GPU again");
    assert_eq!(r.cleared[0].gpu, "GPU 1 (GPU-1)");
}

/// XIDs between samples are no reading: one sample without GPU 1 (its UUID read failing once)
/// followed by an XID storm on GPU 0, a batch a second, must not make GPU 1 missing.
#[test]
fn xid_batches_are_not_missed_reads() {
    let cfg = cfg();
    let r = update(&GpuReport::default(), &[sample(0), sample(1)], &[], T0, &cfg);
    let mut r = update(&r, &[sample(0)], &[], T0 + 1, &cfg);
    for i in 1..=MISSING_ROUNDS {
        r = update_xids(&r, &[xid(0, 13)], T0 + i64::from(i) * 1000, &cfg);
    }
    let g = r.gpu("GPU-1").expect("still listed");
    assert!(!g.missing, "XID batches counted as missed reads");
    assert_eq!(g.missing_rounds, 1, "the one sample that missed it");
    assert_eq!(g.health, GpuHealth::Healthy);
    assert_eq!(r.node, GpuHealth::Healthy);
    // The XIDs themselves were folded in.
    let g0 = r.gpu("GPU-0").expect("GPU 0");
    assert_eq!(g0.xid_counts.get(&13).copied(), Some(u64::from(MISSING_ROUNDS)));
    // The rule is unchanged: samples without GPU 1, MISSING_ROUNDS in all, make it missing.
    for i in 1..MISSING_ROUNDS {
        assert!(r.gpu("GPU-1").is_some_and(|g| !g.missing), "after {i} sample(s)");
        r = update(&r, &[sample(0)], &[], T0 + 10_000 + i64::from(i), &cfg);
    }
    let g = r.gpu("GPU-1").expect("still listed");
    assert!(g.missing);
    assert_eq!(g.health, GpuHealth::Failed);
}

#[test]
fn never_seen_gpus_are_not_missing() {
    let r = update(&GpuReport::default(), &[], &[], T0, &cfg());
    assert!(r.monitoring());
    assert!(r.gpus.is_empty());
    assert_eq!(r.node, GpuHealth::Healthy);
}

#[test]
fn identity_is_the_uuid_not_the_index() {
    let cfg = cfg();
    let r = update(&GpuReport::default(), &[sample(0)], &[xid(0, 79)], T0, &cfg);
    // The same GPU renumbered: its verdict follows it.
    let mut moved = sample(0);
    moved.index = 3;
    let r = update(&r, &[moved], &[], T0 + 1, &cfg);
    assert_eq!(r.gpus.len(), 1);
    assert_eq!(r.gpus[0].index, 3);
    assert_eq!(r.gpus[0].health, GpuHealth::Failed);
}

#[test]
fn xid_for_an_unsampled_gpu_is_kept() {
    let r = update(&GpuReport::default(), &[sample(0)], &[xid(5, 79)], T0, &cfg());
    let g = r.gpu("5").expect("entry for the XID");
    assert_eq!(g.health, GpuHealth::Failed);
    assert!(!g.missing);
    assert_eq!(r.node, GpuHealth::Failed);
}

#[test]
fn repeated_xids_count_and_recent_list_is_bounded() {
    let cfg = cfg();
    let many: Vec<_> = (0..MAX_RECENT_XIDS + 10).map(|_| xid(0, 13)).collect();
    let r = update(&GpuReport::default(), &[sample(0)], &many, T0, &cfg);
    let r = update(&r, &[sample(0)], &[xid(0, 13)], T0 + 5, &cfg);
    let g = &r.gpus[0];
    assert_eq!(g.xid_counts.get(&13), Some(&(MAX_RECENT_XIDS as u64 + 11)));
    assert_eq!(g.recent_xids.len(), MAX_RECENT_XIDS);
    assert_eq!(g.recent_xids.last(), Some(&(13, T0 + 5)), "the newest are kept");
    assert_eq!(g.health, GpuHealth::Healthy);
}

#[test]
fn node_is_the_worst_gpu() {
    let cfg = cfg();
    let mut d = sample(1);
    d.ecc_volatile_uncorrected = Some(2);
    let r = update(&GpuReport::default(), &[sample(0), d.clone(), sample(2)], &[], T0, &cfg);
    assert_eq!(r.node, GpuHealth::Degraded);
    let r = update(&r, &[sample(0), d, sample(2)], &[xid(2, 95)], T0 + 1, &cfg);
    assert_eq!(r.node, GpuHealth::Failed);
    assert_eq!(r.node_reasons.len(), 2, "{:?}", r.node_reasons);
    assert!(r.node_reasons[0].starts_with("GPU 1 "));
    assert!(r.node_reasons[1].starts_with("GPU 2 "));
}

#[test]
fn evidence_lines() {
    let cfg = cfg(); // evidence_xids 43, 109; window 10 min
    let w = ms(cfg.evidence_window);
    let r = update(
        &GpuReport::default(),
        &[sample(0), sample(1)],
        &[xid(0, 43), xid(0, 13), xid(1, 109), xid(1, 79)],
        T0,
        &cfg,
    );
    let all = vec![
        "XID 43 on GPU 0 (GPU-0) 2m ago".to_string(),
        "XID 109 on GPU 1 (GPU-1) 2m ago".to_string(),
    ];
    let at = T0 + 120_000;
    // (selection, now, expected)
    let table: Vec<(Option<Vec<String>>, i64, Vec<String>)> = vec![
        (None, at, all.clone()),
        (Some(ids(&["all"])), at, all.clone()),
        (Some(ids(&["0"])), at, all[..1].to_vec()),
        (Some(ids(&["GPU-1"])), at, all[1..].to_vec()),
        (Some(ids(&["gpu-1", " 0 "])), at, all.clone()),
        (Some(ids(&["7"])), at, vec![]),
        (Some(vec![]), at, vec![]),
        (Some(ids(&["0"])), T0, vec!["XID 43 on GPU 0 (GPU-0) 0s ago".to_string()]),
        (Some(ids(&["0"])), T0 + w, vec![format!("XID 43 on GPU 0 (GPU-0) {} ago", human(w))]),
        (Some(ids(&["0"])), T0 + w + 1, vec![]),
        (Some(ids(&["0"])), T0 - 1, vec![]),
    ];
    for (sel, now, want) in table {
        assert_eq!(evidence(&r, sel.as_deref(), now, &cfg), want, "{sel:?} at {now}");
    }
}

#[test]
fn failed_gpu_under_a_worker() {
    let cfg = cfg();
    let r = update(&GpuReport::default(), &[sample(0), sample(1)], &[xid(1, 79)], T0, &cfg);
    let table: &[(Option<&[&str]>, bool)] = &[
        (None, true),
        (Some(&["all"]), true),
        (Some(&["1"]), true),
        (Some(&["GPU-1"]), true),
        (Some(&["0", "1"]), true),
        (Some(&["0"]), false),
        (Some(&["GPU-0"]), false),
        (Some(&["9"]), false),
        (Some(&[]), false),
    ];
    for (sel, want) in table {
        let sel = sel.map(ids);
        assert_eq!(worker_on_failed_gpu(&r, sel.as_deref()), *want, "{sel:?}");
    }
    let healthy = update(&GpuReport::default(), &[sample(0)], &[], T0, &cfg);
    assert!(!worker_on_failed_gpu(&healthy, None));
    let degraded = {
        let mut s = sample(0);
        s.retired_pages_pending = Some(true);
        update(&GpuReport::default(), &[s], &[], T0, &cfg)
    };
    assert!(!worker_on_failed_gpu(&degraded, None), "degraded is not failed");
    assert!(!worker_on_failed_gpu(&GpuReport::default(), None));
}

/// GKE's device plugin names GPUs by device file (`nvidiaN`): N is the minor number NVML
/// reports, which need not be the index; without a minor number the index stands in.
#[test]
fn device_file_names_match_the_minor_number() {
    let cfg = cfg();
    let (mut a, mut b) = (sample(0), sample(1));
    a.minor_number = Some(1);
    b.minor_number = Some(0);
    let r = update(&GpuReport::default(), &[a, b], &[xid(1, 79)], T0, &cfg);
    let on = |id: &str| worker_on_failed_gpu(&r, Some(&[id.to_string()]));
    assert!(on("nvidia0"), "GPU index 1 is /dev/nvidia0");
    assert!(!on("nvidia1"));
    let unknown = update(&GpuReport::default(), &[sample(0)], &[xid(3, 79)], T0, &cfg);
    assert!(worker_on_failed_gpu(&unknown, Some(&["nvidia3".to_string()])));
    assert!(!worker_on_failed_gpu(&unknown, Some(&["nvidia0".to_string()])));
}

#[path = "policy_reset_tests.rs"]
mod reset;
