//! GPU health verdicts (pure): `(previous report, samples, XID events, now) -> report`.
//!
//! Map: [`update`] folds one round of observations from a GPU probe (`crate::accel::gpu::nvml`)
//! into a [`GpuReport`] (per-GPU [`GpuStatus`] and the node verdict); [`evidence`] turns recent
//! XIDs into lines for a hang alert; [`worker_on_failed_gpu`] tells the restart policy that a
//! restart cannot help. Failures kept across agent restarts are read and written by
//! `crate::accel::gpu::policy_state`. No I/O and no clock reads: `now_ms` is handed in, on the monotonic
//! millisecond clock of the GPU monitor (`crate::accel::clock_ms`).
//!
//! The rules, worst first:
//! - an XID whose action (`crate::accel::gpu::policy_xid`) is `reset-gpu`, `drain` or `reboot-node`, or the
//!   driver's own recovery action asking for one → `failed`, and it stays failed (a [`Failure`])
//!   until the GPU shows it was reset: see [`reset_evidence`];
//! - a GPU seen before and absent from the latest samples → `failed`, `missing`, until NVML lists
//!   it again;
//! - a row-remap failure → `failed` (NVIDIA: reset the GPU; recurring, replace it);
//! - an XID in no table, during an episode that reached `gpu.xid_threshold` → `degraded`
//!   (`crate::accel::gpu::policy_episode`);
//! - pages pending retirement, a pending row remap, or volatile uncorrectable ECC errors →
//!   `degraded`: survivable until the next reset;
//! - `restart-app` and `informational` XIDs are recorded (counts, recent list), never a verdict:
//!   the worker's restart is the fix.
//!
//! The node is as healthy as its worst GPU.

use crate::accel::gpu::model::{
    chosen, label, Failure, GpuCleared, GpuHealth, GpuMonitorState, GpuReport, GpuSample,
    GpuStatus, RecoveryAction, ResetMarks, XidEvent, MAX_BEGUN, MAX_CLEARED, MAX_RECENT_XIDS,
    MISSING_ROUNDS,
};
use crate::accel::gpu::policy_episode;
use crate::accel::gpu::policy_slow;
use crate::accel::gpu::policy_xid::{action_for, builtin, recovery_action, XidOverrides};
use crate::clock::{human, ms};
use crate::config::{GpuConfig, XidAction};

/// The failures `report` says were cleared after the one numbered `seen`, oldest first (each is
/// a trail entry); `seen` moves to the newest.
///
/// NB: sequence numbers restart with the monitor, and a report keeps the last few, so a reader
/// that misses reports (a `watch` keeps only the latest) still sees every clearing.
pub(crate) fn new_cleared(report: &GpuReport, seen: &mut u64) -> Vec<GpuCleared> {
    let new = report.cleared.iter().filter(|c| c.seq > *seen).cloned().collect();
    *seen = report.cleared.last().map_or(*seen, |last| (*seen).max(last.seq));
    new
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
    fold(prev, Some(samples), xids, now_ms, cfg)
}

/// Fold XID events that arrived between samples into the report: as [`update`] with no new
/// reading, so no GPU is counted absent and no failure is held against the sample again.
///
/// NB: XID batches come up to once a second. Were each to count the GPUs absent from the last
/// sample, one failed read of one GPU during an XID storm on another would make it `missing`
/// (failed, the Node tainted) within seconds; a missed read is counted once, by its sample.
pub(crate) fn update_xids(
    prev: &GpuReport,
    xids: &[XidEvent],
    now_ms: i64,
    cfg: &GpuConfig,
) -> GpuReport {
    fold(prev, None, xids, now_ms, cfg)
}

/// [`update`], or [`update_xids`] when `samples` is `None`.
fn fold(
    prev: &GpuReport,
    samples: Option<&[GpuSample]>,
    xids: &[XidEvent],
    now_ms: i64,
    cfg: &GpuConfig,
) -> GpuReport {
    let overrides = cfg.xid_overrides();
    // The report carried forward (the clearings, the episodes' numbering, the latest begun), its
    // GPUs merged with the samples; every other field is set again by `judged`.
    let mut r = prev.clone();
    if let Some(samples) = samples {
        merge_samples(&mut r, samples);
    }
    for g in r.gpus.iter_mut().filter(|g| !g.missing) {
        let before = prev.gpus.iter().find(|p| same(p, g.index, &g.uuid));
        policy_slow::follow_rises(g, before.map(|p| &p.sample), now_ms);
    }
    // Each XID counted on its GPU, stamped `now_ms`, in its episode; one whose action fails the
    // GPU starts (or adds to) its failure.
    let th = &cfg.xid_threshold;
    for x in xids {
        let pos = r.gpus.iter().position(|g| same(g, x.index, &x.uuid)).unwrap_or_else(|| {
            // NB: an XID from a GPU no sample has shown yet (it could not be read): keep it
            // under its own entry rather than drop hardware evidence. Not "missing": it was
            // never seen by a sample.
            r.gpus.push(GpuStatus::known(x.index, x.uuid.clone()));
            r.gpus.len() - 1
        });
        let g = &mut r.gpus[pos];
        *g.xid_counts.entry(x.xid).or_insert(0) += 1;
        g.recent_xids.push((x.xid, now_ms));
        if let Some(e) = policy_episode::add(g, x.xid, now_ms, th, &mut r.episode_seq) {
            r.begun.push(policy_episode::begun(g, &e, &overrides));
        }
        if let Some(action) = action_for(x.xid, &overrides).filter(|a| a.fails()) {
            let meaning = builtin(x.xid).map_or(String::new(), |r| format!(" ({})", r.meaning));
            add_cause(g, action, format!("XID {}{meaning}", x.xid));
        }
    }
    let window = ms(cfg.evidence_window);
    for g in &mut r.gpus {
        policy_episode::expire(g, now_ms, th);
        g.recent_xids.retain(|&(_, at)| now_ms - at <= window);
        g.recent_xids.drain(..g.recent_xids.len().saturating_sub(MAX_RECENT_XIDS));
        // Without a new sample there is nothing new to follow; and a failure kept from the state
        // file must keep its marks untrusted until this process has read the GPU.
        if samples.is_some() && !g.missing {
            follow_hardware(g, &mut r.cleared);
        }
    }
    r.gpus.sort_by(|a, b| a.index.cmp(&b.index).then_with(|| a.uuid.cmp(&b.uuid)));
    judged(r, &overrides)
}

/// `prev`'s GPUs judged again as they are (no new observation): the report of GPUs restored
/// from the state file, before the first sample.
pub(crate) fn rejudge(prev: &GpuReport, cfg: &GpuConfig) -> GpuReport {
    judged(prev.clone(), &cfg.xid_overrides())
}

/// `r` with each GPU judged, monitoring: the node's verdict is the worst GPU's.
fn judged(mut r: GpuReport, overrides: &XidOverrides) -> GpuReport {
    for g in &mut r.gpus {
        (g.health, g.reasons) = judge(g, overrides);
    }
    r.node = r.gpus.iter().map(|g| g.health).max().unwrap_or_default();
    r.node_reasons = r.gpus.iter().flat_map(|g| g.reasons.iter().cloned()).collect();
    r.cleared.drain(..r.cleared.len().saturating_sub(MAX_CLEARED));
    r.begun.drain(..r.begun.len().saturating_sub(MAX_BEGUN));
    GpuReport { state: GpuMonitorState::On, hung: None, ..r }
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

/// Clear `g`'s failure, recording why.
pub(crate) fn clear(g: &mut GpuStatus, why: String, cleared: &mut Vec<GpuCleared>) {
    let Some(f) = g.failure.take() else { return };
    let seq = cleared.last().map_or(1, |c| c.seq + 1);
    cleared.push(GpuCleared { seq, gpu: label(g.index, &g.uuid), why, causes: all_causes(&f) });
}

const LOST: &str = "no longer visible to NVML (fell off the bus?)";

/// A failure's causes, its loss among them.
fn all_causes(f: &Failure) -> Vec<String> {
    f.causes.iter().cloned().chain(f.lost.then(|| LOST.to_string())).collect()
}

/// `r`'s GPUs merged with `samples`: every sampled GPU with its history, then the GPUs the sample
/// no longer shows (missing only after `MISSING_ROUNDS` samples in a row). A GPU lost and listed
/// again has its loss cleared.
fn merge_samples(r: &mut GpuReport, samples: &[GpuSample]) {
    let prev = std::mem::take(&mut r.gpus);
    r.gpus.reserve(samples.len().max(prev.len()));
    for s in samples {
        let mut g = prev.iter().find(|p| same(p, s.index, &s.uuid)).cloned().unwrap_or_default();
        (g.index, g.uuid, g.sample) = (s.index, s.uuid.clone(), s.clone());
        (g.missing, g.missing_rounds) = (false, 0);
        if let Some(f) = g.failure.as_mut().filter(|f| f.lost) {
            f.lost = false;
            if f.causes.is_empty() {
                clear(&mut g, "NVML lists the GPU again".into(), &mut r.cleared);
            }
        }
        r.gpus.push(g);
    }
    for p in prev.iter().filter(|p| !samples.iter().any(|s| same(p, s.index, &s.uuid))) {
        let mut g = p.clone();
        g.missing_rounds = g.missing_rounds.saturating_add(1);
        g.missing =
            g.missing_rounds >= MISSING_ROUNDS || g.failure.as_ref().is_some_and(|f| f.lost);
        if g.missing {
            let f = g.failure.get_or_insert_with(Failure::default);
            (f.lost, f.action) = (true, f.action.max(XidAction::RebootNode));
        }
        r.gpus.push(g);
    }
}

/// Start or extend `g`'s failure; a new one takes the marks of the latest sample.
pub(crate) fn add_cause(g: &mut GpuStatus, action: XidAction, cause: String) {
    let marks = marks_of(&g.sample, ResetMarks::default());
    let f = g.failure.get_or_insert_with(|| Failure { marks, ..Failure::default() });
    f.action = f.action.max(action);
    if !f.causes.contains(&cause) {
        f.causes.push(cause);
    }
}

/// The reset-sensitive readings of `s`, keeping `old` where `s` has none.
fn marks_of(s: &GpuSample, old: ResetMarks) -> ResetMarks {
    ResetMarks {
        ecc_volatile_corrected: s.ecc_volatile_corrected.or(old.ecc_volatile_corrected),
        ecc_volatile_uncorrected: s.ecc_volatile_uncorrected.or(old.ecc_volatile_uncorrected),
        energy_mj: s.energy_mj.or(old.energy_mj),
        remap_pending: s.remapped_rows.map(|r| r.pending).or(old.remap_pending),
        retired_pages_pending: s.retired_pages_pending.or(old.retired_pages_pending),
        recovery_action: s.recovery_action.or(old.recovery_action),
    }
}

/// A present GPU's latest sample against its failure: cleared on evidence of a reset, else its
/// marks follow the sample; the driver's recovery action, when it asks for one, is a cause.
fn follow_hardware(g: &mut GpuStatus, cleared: &mut Vec<GpuCleared>) {
    if let Some(f) = &g.failure {
        let trusted = !f.marks_from_file || g.sample.persistence_mode == Some(true);
        if let Some(why) = reset_evidence(&f.marks, &g.sample, trusted) {
            clear(g, why, cleared);
        }
    }
    if let Some(f) = g.failure.as_mut() {
        f.marks = marks_of(&g.sample, f.marks);
        // The marks now come from this process's own readings.
        f.marks_from_file = false;
    }
    if let Some(a) = g.sample.recovery_action.filter(|&a| recovery_action(a).fails()) {
        add_cause(g, recovery_action(a), format!("the driver asks for {}", a.nvml_name()));
    }
}

/// Evidence in `s` that the GPU was reset (or its driver reloaded) since `m` was read, in
/// words; `None` when there is none.
///
/// NB: `counters` says whether a counter that went down may count. Volatile ECC counts and the
/// energy counter restart when the driver loads; without persistence mode the driver unloads
/// whenever its last client exits, so across an agent restart (marks read from the state file)
/// they count only with persistence mode on. Within one agent process the agent is itself a
/// client, so the driver stays loaded and a lower count is a reset.
pub(crate) fn reset_evidence(m: &ResetMarks, s: &GpuSample, counters: bool) -> Option<String> {
    let went_down = |was: Option<u64>, now: Option<u64>| was.zip(now).filter(|(a, b)| b < a);
    if m.remap_pending == Some(true) && s.remapped_rows.map(|r| r.pending) == Some(false) {
        return Some("the pending row remap was applied, which happens at a GPU reset".into());
    }
    if m.retired_pages_pending == Some(true) && s.retired_pages_pending == Some(false) {
        let why = "the pages pending retirement were retired, which happens at a GPU reset";
        return Some(why.into());
    }
    let no_action = s.recovery_action == Some(RecoveryAction::None);
    if let Some(was) = m.recovery_action.filter(|&was| no_action && recovery_action(was).fails()) {
        return Some(format!("the driver no longer asks for {}", was.nvml_name()));
    }
    if !counters {
        return None;
    }
    if let Some((a, b)) = went_down(m.ecc_volatile_uncorrected, s.ecc_volatile_uncorrected)
        .or_else(|| went_down(m.ecc_volatile_corrected, s.ecc_volatile_corrected))
    {
        return Some(format!(
            "the volatile ECC counts went back from {a} to {b}: the driver reloaded or the GPU was reset"
        ));
    }
    if let Some((a, b)) = went_down(m.energy_mj, s.energy_mj) {
        let why = format!("the energy counter restarted (from {a} to {b} mJ): the driver reloaded");
        return Some(why);
    }
    None
}

/// The health of one GPU from its record, with one reason per cause.
fn judge(g: &GpuStatus, overrides: &XidOverrides) -> (GpuHealth, Vec<String>) {
    let who = label(g.index, &g.uuid);
    let mut health = GpuHealth::Healthy;
    let mut reasons = Vec::new();
    let mut flag = |h: GpuHealth, why: &str| {
        health = health.max(h);
        reasons.push(format!("{who}: {why}"));
    };
    if let Some(f) = &g.failure {
        let kept = if f.kept { " (kept from before the agent restarted)" } else { "" };
        let (causes, advice) = (all_causes(f).join(", "), f.action.advice());
        flag(GpuHealth::Failed, &format!("{causes}; {advice}{kept}"));
    }
    // Unknown XIDs degrade only during an episode that reached `gpu.xid_threshold`: one odd
    // XID a day ago is not a standing verdict.
    for e in g.episodes.iter().filter(|e| e.counted && action_for(e.xid, overrides).is_none()) {
        let why =
            format!("XID {} seen {} time(s) recently (not in NVIDIA's table)", e.xid, e.count);
        flag(GpuHealth::Degraded, &why);
    }
    // The last sample of a missing GPU is stale: judge only what is being read now.
    if !g.missing {
        judge_sample(&g.sample, &mut flag);
    }
    (health, reasons)
}

/// The standing conditions NVML reports for a GPU.
fn judge_sample(s: &GpuSample, flag: &mut impl FnMut(GpuHealth, &str)) {
    // No row remapper (pre-Ampere): neither a remap failure nor one pending.
    let remap = s.remapped_rows.unwrap_or_default();
    if remap.failure {
        let why =
            "row remapping failed (no spare rows left); reset the GPU, and replace it if it recurs";
        flag(GpuHealth::Failed, why);
    }
    if remap.pending {
        let why = "a row remap is pending; the GPU runs on until its next reset: reset it at the next convenient time";
        flag(GpuHealth::Degraded, why);
    }
    if s.retired_pages_pending == Some(true) {
        let why = "memory pages are pending retirement; reset the GPU at the next convenient time";
        flag(GpuHealth::Degraded, why);
    }
    if let Some(n) = s.ecc_volatile_uncorrected.filter(|&n| n > 0) {
        let why = format!("{n} uncorrectable ECC error(s) since the driver loaded");
        flag(GpuHealth::Degraded, &why);
    }
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
    let window = ms(cfg.evidence_window);
    chosen(report, gpus)
        .flat_map(|g| g.recent_xids.iter().map(move |&(xid, at)| (g, xid, now_ms - at)))
        .filter(|&(_, xid, age)| cfg.evidence_xids.contains(&xid) && (0..=window).contains(&age))
        .map(|(g, xid, age)| format!("XID {xid} on {} {} ago", label(g.index, &g.uuid), human(age)))
        .collect()
}

/// Whether a worker on these GPUs (indices or UUIDs; `None` or `all` = any GPU of the node) sits on
/// a failed GPU: a restart cannot fix hardware.
pub fn worker_on_failed_gpu(report: &GpuReport, gpus: Option<&[String]>) -> bool {
    chosen(report, gpus).any(|g| g.health == GpuHealth::Failed)
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
