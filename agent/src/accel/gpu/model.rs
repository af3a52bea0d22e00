//! GPU data: what NVML reads (samples, XID events) and what Vigil concludes (per-GPU status and
//! the node's report). The rules that turn one into the other are in `crate::accel::gpu::policy`; the
//! per-XID classes in `crate::accel::gpu::policy_xid`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use strum::{IntoStaticStr, VariantArray};

use crate::config::XidAction;

/// One reading of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub uuid: String,
    /// The minor number of its device file (`/dev/nvidiaN`): GKE's device plugin names GPUs by
    /// it (`nvidia0`, …). `None` when NVML did not say.
    pub minor_number: Option<u32>,
    pub name: String,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    /// 0.0–1.0
    pub utilization: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub ecc_volatile_corrected: Option<u64>,
    pub ecc_volatile_uncorrected: Option<u64>,
    pub ecc_aggregate_corrected: Option<u64>,
    pub ecc_aggregate_uncorrected: Option<u64>,
    /// Retired pages (single-bit + double-bit causes).
    pub retired_pages: Option<u64>,
    pub retired_pages_pending: Option<bool>,
    /// Row remapping (Ampere and newer): `None` where the driver has no such counters.
    pub remapped_rows: Option<RemappedRows>,
    /// Active clock-throttle reasons, stable names (e.g. `hw-slowdown`, `sw-thermal`).
    pub throttle_reasons: Vec<&'static str>,
    /// Processes with a compute context on this GPU (a CUDA application, idle or not).
    /// `None` when NVML could not say (an old driver, a MIG parent without the privilege): the
    /// opportunistic-maintenance idle check reads that as "maybe busy".
    pub compute_processes: Option<u32>,
    /// What the driver says must happen before the GPU is usable again
    /// (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`); `None` where the driver does not report it.
    pub recovery_action: Option<RecoveryAction>,
    /// Energy used since the driver last loaded, in millijoules (Volta and newer): it starts
    /// again from zero when the driver reloads.
    pub energy_mj: Option<u64>,
    /// Persistence mode. Without it the driver unloads when its last client exits, so the
    /// counters that restart with the driver restart without any reset too.
    pub persistence_mode: Option<bool>,
    /// PCIe replays since the driver loaded (a link retrying transfers).
    pub pcie_replays: Option<u64>,
    /// NVLink data-link errors (replay, recovery, flit and data CRC) summed over the active
    /// links; `None` without NVLink.
    pub nvlink_errors: Option<u64>,
    /// The SM clock now and its maximum, MHz.
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
}

/// The driver's own recovery action for a GPU (`nvmlDeviceGpuRecoveryAction_t`, read through
/// the field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecoveryAction {
    /// 0: nothing to do; a new process can use the GPU.
    None,
    /// 1: terminate the GPU's processes and reset it (`nvidia-smi -r`).
    GpuReset,
    /// 2: the fault may have left the OS inconsistent: reboot the node.
    NodeReboot,
    /// 3: stop peer-to-peer traffic to and from the GPU.
    DrainP2p,
    /// 4: drain peer-to-peer traffic, then reset the GPU.
    DrainAndReset,
    /// Any other value (newer drivers add actions, e.g. 6 bus reset, 7 system reboot).
    Other(u32),
}

impl RecoveryAction {
    /// The actions NVML names: each with its numeric value, NVML's name (for reasons and the
    /// docs) and what Vigil does about it (`crate::accel::gpu::policy_xid::recovery_action`).
    pub(crate) const KNOWN: [(Self, u32, &'static str, XidAction); 5] = [
        (Self::None, 0, "NVML_GPU_RECOVERY_ACTION_NONE", XidAction::Informational),
        (Self::GpuReset, 1, "NVML_GPU_RECOVERY_ACTION_GPU_RESET", XidAction::ResetGpu),
        (Self::NodeReboot, 2, "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT", XidAction::RebootNode),
        (Self::DrainP2p, 3, "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P", XidAction::Drain),
        (Self::DrainAndReset, 4, "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", XidAction::Drain),
    ];

    /// From NVML's numeric value.
    pub(crate) fn from_nvml(v: u32) -> RecoveryAction {
        Self::KNOWN.iter().find(|r| r.1 == v).map_or(RecoveryAction::Other(v), |r| r.0)
    }

    /// NVML's name for it, for reasons and the docs.
    pub(crate) fn nvml_name(self) -> String {
        match self {
            RecoveryAction::Other(n) => format!("recovery action {n}"),
            a => Self::KNOWN.iter().find(|r| r.0 == a).map_or("", |r| r.2).into(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

/// A critical XID event from the NVML event set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    pub index: u32,
    pub uuid: String,
    pub xid: u64,
}

/// Health of one GPU or of the node's GPUs: the accelerators' one scale.
pub type GpuHealth = crate::accel::model::Health;

/// At most this many recent XIDs are kept per GPU, so an XID storm cannot grow the report without
/// bound (the counts in `xid_counts` stay exact).
pub(crate) const MAX_RECENT_XIDS: usize = 256;

/// What Vigil knows about one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuStatus {
    /// NVML index (the order `nvidia-smi` shows).
    pub index: u32,
    /// NVML UUID (`GPU-…`): the identity a GPU keeps across samples.
    pub uuid: String,
    pub health: GpuHealth,
    /// Why the GPU is not healthy, one line per cause, for operators.
    pub reasons: Vec<String>,
    /// The last sample read (kept as it was when the GPU went missing).
    pub sample: GpuSample,
    /// Every XID seen on this GPU in this process: XID → count.
    pub xid_counts: BTreeMap<u64, u64>,
    /// XIDs within `gpu.evidence_window`: (XID, when, on the monitor's monotonic ms clock).
    pub recent_xids: Vec<(u64, i64)>,
    /// Seen before, absent from the last [`MISSING_ROUNDS`] samples.
    pub missing: bool,
    /// Consecutive samples this GPU was absent from.
    pub missing_rounds: u32,
    /// A failure that stays until the hardware shows it was reset (see [`Failure`]).
    pub failure: Option<Failure>,
    /// The XID episodes still open on this GPU, one per XID (`crate::accel::gpu::policy_episode`).
    pub episodes: Vec<XidEpisode>,
    /// Error counters that rose lately (`crate::accel::gpu::policy_slow`): a slow job's evidence.
    pub rises: Vec<Rise>,
}

impl GpuStatus {
    /// A GPU known only by its index and UUID (from an XID event, or the state file): no
    /// reading of it yet.
    pub(crate) fn known(index: u32, uuid: String) -> GpuStatus {
        let sample = GpuSample { index, uuid: uuid.clone(), ..GpuSample::default() };
        GpuStatus { index, uuid, sample, ..GpuStatus::default() }
    }
}

/// An error counter of a GPU that rose: by how much since it began rising, and when it last did
/// (on the monitor's monotonic ms clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rise {
    pub what: &'static str,
    pub by: u64,
    pub at_ms: i64,
}

/// A run of one XID on one GPU: events less than `gpu.xid_threshold.window` apart. A storm of
/// events (a node has logged 800,000 XID 95 lines for 29 distinct errors) is one episode: one log
/// line when it begins, one when it ends, one Event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XidEpisode {
    /// Numbers episodes in this monitor process, in the order they began.
    pub seq: u64,
    pub xid: u64,
    /// The first and the latest event, on the monitor's monotonic ms clock.
    pub first_ms: i64,
    pub last_ms: i64,
    /// Events in the episode.
    pub count: u64,
    /// The latest events' times, at most `gpu.xid_threshold.count` of them.
    pub(crate) recent: Vec<i64>,
    /// `gpu.xid_threshold.count` events fell within its window at some point of the episode.
    pub counted: bool,
}

/// An episode that began, as a report keeps it for whoever announces it (an Event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeBegun {
    pub seq: u64,
    /// `GPU 0 (GPU-…)`.
    pub gpu: String,
    pub xid: u64,
    pub action: Option<XidAction>,
    /// `XID 95 (uncontained ECC error) on GPU 0 (GPU-…): reset the GPU …`.
    pub detail: String,
}

/// At most this many begun episodes are kept in a report (readers are far faster).
pub(crate) const MAX_BEGUN: usize = 32;

/// A GPU failure that outlives the event that caused it: a `reset-gpu`, `drain` or
/// `reboot-node` XID, the driver's recovery action, or the GPU's loss. The samples after it may
/// look normal (the driver keeps answering for a broken GPU), so only evidence that the GPU was
/// reset, the driver reloaded or the node rebooted clears it (`crate::accel::gpu::policy`), and it is
/// kept across agent restarts in `gpu.state_file` (`crate::accel::gpu::policy_state`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failure {
    /// The most drastic action any cause calls for (a lost GPU: `reboot-node`, as for XID 79).
    pub(crate) action: XidAction,
    /// One line per cause, e.g. `XID 95 (uncontained ECC error)`.
    pub(crate) causes: Vec<String>,
    /// The GPU was lost (absent from NVML): cleared when NVML lists it again.
    pub(crate) lost: bool,
    /// Read from the state file: the failure predates this agent process.
    pub(crate) kept: bool,
    /// The marks still come from the state file (no sample of this process compared yet): a
    /// counter that went down counts only with persistence mode then.
    pub(crate) marks_from_file: bool,
    /// What the GPU's reset-sensitive readings were: a later reading below them is a reset.
    pub(crate) marks: ResetMarks,
}

/// Readings that start again (or clear) when a GPU is reset or its driver reloads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResetMarks {
    pub(crate) ecc_volatile_corrected: Option<u64>,
    pub(crate) ecc_volatile_uncorrected: Option<u64>,
    pub(crate) energy_mj: Option<u64>,
    pub(crate) remap_pending: Option<bool>,
    pub(crate) retired_pages_pending: Option<bool>,
    pub(crate) recovery_action: Option<RecoveryAction>,
}

/// A failure cleared, and why: written to the trail (`gpu-failure-cleared`) by whoever reads
/// the reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuCleared {
    /// Increases by one per clearing in this process; readers note those they have not seen.
    pub(crate) seq: u64,
    /// `GPU 0 (GPU-…)`.
    pub gpu: String,
    /// The evidence, e.g. `the node rebooted (boot id changed)`.
    pub why: String,
    /// The causes the failure had.
    pub causes: Vec<String>,
}

/// At most this many clearings are kept in a report (readers are far faster than resets).
pub(crate) const MAX_CLEARED: usize = 16;

/// Where the GPU monitor stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub enum GpuMonitorState {
    /// Not started yet.
    #[default]
    Starting,
    /// `gpu.enabled = off`.
    Off,
    /// No NVIDIA GPU on this node (no `/dev/nvidiaN`, no NVIDIA PCI display device); looked
    /// for again now and then.
    NoGpu,
    /// The node has NVIDIA GPUs but NVML does not load yet (the driver installer has not
    /// finished, or the library is not mounted): tried again with backoff.
    WaitingForDriver,
    /// NVML is loaded and the GPUs are watched.
    On,
    /// An NVML call has not returned within `gpu.call_deadline` (a wedged driver): no verdict
    /// until it answers; GPUs that had failed stay failed.
    NvmlHung,
}

as_str!(pub GpuMonitorState);

/// A GPU must be absent from this many samples in a row to count as gone: one read that fails
/// (a transient NVML error) must not fail the GPU, block its worker's restarts and taint the
/// node.
pub(crate) const MISSING_ROUNDS: u32 = 3;

/// The GPU verdict of this node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReport {
    /// Where the monitor stands. Anything but [`GpuMonitorState::On`]: no verdict at all (never
    /// read as healthy hardware, only as "unknown").
    pub state: GpuMonitorState,
    /// Ordered by NVML index.
    pub gpus: Vec<GpuStatus>,
    /// The worst GPU's health.
    pub node: GpuHealth,
    /// Every GPU's reasons, in GPU order.
    pub node_reasons: Vec<String>,
    /// The latest failures cleared (at most [`MAX_CLEARED`]), oldest first.
    pub cleared: Vec<GpuCleared>,
    /// The latest XID episodes begun (at most [`MAX_BEGUN`]), oldest first.
    pub begun: Vec<EpisodeBegun>,
    /// The last episode number given out.
    pub episode_seq: u64,
    /// The NVML call that has not returned within `gpu.call_deadline` (state
    /// [`GpuMonitorState::NvmlHung`]), e.g. `reading the GPUs for 31s`.
    pub hung: Option<String>,
    /// What the node's GPU Events have said, kept across agent restarts.
    pub told: Told,
}

/// What the node's GPU Events have said: the health of the last one (none said is healthy:
/// a GPU is healthy until told otherwise). Kept in `gpu.state_file`, so that a restarted
/// agent's first verdict is an Event only when it says something else
/// (`crate::accel::gpu::policy_node::announced`): a failure written before its Event went out
/// is announced after the restart, one announced is not announced again.
#[derive(Debug, Clone, Default)]
pub struct Told {
    /// What they said before this agent started, read from the state file; `None` when not
    /// known (no `gpu.state_file`, a file that cannot be read, or a value this build does not
    /// know).
    pub(crate) before: Option<GpuHealth>,
    /// What they said since: set by the node controller as it shows each verdict, written to
    /// the state file by the monitor. One per monitor, shared by every clone of its reports.
    since: Arc<Mutex<Option<GpuHealth>>>,
}

impl Told {
    /// What the state file says the Events said before this agent started.
    pub(crate) fn restored(before: Option<GpuHealth>) -> Told {
        Told { before, since: Arc::default() }
    }

    /// The node controller showed a verdict of `health`: its Event, if one was due, went out.
    pub(crate) fn said(&self, health: GpuHealth) {
        *self.lock() = Some(health);
    }

    /// What the last Event said: since this agent started, else before.
    pub(crate) fn last(&self) -> Option<GpuHealth> {
        let since = *self.lock();
        since.or(self.before)
    }

    fn lock(&self) -> MutexGuard<'_, Option<GpuHealth>> {
        self.since.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// NB: what was said since is shared state, not part of a report's value: two reports are the
/// same whatever it holds (a report is published again only when its verdict changes).
impl PartialEq for Told {
    fn eq(&self, other: &Told) -> bool {
        self.before == other.before
    }
}

impl GpuReport {
    /// NVML is loaded and the monitor runs: the verdict means something.
    pub fn monitoring(&self) -> bool {
        self.state == GpuMonitorState::On
    }

    /// The GPUs' failures hold: NVML runs, or it hangs in a call (a failure seen before the
    /// driver wedged is not forgotten because it stopped answering), or a GPU is failed before
    /// NVML is read (kept across an agent restart: `gpu.state_file`). A worker on a failed GPU
    /// is never restarted while this holds.
    pub fn failures_known(&self) -> bool {
        matches!(self.state, GpuMonitorState::On | GpuMonitorState::NvmlHung)
            || self.gpus.iter().any(|g| g.health == GpuHealth::Failed)
    }

    /// A report in `state` with no GPU.
    pub(crate) fn in_state(state: GpuMonitorState) -> GpuReport {
        GpuReport { state, ..GpuReport::default() }
    }

    /// The GPU with this index or UUID (`GPU-…`, case-insensitive).
    #[cfg(any(test, feature = "bench"))]
    pub fn gpu(&self, id: &str) -> Option<&GpuStatus> {
        self.gpus.iter().find(|g| selects(g, id))
    }
}

/// `GPU 0 (GPU-…)`, or `GPU 0` without a UUID: how reasons, Events and the trail name a GPU.
pub(crate) fn label(index: u32, uuid: &str) -> String {
    match uuid {
        "" => format!("GPU {index}"),
        _ => format!("GPU {index} ({uuid})"),
    }
}

/// `id` is the GPU's index (`"0"`), its UUID, or its device file's name (`nvidia0`, as GKE's
/// device plugin names GPUs).
pub(crate) fn selects(g: &GpuStatus, id: &str) -> bool {
    let id = id.trim();
    if let Some(n) = id.strip_prefix("nvidia").and_then(|n| n.parse::<u32>().ok()) {
        // NB: `nvidiaN` is /dev/nvidiaN, whose N is the minor number, not the NVML index (which
        // follows the PCI bus order). They agree on most machines; where NVML gave no minor
        // number (a GPU known only from an XID event) the index stands in.
        return g.sample.minor_number.unwrap_or(g.index) == n;
    }
    id.parse::<u32>().is_ok_and(|i| i == g.index)
        || (!g.uuid.is_empty() && g.uuid.eq_ignore_ascii_case(id))
}

/// The GPUs of `report` that `ids` name (see [`selects`]): `None`, or a list containing `all`,
/// means every GPU of the node.
pub(crate) fn chosen<'a>(
    report: &'a GpuReport,
    ids: Option<&'a [String]>,
) -> impl Iterator<Item = &'a GpuStatus> {
    let all = ids.is_none_or(|ids| ids.iter().any(|id| id.trim().eq_ignore_ascii_case("all")));
    let ids = ids.unwrap_or_default();
    report.gpus.iter().filter(move |g| all || ids.iter().any(|id| selects(g, id)))
}
