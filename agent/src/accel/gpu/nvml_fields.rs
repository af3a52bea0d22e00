//! A GPU's fields as NVML reads them: each `None` where it cannot be read ([`field`]), never a
//! failed sample; and its speed (issue 45, fail-slow; judged in
//! `crate::accel::gpu::policy_slow`): its SM clock against its maximum, PCIe replays and NVLink
//! data-link errors ([`fill_speed`]) — `None` where the GPU or its driver does not report them
//! (no NVLink, an older driver, a MIG parent without the privilege).

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;

use super::model::GpuSample;

/// `NVML_NVLINK_MAX_LINKS` of the NVML headers (18 on Hopper).
const MAX_LINKS: u32 = 18;

/// A field that cannot be read is `None`, never a failed sample (ECC off, no sensor, old GPU).
pub(crate) fn field<T>(index: u32, what: &'static str, r: Result<T, NvmlError>) -> Option<T> {
    r.map_err(|e| tracing::debug!(gpu = index, field = what, error = %e, "GPU field not read")).ok()
}

/// Read GPU `index`'s speed into its sample.
pub(crate) fn fill_speed(index: u32, d: &Device<'_>, s: &mut GpuSample) {
    s.pcie_replays = field(index, "pcie_replays", d.pcie_replay_counter()).map(u64::from);
    s.nvlink_errors = nvlink_errors(index, d);
    s.sm_clock_mhz = field(index, "sm_clock", d.clock_info(Clock::SM));
    s.sm_clock_max_mhz = field(index, "sm_clock_max", d.max_clock_info(Clock::SM));
}

/// The four data-link error counters summed over the GPU's active NVLinks; `None` when no link
/// is active (no NVLink) or none could be read.
fn nvlink_errors(index: u32, d: &Device<'_>) -> Option<u64> {
    let mut total: Option<u64> = None;
    for link in 0..MAX_LINKS {
        let l = d.link_wrapper_for(link);
        if field(index, "nvlink_active", l.is_active()) != Some(true) {
            continue;
        }
        for c in [
            ErrorCounter::DlReplay,
            ErrorCounter::DlRecovery,
            ErrorCounter::DlCrcFlit,
            ErrorCounter::DlCrcData,
        ] {
            if let Some(n) = field(index, "nvlink_errors", l.error_counter(c)) {
                total = Some(total.unwrap_or(0).saturating_add(n));
            }
        }
    }
    total
}
