//! NVML's readings of a GPU's speed (issue 45, fail-slow; judged in
//! `crate::accel::gpu::policy_slow`): its SM clock against its maximum, PCIe replays and NVLink
//! data-link errors. Each `None` where the GPU or its driver does not report it (no NVLink, an
//! older driver, a MIG parent without the privilege).

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::Device;

use super::model::GpuSample;
use super::nvml::field;

/// `NVML_NVLINK_MAX_LINKS` of the NVML headers (18 on Hopper).
const MAX_LINKS: u32 = 18;

/// Read GPU `index`'s speed into its sample.
pub(crate) fn fill(index: u32, d: &Device<'_>, s: &mut GpuSample) {
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
