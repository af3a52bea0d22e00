//! GPU health verdicts (pure): `(previous report, samples, XID events, now) -> report`.
//!
//! Map: [`update`] folds one round of observations from a GPU probe (`crate::sources::gpu`)
//! into a [`GpuReport`] (per-GPU [`GpuStatus`] and the node verdict); [`evidence`] turns recent
//! application XIDs into lines for a hang alert; [`worker_on_failed_gpu`] tells the restart policy
//! that a restart cannot help. No I/O and no clock reads: `now_ms` is handed in, on the monotonic
//! millisecond clock of the GPU monitor (`crate::engine::gpu::clock_ms`).
//!
//! The rules, worst first:
//! - a hardware XID (`gpu.hardware_xids`) seen at any time in this process → `failed`, for good;
//! - a GPU seen before and absent from the latest sample → `failed`, `missing`;
//! - an XID that is neither hardware nor application, within `gpu.evidence_window` → `degraded`;
//! - pages pending retirement, a row-remap failure or pending remap, or volatile uncorrectable ECC
//!   errors → `degraded`;
//! - application XIDs (`gpu.application_xids`) are recorded (counts, recent list), never a verdict.
//!
//! The node is as healthy as its worst GPU.

use std::collections::BTreeMap;

use crate::clock::{human, ms, Millis};
use crate::config::GpuConfig;
use crate::model::gpu::{
    selects, GpuHealth, GpuReport, GpuSample, GpuStatus, XidEvent, MAX_RECENT_XIDS, MISSING_ROUNDS,
};

/// `None`, or a list containing `all`, means every GPU of the node.
fn all_gpus(gpus: Option<&[String]>) -> bool {
    gpus.is_none_or(|ids| ids.iter().any(|id| id.trim().eq_ignore_ascii_case("all")))
}

fn label(index: u32, uuid: &str) -> String {
    if uuid.is_empty() {
        format!("GPU {index}")
    } else {
        format!("GPU {index} ({uuid})")
    }
}

/// Fold one round of observations into the report.
///
/// `samples` is the latest complete reading of every GPU NVML can see (callers must not pass an
/// empty list for a failed read: that would mark every GPU missing). `xids` are the events that
/// arrived since the last call; they are stamped `now_ms`.
pub(crate) fn update(
    prev: &GpuReport,
    samples: &[GpuSample],
    xids: &[XidEvent],
    now_ms: i64,
    cfg: &GpuConfig,
) -> GpuReport {
    let mut gpus = merge_samples(prev, samples);
    fold_xids(&mut gpus, xids, now_ms);
    let window = ms(cfg.evidence_window);
    for g in &mut gpus {
        g.recent_xids.retain(|&(_, at)| now_ms - at <= window);
        if g.recent_xids.len() > MAX_RECENT_XIDS {
            let extra = g.recent_xids.len() - MAX_RECENT_XIDS;
            g.recent_xids.drain(..extra);
        }
        let (health, reasons) = judge(g, cfg);
        g.health = health;
        g.reasons = reasons;
    }
    gpus.sort_by(|a, b| a.index.cmp(&b.index).then_with(|| a.uuid.cmp(&b.uuid)));
    let node = gpus.iter().map(|g| g.health).max().unwrap_or_default();
    let node_reasons = gpus
        .iter()
        .flat_map(|g| g.reasons.iter().cloned())
        .collect();
    GpuReport {
        monitoring: true,
        gpus,
        node,
        node_reasons,
    }
}

/// Identity is the UUID (indices may be renumbered by a driver reload); a GPU without one is
/// known by its index.
fn same(s: &GpuStatus, index: u32, uuid: &str) -> bool {
    if uuid.is_empty() || s.uuid.is_empty() {
        s.index == index
    } else {
        s.uuid == uuid
    }
}

/// Every sampled GPU with its history, then the GPUs the sample no longer shows (missing only
/// after `MISSING_ROUNDS` samples in a row).
fn merge_samples(prev: &GpuReport, samples: &[GpuSample]) -> Vec<GpuStatus> {
    let mut gpus: Vec<GpuStatus> = Vec::with_capacity(samples.len().max(prev.gpus.len()));
    for s in samples {
        let mut g = prev
            .gpus
            .iter()
            .find(|p| same(p, s.index, &s.uuid))
            .cloned()
            .unwrap_or_default();
        g.index = s.index;
        g.uuid = s.uuid.clone();
        g.sample = s.clone();
        g.missing = false;
        g.missing_rounds = 0;
        gpus.push(g);
    }
    for p in &prev.gpus {
        if !samples.iter().any(|s| same(p, s.index, &s.uuid)) {
            let mut g = p.clone();
            g.missing_rounds = g.missing_rounds.saturating_add(1);
            g.missing = g.missing_rounds >= MISSING_ROUNDS;
            gpus.push(g);
        }
    }
    gpus
}

/// Count each XID on its GPU, stamped `now_ms`.
fn fold_xids(gpus: &mut Vec<GpuStatus>, xids: &[XidEvent], now_ms: i64) {
    for x in xids {
        let pos = match gpus.iter().position(|g| same(g, x.index, &x.uuid)) {
            Some(pos) => pos,
            None => {
                // NB: an XID from a GPU no sample has shown yet (it could not be read): keep it
                // under its own entry rather than drop hardware evidence. Not "missing": it was
                // never seen by a sample.
                gpus.push(GpuStatus {
                    index: x.index,
                    uuid: x.uuid.clone(),
                    sample: GpuSample {
                        index: x.index,
                        uuid: x.uuid.clone(),
                        ..GpuSample::default()
                    },
                    ..GpuStatus::default()
                });
                gpus.len() - 1
            }
        };
        let g = &mut gpus[pos];
        *g.xid_counts.entry(x.xid).or_insert(0) += 1;
        g.recent_xids.push((x.xid, now_ms));
    }
}

/// The health of one GPU from its record, with one reason per cause.
fn judge(g: &GpuStatus, cfg: &GpuConfig) -> (GpuHealth, Vec<String>) {
    let who = label(g.index, &g.uuid);
    let mut health = GpuHealth::Healthy;
    let mut reasons = Vec::new();
    let mut flag = |h: GpuHealth, why: String| {
        health = health.max(h);
        reasons.push(why);
    };

    // NB: sticky for the process lifetime, because `xid_counts` is never trimmed. A hardware XID
    // (79 "fallen off the bus", 48/94/95 uncontained ECC, 64 row-remap failure, ...) leaves the
    // GPU unusable until it is reset; the driver may keep answering for it and the next samples
    // can look normal, so "it looks fine again" must not clear the verdict. A node restart (and
    // with it this process) or a GPU reset is what clears it.
    for (&xid, &n) in &g.xid_counts {
        if cfg.hardware_xids.contains(&xid) {
            flag(
                GpuHealth::Failed,
                format!("{who}: hardware XID {xid} seen {n} time(s); the GPU needs a reset"),
            );
        }
    }
    if g.missing {
        flag(
            GpuHealth::Failed,
            format!("{who} no longer visible to NVML (fell off the bus?)"),
        );
    }
    // Unknown XIDs degrade only while recent: one odd XID a day ago is not a standing verdict.
    let mut unknown: BTreeMap<u64, usize> = BTreeMap::new();
    for &(xid, _) in &g.recent_xids {
        if !cfg.hardware_xids.contains(&xid) && !cfg.application_xids.contains(&xid) {
            *unknown.entry(xid).or_insert(0) += 1;
        }
    }
    for (xid, n) in unknown {
        flag(
            GpuHealth::Degraded,
            format!("{who}: XID {xid} seen {n} time(s) recently (not a known application error)"),
        );
    }
    // The last sample of a missing GPU is stale: judge only what is being read now.
    if !g.missing {
        let s = &g.sample;
        if s.retired_pages_pending == Some(true) {
            flag(
                GpuHealth::Degraded,
                format!("{who}: memory pages are pending retirement; a GPU reset completes it"),
            );
        }
        if let Some(r) = s.remapped_rows {
            if r.failure {
                flag(
                    GpuHealth::Degraded,
                    format!("{who}: row remapping failed (no spare rows left)"),
                );
            }
            if r.pending {
                flag(
                    GpuHealth::Degraded,
                    format!("{who}: a row remap is pending; a GPU reset applies it"),
                );
            }
        }
        if let Some(n) = s.ecc_volatile_uncorrected.filter(|&n| n > 0) {
            flag(
                GpuHealth::Degraded,
                format!("{who}: {n} uncorrectable ECC error(s) since the driver loaded"),
            );
        }
    }
    (health, reasons)
}

/// Evidence for a hang alert: `cfg.evidence_xids` seen within `cfg.evidence_window` on the given
/// GPUs (indices or UUIDs; `None` or `all` = every GPU), oldest first, e.g.
/// `XID 43 on GPU 0 (GPU-…) 2m ago`.
pub fn evidence(
    report: &GpuReport,
    gpus: Option<&[String]>,
    now_ms: i64,
    cfg: &GpuConfig,
) -> Vec<String> {
    let all = all_gpus(gpus);
    let window = ms(cfg.evidence_window);
    let mut lines = Vec::new();
    for g in &report.gpus {
        if !all && !gpus.unwrap_or_default().iter().any(|id| selects(g, id)) {
            continue;
        }
        for &(xid, at) in &g.recent_xids {
            let age: Millis = now_ms - at;
            if cfg.evidence_xids.contains(&xid) && (0..=window).contains(&age) {
                lines.push(format!(
                    "XID {xid} on {} {} ago",
                    label(g.index, &g.uuid),
                    human(age)
                ));
            }
        }
    }
    lines
}

/// Whether a worker on these GPUs (indices or UUIDs; `None` or `all` = any GPU of the node) sits on
/// a failed GPU: a restart cannot fix hardware.
pub fn worker_on_failed_gpu(report: &GpuReport, gpus: Option<&[String]>) -> bool {
    let failed = |g: &&GpuStatus| g.health == GpuHealth::Failed;
    if all_gpus(gpus) {
        return report.gpus.iter().any(|g| failed(&g));
    }
    let ids = gpus.unwrap_or_default();
    report
        .gpus
        .iter()
        .filter(failed)
        .any(|g| ids.iter().any(|id| selects(g, id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gpu::RemappedRows;
    use std::time::Duration;

    const T0: i64 = 1_000_000;

    fn cfg() -> GpuConfig {
        GpuConfig {
            evidence_window: Duration::from_secs(600),
            ..GpuConfig::default()
        }
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
        XidEvent {
            index,
            uuid: format!("GPU-{index}"),
            xid,
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn xid_rules() {
        // (xids on GPU 0, expected GPU 0 health, expected reason fragment)
        let table: &[(&[u64], GpuHealth, Option<&str>)] = &[
            (&[], GpuHealth::Healthy, None),
            (&[79], GpuHealth::Failed, Some("hardware XID 79")),
            (&[48], GpuHealth::Failed, Some("hardware XID 48")),
            (&[13], GpuHealth::Healthy, None),
            (&[43], GpuHealth::Healthy, None),
            (&[13, 31, 43, 45, 68, 109], GpuHealth::Healthy, None),
            (
                &[999],
                GpuHealth::Degraded,
                Some("XID 999 seen 1 time(s) recently"),
            ),
            (&[13, 999, 79], GpuHealth::Failed, Some("hardware XID 79")),
        ];
        let cfg = cfg();
        for (xids, want, why) in table {
            let events: Vec<_> = xids.iter().map(|&x| xid(0, x)).collect();
            let r = update(
                &GpuReport::default(),
                &[sample(0), sample(1)],
                &events,
                T0,
                &cfg,
            );
            let g = &r.gpus[0];
            assert_eq!(g.health, *want, "xids {xids:?}");
            assert_eq!(r.node, *want, "node, xids {xids:?}");
            assert_eq!(
                r.gpus[1].health,
                GpuHealth::Healthy,
                "other GPU, xids {xids:?}"
            );
            match why {
                Some(why) => assert!(
                    g.reasons.iter().any(|r| r.contains(why)),
                    "{xids:?}: {:?}",
                    g.reasons
                ),
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
        assert!(
            r.gpus[0].recent_xids.is_empty(),
            "trimmed from the recent list"
        );
        assert_eq!(r.gpus[0].xid_counts.get(&79), Some(&1), "but still counted");
    }

    #[test]
    fn unknown_xid_degrades_only_within_the_window() {
        let cfg = cfg();
        let w = ms(cfg.evidence_window);
        let r0 = update(
            &GpuReport::default(),
            &[sample(0)],
            &[xid(0, 999)],
            T0,
            &cfg,
        );
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
    fn sample_rules() {
        type Edit = fn(&mut GpuSample);
        let table: &[(&str, Edit, GpuHealth, Option<&str>)] = &[
            ("clean", |_| {}, GpuHealth::Healthy, None),
            (
                "ecc unknown",
                |s| s.ecc_volatile_uncorrected = None,
                GpuHealth::Healthy,
                None,
            ),
            (
                "ecc 0",
                |s| s.ecc_volatile_uncorrected = Some(0),
                GpuHealth::Healthy,
                None,
            ),
            (
                "ecc 1",
                |s| s.ecc_volatile_uncorrected = Some(1),
                GpuHealth::Degraded,
                Some("1 uncorrectable ECC"),
            ),
            (
                "aggregate only",
                |s| s.ecc_aggregate_uncorrected = Some(7),
                GpuHealth::Healthy,
                None,
            ),
            (
                "corrected only",
                |s| s.ecc_volatile_corrected = Some(1000),
                GpuHealth::Healthy,
                None,
            ),
            (
                "pending retire",
                |s| s.retired_pages_pending = Some(true),
                GpuHealth::Degraded,
                Some("pending retirement"),
            ),
            (
                "pending unknown",
                |s| s.retired_pages_pending = None,
                GpuHealth::Healthy,
                None,
            ),
            (
                "retired, not pending",
                |s| s.retired_pages = Some(5),
                GpuHealth::Healthy,
                None,
            ),
            (
                "remap failure",
                |s| {
                    s.remapped_rows = Some(RemappedRows {
                        failure: true,
                        ..Default::default()
                    })
                },
                GpuHealth::Degraded,
                Some("row remapping failed"),
            ),
            (
                "remap pending",
                |s| {
                    s.remapped_rows = Some(RemappedRows {
                        pending: true,
                        ..Default::default()
                    })
                },
                GpuHealth::Degraded,
                Some("row remap is pending"),
            ),
            (
                "remapped rows, no failure",
                |s| {
                    s.remapped_rows = Some(RemappedRows {
                        correctable: 3,
                        uncorrectable: 1,
                        ..Default::default()
                    })
                },
                GpuHealth::Healthy,
                None,
            ),
            (
                "no remap counters",
                |s| s.remapped_rows = None,
                GpuHealth::Healthy,
                None,
            ),
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
            let r = update(
                &GpuReport::default(),
                &[sample(0), s.clone()],
                &[],
                T0,
                &cfg,
            );
            let g = r.gpu("1").expect("gpu 1");
            assert_eq!(g.health, *want, "{name}");
            assert_eq!(r.node, *want, "{name}: node");
            assert_eq!(g.sample, s, "{name}: last sample kept");
            match why {
                Some(why) => {
                    assert!(
                        g.reasons.iter().any(|r| r.contains(why)),
                        "{name}: {:?}",
                        g.reasons
                    );
                    assert!(
                        g.reasons[0].starts_with("GPU 1 (GPU-1): "),
                        "{name}: {:?}",
                        g.reasons
                    );
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
        let r = update(
            &GpuReport::default(),
            &[sample(0), s1.clone()],
            &[],
            T0,
            &cfg,
        );
        // One or two failed reads are not a lost GPU.
        let r = update(&r, &[sample(0)], &[], T0 + 1, &cfg);
        assert!(r
            .gpu("GPU-1")
            .is_some_and(|g| !g.missing && g.health == GpuHealth::Healthy));
        let r = update(&r, &[sample(0)], &[], T0 + 1, &cfg);
        assert!(r.gpu("GPU-1").is_some_and(|g| !g.missing));
        let r = update(&r, &[sample(0)], &[], T0 + 1, &cfg);
        assert_eq!(r.gpus.len(), 2);
        let g = r.gpu("GPU-1").expect("still listed");
        assert!(g.missing);
        assert_eq!(g.health, GpuHealth::Failed);
        assert_eq!(
            g.reasons,
            vec!["GPU 1 (GPU-1) no longer visible to NVML (fell off the bus?)".to_string()]
        );
        assert_eq!(g.sample, s1);
        assert_eq!(r.node, GpuHealth::Failed);
        assert_eq!(r.gpu("0").map(|g| g.health), Some(GpuHealth::Healthy));
        // Still missing on the next round; back when NVML lists it again (an XID is what sticks).
        let r = update(&r, &[sample(0)], &[], T0 + 2, &cfg);
        assert!(r.gpu("1").is_some_and(|g| g.missing));
        let r = update(&r, &[sample(0), sample(1)], &[], T0 + 3, &cfg);
        assert!(r
            .gpu("1")
            .is_some_and(|g| !g.missing && g.health == GpuHealth::Healthy));
    }

    #[test]
    fn never_seen_gpus_are_not_missing() {
        let r = update(&GpuReport::default(), &[], &[], T0, &cfg());
        assert!(r.monitoring);
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
        let r = update(
            &GpuReport::default(),
            &[sample(0)],
            &[xid(5, 79)],
            T0,
            &cfg(),
        );
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
        assert_eq!(
            g.recent_xids.last(),
            Some(&(13, T0 + 5)),
            "the newest are kept"
        );
        assert_eq!(g.health, GpuHealth::Healthy);
    }

    #[test]
    fn node_is_the_worst_gpu() {
        let cfg = cfg();
        let mut d = sample(1);
        d.ecc_volatile_uncorrected = Some(2);
        let r = update(
            &GpuReport::default(),
            &[sample(0), d.clone(), sample(2)],
            &[],
            T0,
            &cfg,
        );
        assert_eq!(r.node, GpuHealth::Degraded);
        let r = update(&r, &[sample(0), d, sample(2)], &[xid(2, 94)], T0 + 1, &cfg);
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
            (
                Some(ids(&["0"])),
                T0,
                vec!["XID 43 on GPU 0 (GPU-0) 0s ago".to_string()],
            ),
            (
                Some(ids(&["0"])),
                T0 + w,
                vec![format!("XID 43 on GPU 0 (GPU-0) {} ago", human(w))],
            ),
            (Some(ids(&["0"])), T0 + w + 1, vec![]),
            (Some(ids(&["0"])), T0 - 1, vec![]),
        ];
        for (sel, now, want) in table {
            assert_eq!(
                evidence(&r, sel.as_deref(), now, &cfg),
                want,
                "{sel:?} at {now}"
            );
        }
    }

    #[test]
    fn failed_gpu_under_a_worker() {
        let cfg = cfg();
        let r = update(
            &GpuReport::default(),
            &[sample(0), sample(1)],
            &[xid(1, 79)],
            T0,
            &cfg,
        );
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
        assert!(
            !worker_on_failed_gpu(&degraded, None),
            "degraded is not failed"
        );
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
        assert!(worker_on_failed_gpu(
            &unknown,
            Some(&["nvidia3".to_string()])
        ));
        assert!(!worker_on_failed_gpu(
            &unknown,
            Some(&["nvidia0".to_string()])
        ));
    }
}
