//! Failed GPUs kept across agent restarts (the pure part): what `gpu.state_file` holds, how a
//! report becomes one ([`snapshot`]), when it is worth writing ([`needs_write`]), and what a file
//! read at start-up means for this boot ([`restore`]). The file itself is read and written by
//! `crate::accel::gpu::state`. It also keeps what the node's last GPU Event said
//! (`crate::accel::gpu::model::Told`).
//!
//! The file is keyed by the node's boot id: a failure recorded under another boot id was cleared
//! by the reboot. A file that cannot be parsed is not read as "nothing failed": the GPU UUIDs it
//! names are kept failed when it names this boot, so a torn write cannot quietly return a broken
//! GPU to work.

use std::io::ErrorKind;

use serde::{Deserialize, Serialize};
use strum::VariantArray;

use crate::accel::gpu::model::{label, Failure, GpuCleared, GpuHealth, GpuStatus, ResetMarks};
use crate::config::XidAction;

/// The format version written; a file of another version is read as unreadable.
pub(crate) const VERSION: u32 = 1;

/// How often, at most, the file is rewritten only because a GPU's energy counter moved.
pub(crate) const ENERGY_REWRITE_MS: i64 = 5 * 60 * 1000;

/// The content of `gpu.state_file`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StateFile {
    pub(crate) version: u32,
    /// `/proc/sys/kernel/random/boot_id` when written.
    pub(crate) boot_id: String,
    /// Every GPU with a standing failure.
    pub(crate) gpus: Vec<KeptGpu>,
    /// The GPU health the node's last Event said (`healthy`, `degraded`, `failed`). Absent
    /// from a file written before it was kept: its failed GPUs were announced ([`announced_in`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) announced: Option<String>,
}

/// One failed GPU as kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct KeptGpu {
    pub(crate) uuid: String,
    pub(crate) index: u32,
    pub(crate) action: XidAction,
    pub(crate) causes: Vec<String>,
    #[serde(default)]
    pub(crate) lost: bool,
    #[serde(default)]
    pub(crate) marks: ResetMarks,
}

/// What the agent starts with: the GPUs still failed, the failures the reboot cleared, what
/// the node's last GPU Event said (`None`: not known), and a warning for the log when the file
/// was not what it should be.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    pub(crate) gpus: Vec<GpuStatus>,
    pub(crate) cleared: Vec<GpuCleared>,
    pub(crate) announced: Option<GpuHealth>,
    pub(crate) warning: Option<String>,
}

/// The file's content for `gpus` (only GPUs with a UUID and a standing failure) and what the
/// node's last GPU Event said.
pub(crate) fn snapshot(
    gpus: &[GpuStatus],
    announced: Option<GpuHealth>,
    boot_id: &str,
) -> StateFile {
    let kept = gpus.iter().filter(|g| !g.uuid.is_empty()).filter_map(|g| {
        let Failure { action, causes, lost, marks, .. } = g.failure.clone()?;
        Some(KeptGpu { uuid: g.uuid.clone(), index: g.index, action, causes, lost, marks })
    });
    let announced = announced.map(|h| h.as_str().to_string());
    StateFile { version: VERSION, boot_id: boot_id.to_string(), gpus: kept.collect(), announced }
}

/// Whether `next` should be written at `now_ms`, given what was last written and when (`None`:
/// nothing yet).
///
/// NB: a change of failures (or of a mark other than energy) is written at once. The energy
/// counter moves every sample; a stale value on file only makes a later restart miss a reset
/// (the saved value is lower than the real one), never see one that did not happen, so it is
/// rewritten at most every [`ENERGY_REWRITE_MS`].
pub(crate) fn needs_write(last: Option<&(StateFile, i64)>, next: &StateFile, now_ms: i64) -> bool {
    let without_energy = |f: &StateFile| {
        let mut f = f.clone();
        f.gpus.iter_mut().for_each(|g| g.marks.energy_mj = None);
        f
    };
    last.is_none_or(|(last, last_at_ms)| {
        without_energy(last) != without_energy(next)
            || (last != next && now_ms - last_at_ms >= ENERGY_REWRITE_MS)
    })
}

/// What the file read at start-up means on the boot `boot_id`: `read` is its text, or why it
/// could not be read (no file: the first start, a clean one; any other error, permissions or
/// I/O, a warning).
pub(crate) fn restore(read: std::io::Result<String>, boot_id: &str, path: &str) -> Restored {
    let text = match read {
        Ok(text) => text,
        // The first start: no Event said anything yet.
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Restored { announced: announced_in(None, false), ..Restored::default() }
        }
        Err(e) => {
            let warning = format!(
                "the GPU state file {path} cannot be read ({e}): failures from before this start are not known; fix its permissions"
            );
            return Restored { warning: Some(warning), ..Restored::default() };
        }
    };
    match serde_json::from_str::<StateFile>(&text) {
        Ok(f) if f.version == VERSION => from_file(f, boot_id),
        Ok(f) => salvage(&text, boot_id, path, &format!("version {}", f.version)),
        Err(e) => salvage(&text, boot_id, path, &e.to_string()),
    }
}

fn from_file(f: StateFile, boot_id: &str) -> Restored {
    let rebooted = f.boot_id != boot_id;
    let mut out = Restored::default();
    // NB: a reboot starts the node's story again: what its Events said before is not kept.
    let said = f.announced.filter(|_| !rebooted);
    for KeptGpu { uuid, index, action, mut causes, lost, marks } in f.gpus {
        if rebooted {
            causes.extend(lost.then(|| "no longer visible to NVML".to_string()));
            let seq = out.cleared.last().map_or(1, |c| c.seq + 1);
            let why = "the node rebooted (its boot id changed)".to_string();
            out.cleared.push(GpuCleared { seq, gpu: label(index, &uuid), why, causes });
            continue;
        }
        let failure = Failure { action, causes, lost, kept: true, marks_from_file: true, marks };
        out.gpus.push(GpuStatus { failure: Some(failure), ..GpuStatus::known(index, uuid) });
    }
    out.announced = announced_in(said.as_deref(), !out.gpus.is_empty());
    out
}

/// What the node's last GPU Event said, as the file has it (`None` for a value this build does
/// not know); from a file that does not say (written before it was kept, or corrupt),
/// `failed` when GPUs failed on this boot are kept — their Event went out, as was assumed
/// before it was kept — and `healthy` when none is.
fn announced_in(said: Option<&str>, kept_failed: bool) -> Option<GpuHealth> {
    match said {
        Some(s) => GpuHealth::VARIANTS.iter().copied().find(|h| h.as_str() == s),
        None if kept_failed => Some(GpuHealth::Failed),
        None => Some(GpuHealth::Healthy),
    }
}

/// A file that does not parse: the GPUs it names stay failed when it names this boot.
fn salvage(text: &str, boot_id: &str, path: &str, error: &str) -> Restored {
    let mut out = Restored { announced: announced_in(None, false), ..Restored::default() };
    if boot_id.is_empty() || !text.contains(boot_id) {
        out.warning = Some(format!(
            "the GPU state file {path} is corrupt ({error}) and does not name this boot: ignored, as a reboot would have cleared it"
        ));
        return out;
    }
    let uuids = uuids_in(text);
    let causes = vec![format!("listed as failed in the unreadable state file {path}")];
    let failure = Failure { action: XidAction::ResetGpu, causes, kept: true, ..Failure::default() };
    // NB: no index (none that a worker's could match): the file's are unreadable, and a
    // guessed one would hold a healthy GPU's worker back while NVML is not read yet and let the
    // failed GPU's go. By its UUID only until the first sample places it.
    for uuid in &uuids {
        let known = GpuStatus::known(u32::MAX, uuid.clone());
        out.gpus.push(GpuStatus { failure: Some(failure.clone()), ..known });
    }
    out.announced = announced_in(None, !out.gpus.is_empty());
    let (count, listed) = (uuids.len(), uuids.join(", "));
    out.warning = Some(format!(
        "the GPU state file {path} is corrupt ({error}); the {count} GPU(s) it names stay failed until a reset shows: {listed}"
    ));
    out
}

/// Every distinct `GPU-<hex and dashes>` in `text`, in order.
fn uuids_in(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, _) in text.match_indices("GPU-") {
        let tail = text[i + 4..].chars();
        let body: String = tail.take_while(|c| c.is_ascii_hexdigit() || *c == '-').collect();
        let uuid = format!("GPU-{body}");
        if body.len() >= 8 && !out.contains(&uuid) {
            out.push(uuid);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT: &str = "0b5c1e7e-8a5d-4c53-9b53-5d2f0d9d0c11";
    const UUID: &str = "GPU-00000000-1111-2222-3333-444444444444";

    fn failed(uuid: &str, lost: bool) -> GpuStatus {
        GpuStatus {
            index: 3,
            uuid: uuid.into(),
            failure: Some(Failure {
                action: XidAction::ResetGpu,
                causes: vec!["XID 95 (uncontained ECC error)".into()],
                lost,
                kept: false,
                marks_from_file: false,
                marks: ResetMarks {
                    ecc_volatile_uncorrected: Some(2),
                    energy_mj: Some(1000),
                    ..ResetMarks::default()
                },
            }),
            ..GpuStatus::default()
        }
    }

    fn text_of(gpus: &[GpuStatus], boot: &str) -> String {
        serde_json::to_string(&snapshot(gpus, None, boot)).unwrap()
    }

    #[test]
    fn a_failure_written_on_this_boot_is_kept() {
        let text = text_of(&[failed(UUID, false), GpuStatus::default()], BOOT);
        let r = restore(Ok(text), BOOT, "/s.json");
        assert!(r.warning.is_none() && r.cleared.is_empty());
        assert_eq!(r.gpus.len(), 1, "only GPUs with a failure (and a UUID) are kept");
        let f = r.gpus[0].failure.as_ref().unwrap();
        assert!(f.kept);
        assert_eq!(f.action, XidAction::ResetGpu);
        assert_eq!(f.marks.ecc_volatile_uncorrected, Some(2));
        assert_eq!((r.gpus[0].index, r.gpus[0].uuid.as_str()), (3, UUID));
    }

    #[test]
    fn a_reboot_clears_every_kept_failure_and_says_so() {
        let text = text_of(&[failed(UUID, true)], BOOT);
        let r = restore(Ok(text), "another-boot", "/s.json");
        assert!(r.gpus.is_empty());
        assert_eq!(r.cleared.len(), 1);
        assert!(r.cleared[0].why.contains("rebooted"), "{:?}", r.cleared);
        assert_eq!(r.cleared[0].gpu, format!("GPU 3 ({UUID})"));
        assert_eq!(r.cleared[0].causes.len(), 2, "the XID and the loss");
    }

    #[test]
    fn no_file_is_a_clean_start_and_an_unreadable_one_a_warning() {
        let r = restore(Err(ErrorKind::NotFound.into()), BOOT, "/s.json");
        assert!(r.gpus.is_empty() && r.warning.is_none());
        let r = restore(Err(ErrorKind::PermissionDenied.into()), BOOT, "/s.json");
        assert!(r.gpus.is_empty());
        assert!(r.warning.unwrap().contains("permission denied"));
    }

    #[test]
    fn a_corrupt_file_of_this_boot_keeps_the_gpus_it_names_failed() {
        let whole = text_of(&[failed(UUID, false)], BOOT);
        let torn = &whole[..whole.len() - 20];
        let r = restore(Ok(torn.into()), BOOT, "/s.json");
        assert_eq!(r.gpus.len(), 1, "{:?}", r.warning);
        assert_eq!(r.gpus[0].uuid, UUID);
        assert_eq!(r.gpus[0].failure.as_ref().map(|f| f.action), Some(XidAction::ResetGpu));
        let w = r.warning.unwrap();
        assert!(w.contains("corrupt") && w.contains(UUID), "{w}");
        // Of another boot: a reboot cleared it anyway.
        let r = restore(Ok(torn.into()), "another-boot", "/s.json");
        assert!(r.gpus.is_empty());
        assert!(r.warning.unwrap().contains("does not name this boot"));
        // Not JSON at all, no UUID: nothing kept, a warning.
        let r = restore(Ok(format!("\u{0}\u{0}{BOOT}")), BOOT, "/s.json");
        assert!(r.gpus.is_empty());
        assert!(r.warning.is_some());
        // Another version.
        let v2 = whole.replace("\"version\":1", "\"version\":2");
        let r = restore(Ok(v2), BOOT, "/s.json");
        assert_eq!(r.gpus.len(), 1);
        assert!(r.warning.unwrap().contains("version 2"));
    }

    #[test]
    fn writes_follow_failures_at_once_and_energy_only_now_and_then() {
        let a = snapshot(&[failed(UUID, false)], Some(GpuHealth::Healthy), BOOT);
        assert!(needs_write(None, &a, 0));
        let last = (a.clone(), 0);
        assert!(!needs_write(Some(&last), &a, 10 * ENERGY_REWRITE_MS));
        let mut energy = a.clone();
        energy.gpus[0].marks.energy_mj = Some(5000);
        assert!(!needs_write(Some(&last), &energy, ENERGY_REWRITE_MS - 1));
        assert!(needs_write(Some(&last), &energy, ENERGY_REWRITE_MS));
        let mut ecc = a.clone();
        ecc.gpus[0].marks.ecc_volatile_uncorrected = Some(3);
        assert!(needs_write(Some(&last), &ecc, 1));
        let cleared = snapshot(&[], Some(GpuHealth::Healthy), BOOT);
        assert!(needs_write(Some(&last), &cleared, 1));
        // The failure's Event went out.
        let said = snapshot(&[failed(UUID, false)], Some(GpuHealth::Failed), BOOT);
        assert!(needs_write(Some(&last), &said, 1));
    }

    /// What the node's last GPU Event said is kept on this boot: a failure written before its
    /// Event went out reads back as not announced. A file written before it was kept reads as
    /// its failures announced; a reboot, or no file, as nothing said yet.
    #[test]
    fn what_the_last_event_said_is_kept_on_this_boot() {
        let one = [failed(UUID, false)];
        let read = |f: &StateFile, boot: &str| {
            restore(Ok(serde_json::to_string(f).unwrap()), boot, "/s.json").announced
        };
        let unsaid = snapshot(&one, Some(GpuHealth::Healthy), BOOT);
        assert!(serde_json::to_string(&unsaid).unwrap().contains("\"announced\":\"healthy\""));
        assert_eq!(read(&unsaid, BOOT), Some(GpuHealth::Healthy));
        let said = snapshot(&one, Some(GpuHealth::Failed), BOOT);
        assert_eq!(read(&said, BOOT), Some(GpuHealth::Failed));
        assert_eq!(read(&said, "another-boot"), Some(GpuHealth::Healthy), "a reboot forgets");
        // Written before it was kept: as was assumed then, its failures were announced.
        assert_eq!(read(&snapshot(&one, None, BOOT), BOOT), Some(GpuHealth::Failed));
        assert_eq!(read(&snapshot(&[], None, BOOT), BOOT), Some(GpuHealth::Healthy));
        let r = restore(Err(ErrorKind::NotFound.into()), BOOT, "/s.json");
        assert_eq!(r.announced, Some(GpuHealth::Healthy), "the first start");
        let r = restore(Err(ErrorKind::PermissionDenied.into()), BOOT, "/s.json");
        assert_eq!(r.announced, None, "not known");
    }

    #[test]
    fn uuids_are_found_in_any_text() {
        assert_eq!(
            uuids_in(&format!("x{UUID}\"GPU-12\" GPU-abcdef01 {UUID}")),
            vec![UUID.to_string(), "GPU-abcdef01".to_string()]
        );
    }
}
