//! What each XID calls for: NVIDIA's "Resolution Bucket (Immediate Action)" of the Xid catalog
//! for Ampere and newer GPUs, mapped onto Vigil's five [`XidAction`]s, with per-XID overrides from
//! `gpu.xid_actions`. `vigil policy gpu` prints [`table`]; docs/gpu.md carries `markdown` and a
//! test fails when the two drift apart.
//!
//! Sources (cited per row):
//! - `catalog`: the Xid catalog, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
//!   column "Resolution Bucket (Immediate Action)" (RESTART_APP, RESET_GPU, RESTART_BM,
//!   RESTART_VM, IGNORE, WORKFLOW_…). NVIDIA's own NVSentinel carries the same column as
//!   `xiderrorsmapping.csv`.
//! - `memory`: the A100/H100 GPU memory error management pages
//!   (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/): a contained uncorrectable error (94) ends
//!   only the application that touched the memory; an uncontained one (95) needs a GPU reset; a
//!   row remap (63) takes effect at the next reset and unaffected applications run on meanwhile.
//!
//! XIDs outside the table (CONTACT_SUPPORT and the unused ones) are judged by
//! `crate::accel::gpu::policy`: `degraded` while recent.

use std::collections::BTreeMap;

use crate::accel::gpu::model::RecoveryAction;
use crate::config::{GpuConfig, XidAction};

/// The per-XID overrides of the built-in table: `gpu.xid_actions`, its keys parsed
/// (`GpuConfig::xid_overrides`).
pub(crate) type XidOverrides = BTreeMap<u64, XidAction>;

/// One XID: what it means, what NVIDIA says to do at once, what Vigil does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct XidRow {
    pub(crate) xid: u64,
    /// NVIDIA's description, shortened.
    pub(crate) meaning: &'static str,
    /// The catalog's immediate-action bucket, as NVIDIA spells it.
    pub(crate) nvidia: &'static str,
    pub(crate) action: XidAction,
    /// `catalog`, `catalog, memory`, or `config` for an override.
    pub(crate) source: &'static str,
}

/// A row's words (the meaning, NVIDIA's bucket, the source).
type Text = &'static str;

const fn row(xid: u64, meaning: Text, nvidia: Text, action: XidAction, source: Text) -> XidRow {
    XidRow { xid, meaning, nvidia, action, source }
}

use XidAction::{Informational as Info, RebootNode, ResetGpu, RestartApp};

const CAT: &str = "catalog";
const MEM: &str = "catalog, memory";

/// The built-in table, by XID. Copy-engine, video and JPEG engine exceptions (RESTART_APP) are
/// listed one by one so a lookup is a plain search.
#[rustfmt::skip]
pub(crate) const BUILTIN: &[XidRow] = &[
    row(8, "GPU stopped processing (channel idle timeout)", "RESTART_APP", RestartApp, CAT),
    row(11, "invalid or corrupted push buffer stream", "RESTART_APP", RestartApp, CAT),
    row(13, "graphics engine exception", "RESTART_APP", RestartApp, CAT),
    row(14, "fake error (test)", "IGNORE", Info, CAT),
    row(25, "illegal notify (graphics)", "RESTART_APP", RestartApp, CAT),
    row(31, "GPU memory page fault (MMU)", "RESTART_APP", RestartApp, CAT),
    row(32, "invalid or corrupted push buffer stream (PBDMA)", "RESTART_APP", RestartApp, CAT),
    row(37, "unimplemented firmware method (FECS)", "IGNORE", Info, CAT),
    row(38, "firmware watchdog timeout (FECS)", "IGNORE", Info, CAT),
    row(39, "copy engine 0 exception", "RESTART_APP", RestartApp, CAT),
    row(40, "copy engine 1 exception", "RESTART_APP", RestartApp, CAT),
    row(41, "copy engine 2 exception", "RESTART_APP", RestartApp, CAT),
    row(43, "GPU stopped processing (channel reset)", "IGNORE", Info, CAT),
    row(44, "graphics fault during context switch", "IGNORE", Info, CAT),
    row(45, "preemptive cleanup after a previous error (follow that XID)", "WORKFLOW_XID_45", Info, CAT),
    row(46, "GPU stopped processing (GPU timeout)", "RESET_GPU", ResetGpu, CAT),
    row(48, "double-bit ECC error", "WORKFLOW_XID_48 (solo: RESET_GPU)", ResetGpu, MEM),
    row(60, "SEC2 engine exception", "RESTART_APP", RestartApp, CAT),
    row(62, "internal micro-controller halt (PMU)", "RESET_GPU", ResetGpu, CAT),
    row(63, "row remap / page retirement recorded (applies at the next reset)", "IGNORE", Info, MEM),
    row(64, "row remap / page retirement failed", "RESET_GPU", ResetGpu, MEM),
    row(66, "register access violation (FECS)", "IGNORE", Info, CAT),
    row(67, "verification violation (FECS)", "IGNORE", Info, CAT),
    row(68, "video decoder 0 exception", "RESTART_APP", RestartApp, CAT),
    row(69, "graphics class error", "RESTART_APP", RestartApp, CAT),
    row(70, "copy engine 3 exception", "RESTART_APP", RestartApp, CAT),
    row(71, "copy engine 4 exception", "RESTART_APP", RestartApp, CAT),
    row(72, "copy engine 5 exception", "RESTART_APP", RestartApp, CAT),
    row(74, "NVLink error", "WORKFLOW_NVLINK_ERR (reset the GPU or reboot)", ResetGpu, CAT),
    row(75, "copy engine 6 exception", "RESTART_APP", RestartApp, CAT),
    row(76, "copy engine 7 exception", "RESTART_APP", RestartApp, CAT),
    row(77, "copy engine 8 exception", "RESTART_APP", RestartApp, CAT),
    row(79, "GPU has fallen off the bus", "RESTART_BM", RebootNode, CAT),
    row(80, "push buffer CRC mismatch", "RESTART_APP", RestartApp, CAT),
    row(82, "JPEG engine 0 exception", "RESTART_APP", RestartApp, CAT),
    row(83, "video decoder 1 exception", "RESTART_APP", RestartApp, CAT),
    row(84, "video decoder 2 exception", "RESTART_APP", RestartApp, CAT),
    row(85, "copy engine 9 exception", "RESTART_APP", RestartApp, CAT),
    row(86, "optical flow engine 0 exception", "RESTART_APP", RestartApp, CAT),
    row(88, "video decoder 3 exception", "RESTART_APP", RestartApp, CAT),
    row(89, "video decoder 4 exception", "RESTART_APP", RestartApp, CAT),
    row(92, "high single-bit ECC error rate", "IGNORE", Info, MEM),
    row(93, "InfoROM erase limit exceeded", "IGNORE", Info, CAT),
    row(94, "contained ECC error (only the application that touched it ends)", "RESTART_APP", RestartApp, MEM),
    row(95, "uncontained ECC error", "RESET_GPU", ResetGpu, MEM),
    row(96, "video decoder 5 exception", "RESTART_APP", RestartApp, CAT),
    row(97, "video decoder 6 exception", "RESTART_APP", RestartApp, CAT),
    row(98, "video decoder 7 exception", "RESTART_APP", RestartApp, CAT),
    row(99, "JPEG engine 1 exception", "RESTART_APP", RestartApp, CAT),
    row(100, "JPEG engine 2 exception", "RESTART_APP", RestartApp, CAT),
    row(101, "JPEG engine 3 exception", "RESTART_APP", RestartApp, CAT),
    row(102, "JPEG engine 4 exception", "RESTART_APP", RestartApp, CAT),
    row(103, "JPEG engine 5 exception", "RESTART_APP", RestartApp, CAT),
    row(104, "JPEG engine 6 exception", "RESTART_APP", RestartApp, CAT),
    row(105, "JPEG engine 7 exception", "RESTART_APP", RestartApp, CAT),
    row(106, "SMBPBI test message", "IGNORE", Info, CAT),
    row(107, "SMBPBI test message (silent)", "IGNORE", Info, CAT),
    row(109, "context switch timeout", "RESET_GPU", ResetGpu, CAT),
    row(110, "security fault", "RESET_GPU", ResetGpu, CAT),
    row(119, "GSP RPC timeout", "RESET_GPU", ResetGpu, CAT),
    row(120, "GSP error", "RESET_GPU", ResetGpu, CAT),
    row(121, "C2C link error", "IGNORE", Info, CAT),
    row(126, "copy engine 10 exception", "RESTART_APP", RestartApp, CAT),
    row(127, "copy engine 11 exception", "RESTART_APP", RestartApp, CAT),
    row(128, "copy engine 12 exception", "RESTART_APP", RestartApp, CAT),
    row(129, "copy engine 13 exception", "RESTART_APP", RestartApp, CAT),
    row(130, "copy engine 14 exception", "RESTART_APP", RestartApp, CAT),
    row(131, "copy engine 15 exception", "RESTART_APP", RestartApp, CAT),
    row(132, "copy engine 16 exception", "RESTART_APP", RestartApp, CAT),
    row(133, "copy engine 17 exception", "RESTART_APP", RestartApp, CAT),
    row(134, "copy engine 18 exception", "RESTART_APP", RestartApp, CAT),
    row(135, "copy engine 19 exception", "RESTART_APP", RestartApp, CAT),
    row(136, "NVLink link training (ALI) failure", "RESET_GPU", ResetGpu, CAT),
    row(137, "NVLink FLA privilege error", "IGNORE", Info, CAT),
    row(139, "optical flow engine 1 exception", "RESTART_APP", RestartApp, CAT),
    row(140, "unrecovered ECC error escape", "RESET_GPU", ResetGpu, MEM),
    row(141, "fast path error", "IGNORE", Info, CAT),
    row(143, "GPU initialisation error", "RESET_GPU", ResetGpu, CAT),
    row(151, "key rotation error (confidential computing)", "RESTART_VM", RebootNode, CAT),
    row(152, "DLA SMMU error", "IGNORE", Info, CAT),
    row(153, "DLA timeout", "IGNORE", Info, CAT),
    row(154, "GPU recovery action changed (the driver's action is read from NVML)", "follow the recovery action", Info, CAT),
    row(155, "NVLink software-defined error", "RESET_GPU", ResetGpu, CAT),
    row(156, "resource retirement event", "RESET_GPU", ResetGpu, CAT),
    row(157, "resource retirement failure", "IGNORE", Info, CAT),
    row(158, "GPU fatal timeout", "RESET_GPU", ResetGpu, CAT),
    row(160, "channel retirement event", "RESTART_BM", RebootNode, CAT),
    row(161, "channel retirement failure", "IGNORE", Info, CAT),
];

/// XID 154: the driver changed its recovery action; the monitor reads it at once.
pub(crate) const RECOVERY_ACTION_CHANGED: u64 = 154;

/// The action for `xid`: an override of `gpu.xid_actions`, else the
/// built-in table; `None` for an XID in neither.
pub(crate) fn action_for(xid: u64, overrides: &XidOverrides) -> Option<XidAction> {
    overrides.get(&xid).copied().or_else(|| builtin(xid).map(|r| r.action))
}

/// The built-in row of `xid`.
pub(crate) fn builtin(xid: u64) -> Option<&'static XidRow> {
    BUILTIN.iter().find(|r| r.xid == xid)
}

/// The built-in table with the configured overrides applied (an override of an XID the table
/// does not list is added), by XID.
pub(crate) fn table(cfg: &GpuConfig) -> Vec<XidRow> {
    let mut rows: Vec<XidRow> = BUILTIN.to_vec();
    for (&xid, &action) in &cfg.xid_overrides() {
        match rows.iter_mut().find(|r| r.xid == xid) {
            Some(r) => (r.action, r.source) = (action, "config"),
            None => rows.push(row(xid, "(not in NVIDIA's table)", "-", action, "config")),
        }
    }
    rows.sort_by_key(|r| r.xid);
    rows
}

/// What Vigil does about the driver's own recovery action.
pub(crate) fn recovery_action(a: RecoveryAction) -> XidAction {
    // NB: an action this build does not know: the driver asks for something, and the
    // safe reading of "something must be done" is that the GPU is not usable as it is.
    RecoveryAction::KNOWN.iter().find(|r| r.0 == a).map_or(XidAction::ResetGpu, |r| r.3)
}

/// The table of the built-in classes as a Markdown table, as docs/gpu.md carries it.
#[cfg(any(test, feature = "bench"))]
pub fn markdown() -> String {
    let mut out = String::from(
        "| XID | meaning (NVIDIA) | NVIDIA's immediate action | Vigil | source |\n|---|---|---|---|---|\n",
    );
    for r in BUILTIN {
        out.push_str(&format!(
            "| {} | {} | {} | `{}` | {} |\n",
            r.xid,
            r.meaning,
            r.nvidia,
            r.action.as_str(),
            r.source
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_without_duplicates() {
        for w in BUILTIN.windows(2) {
            assert!(w[0].xid < w[1].xid, "{} then {}", w[0].xid, w[1].xid);
        }
    }

    #[test]
    fn nvidia_buckets_map_to_one_vigil_action_each() {
        for r in BUILTIN {
            let want = match r.nvidia.split_whitespace().next().unwrap_or("") {
                "RESTART_APP" => RestartApp,
                "RESET_GPU" | "WORKFLOW_XID_48" | "WORKFLOW_NVLINK_ERR" => ResetGpu,
                "RESTART_BM" | "RESTART_VM" => RebootNode,
                "IGNORE" | "WORKFLOW_XID_45" | "follow" => Info,
                other => panic!("XID {}: unmapped bucket {other}", r.xid),
            };
            assert_eq!(r.action, want, "XID {}", r.xid);
        }
    }

    #[test]
    fn the_memory_error_xids_follow_nvidias_pages() {
        // (XID, action): 63 pending remap runs on until the next reset; 94 contained → the
        // application; 95 uncontained → reset; 92 high SBE rate → informational; 64 remap
        // failure, 48 DBE → reset; 79 off the bus → reboot; 74 NVLink → reset.
        let none = BTreeMap::new();
        for (xid, want) in [
            (63, Info),
            (94, RestartApp),
            (95, ResetGpu),
            (92, Info),
            (64, ResetGpu),
            (48, ResetGpu),
            (79, RebootNode),
            (74, ResetGpu),
            (13, RestartApp),
            (43, Info),
        ] {
            assert_eq!(action_for(xid, &none), Some(want), "XID {xid}");
        }
        assert_eq!(action_for(999, &none), None);
        assert_eq!(action_for(1, &none), None, "CONTACT_SUPPORT, unused: not listed");
    }

    #[test]
    fn overrides_win_and_show_in_the_table() {
        let mut cfg = GpuConfig::default();
        cfg.xid_actions.insert("92".into(), XidAction::ResetGpu);
        cfg.xid_actions.insert("999".into(), XidAction::Drain);
        let o = cfg.xid_overrides();
        assert_eq!(action_for(92, &o), Some(ResetGpu));
        assert_eq!(action_for(999, &o), Some(XidAction::Drain));
        assert_eq!(action_for(79, &o), Some(RebootNode));
        let t = table(&cfg);
        let r92 = t.iter().find(|r| r.xid == 92).unwrap();
        assert_eq!((r92.action, r92.source), (ResetGpu, "config"));
        assert_eq!(t.last().unwrap().xid, 999);
        assert_eq!(t.len(), BUILTIN.len() + 1);
    }

    #[test]
    fn recovery_actions_map_onto_failing_actions_except_none() {
        assert!(!recovery_action(RecoveryAction::None).fails());
        for a in [
            RecoveryAction::GpuReset,
            RecoveryAction::NodeReboot,
            RecoveryAction::DrainP2p,
            RecoveryAction::DrainAndReset,
            RecoveryAction::Other(7),
        ] {
            assert!(recovery_action(a).fails(), "{a:?}");
        }
        assert_eq!(recovery_action(RecoveryAction::NodeReboot), RebootNode);
        assert_eq!(recovery_action(RecoveryAction::DrainAndReset), XidAction::Drain);
    }
}
