//! GPU data: what NVML reads (samples, XID events) and what Vigil concludes (per-GPU status and
//! the node's report). The rules that turn one into the other are in `crate::policy::gpu`.

use std::collections::BTreeMap;

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

/// Health of one GPU or of the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuHealth {
    #[default]
    Healthy,
    Degraded,
    Failed,
}

impl GpuHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuHealth::Healthy => "healthy",
            GpuHealth::Degraded => "degraded",
            GpuHealth::Failed => "failed",
        }
    }
}

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
}

/// A GPU must be absent from this many samples in a row to count as gone: one read that fails
/// (a transient NVML error) must not fail the GPU, block its worker's restarts and taint the
/// node.
pub(crate) const MISSING_ROUNDS: u32 = 3;

/// The GPU verdict of this node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReport {
    /// NVML is loaded and the monitor runs. `false`: no verdict at all (never read as healthy
    /// hardware, only as "unknown").
    pub monitoring: bool,
    /// Ordered by NVML index.
    pub gpus: Vec<GpuStatus>,
    /// The worst GPU's health.
    pub node: GpuHealth,
    /// Every GPU's reasons, in GPU order.
    pub node_reasons: Vec<String>,
}

impl GpuReport {
    /// The GPU with this index or UUID (`GPU-…`, case-insensitive).
    pub fn gpu(&self, id: &str) -> Option<&GpuStatus> {
        self.gpus.iter().find(|g| selects(g, id))
    }
}

/// `id` is the GPU's index (`"0"`), its UUID, or its device file's name (`nvidia0`, as GKE's
/// device plugin names GPUs).
pub(crate) fn selects(g: &GpuStatus, id: &str) -> bool {
    let id = id.trim();
    if let Some(n) = id
        .strip_prefix("nvidia")
        .and_then(|n| n.parse::<u32>().ok())
    {
        // NB: `nvidiaN` is /dev/nvidiaN, whose N is the minor number, not the NVML index (which
        // follows the PCI bus order). They agree on most machines; where NVML gave no minor
        // number (a GPU known only from an XID event) the index stands in.
        return g.sample.minor_number.unwrap_or(g.index) == n;
    }
    id.parse::<u32>().is_ok_and(|i| i == g.index)
        || (!g.uuid.is_empty() && g.uuid.eq_ignore_ascii_case(id))
}
