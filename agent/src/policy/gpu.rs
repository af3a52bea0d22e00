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
#[path = "gpu_tests.rs"]
mod tests;
