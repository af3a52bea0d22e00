//! GPU health through NVML.
//!
//! Map: [`GpuProbe`] is the one blocking adapter (read every GPU; wait for critical XID events);
//! [`NvmlProbe`] implements it with `nvml-wrapper`, loading `libnvidia-ml.so.1` at run time, and
//! tests plug in a fake. The GPU monitor (`crate::accel::gpu::monitor`) runs a probe on a dedicated thread.
//!
//! Facts about NVML this module relies on (nvml-wrapper 0.13 / nvml-wrapper-sys 0.10 sources):
//! - `Nvml::init` loads the library with `libloading`: a missing library is
//!   `NvmlError::LibloadingError`; a library without a running driver is `DriverNotLoaded`.
//! - `EventSet::wait` returns `Timeout` when nothing arrived (or an interrupt came); for
//!   `CRITICAL_XID_ERROR` events `event_data` carries the last XID seen on that device.
//! - `Device::register_events` frees the set when registration fails, so the set is rebuilt.
//! - `nvmlDeviceGetRemappedRows` is not wrapped by nvml-wrapper 0.13; see [`RemapReader`].
//! - The driver's recovery action is the field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` (230, not in
//!   the range nvml-wrapper renumbers for 13.x drivers), read through `Device::field_values_for`;
//!   a driver without it answers the field with an error, read as `None`.
//! - `nvmlDeviceGetTotalEnergyConsumption` counts millijoules since the driver last loaded.
//!
//! [`NvmlLoader`] and [`gpus_present`] are the seams of the monitor's start-up: loading NVML, and
//! telling "no NVIDIA GPU here" from "GPUs, but no driver yet".

// NB: real time on purpose: NVML blocks, so the probe runs on its own thread, outside the async
// runtime and any clock a test drives; its XID wait's deadline is real time.
#![allow(clippy::disallowed_types)]

use std::ffi::OsStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, RetirementCause, TemperatureSensor,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
use nvml_wrapper::{Device, EventSet, Nvml};
use nvml_wrapper_sys::bindings::NvmlLib;

use crate::accel::gpu::model::{GpuSample, RecoveryAction, RemappedRows, XidEvent};
use crate::accel::{names, numbered};

/// Why GPU monitoring is off (said once at start-up).
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The library (or the driver behind it) is not there.
    #[error("NVML could not be loaded ({0}): no NVIDIA driver on this node, or the library is not mounted into the container; GPU monitoring is off")]
    NoLibrary(String),
    /// The library is there; the devices are not ours to read.
    #[error("NVML refused access ({0}): the agent lacks permission to the NVIDIA devices; GPU monitoring is off")]
    NoPermission(String),
    /// Any other NVML failure.
    #[error("NVML call failed: {0}")]
    Call(String),
}

/// A source of GPU readings. Blocking: called from a dedicated thread, never the executor.
pub trait GpuProbe: Send {
    /// Read every GPU now. A GPU that cannot be read at all is left out (its absence is a fact).
    fn sample(&mut self) -> Result<Vec<GpuSample>, GpuError>;
    /// Wait up to `timeout` for critical XID events; an empty vector on timeout.
    fn wait_xids(&mut self, timeout: Duration) -> Result<Vec<XidEvent>, GpuError>;
}

/// The library opened when no path is configured (nvml-wrapper's private `LIB_PATH`, which
/// `Nvml::init` opens).
const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// Initialised NVML handles, one per library path (in practice one per process).
///
/// NB: leaked on purpose. An `EventSet<'nvml>` borrows the `Nvml` it came from, and the probe must
/// own both (it moves to the monitor thread). Leaking the `Nvml` into a `&'static Nvml` solves the
/// self-reference without `unsafe`; it is created once per process and lives as long as the
/// process anyway (dropping it would only call `nvmlShutdown` at exit). Kept here so a second
/// probe (a config reload, a test) reuses it instead of leaking another.
static NVML: Mutex<Vec<(String, &'static Nvml)>> = Mutex::new(Vec::new());

fn nvml_for(library_path: &str) -> Result<&'static Nvml, NvmlError> {
    let mut loaded = NVML.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, nvml)) = loaded.iter().find(|(path, _)| path == library_path) {
        return Ok(nvml);
    }
    // NB: with no flags, the builder's `init` is `Nvml::init` on this path (`nvmlInit_v2`).
    let nvml = Nvml::builder().lib_path(OsStr::new(library_path)).init()?;
    let nvml: &'static Nvml = Box::leak(Box::new(nvml));
    loaded.push((library_path.to_string(), nvml));
    Ok(nvml)
}

fn init_error(e: NvmlError) -> GpuError {
    match e {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound | NvmlError::DriverNotLoaded => {
            GpuError::NoLibrary(e.to_string())
        }
        NvmlError::NoPermission => GpuError::NoPermission(e.to_string()),
        e => GpuError::Call(e.to_string()),
    }
}

/// Reads `nvmlDeviceGetRemappedRows`.
///
/// NB: nvml-wrapper 0.13 does not wrap this function, so the symbol is loaded through
/// nvml-wrapper-sys from the same library file. `dlopen` of an already loaded library returns the
/// same handle, so this shares the state `nvmlInit` set up for [`Nvml`]. The only `unsafe` in this
/// module is here: loading the library, taking the device handle, and the FFI call itself.
struct RemapReader {
    lib: NvmlLib,
}

impl RemapReader {
    fn open(path: &str) -> Option<RemapReader> {
        // SAFETY: the library is already loaded and initialised by `Nvml` (its initialisers have
        // run); loading it again only takes another reference and resolves symbols.
        let lib = unsafe { NvmlLib::new(path) }.ok()?;
        lib.nvmlDeviceGetRemappedRows.is_ok().then_some(RemapReader { lib })
    }

    /// `Ok(None)` where the GPU has no row remapper (pre-Ampere).
    fn read(&self, device: &Device<'_>) -> Result<Option<RemappedRows>, NvmlError> {
        let Ok(sym) = self.lib.nvmlDeviceGetRemappedRows.as_ref() else { return Ok(None) };
        let (mut corr, mut unc, mut pending, mut failure) = (0, 0, 0, 0);
        // SAFETY: `device` is a live handle of the same (leaked, never shut down) NVML instance;
        // the four out-pointers are valid, distinct `c_uint`s on this stack frame.
        let ret = unsafe { sym(device.handle(), &mut corr, &mut unc, &mut pending, &mut failure) };
        let (pending, failure) = (pending != 0, failure != 0);
        let rows = RemappedRows { correctable: corr, uncorrectable: unc, pending, failure };
        match nvml_try(ret) {
            Ok(()) => Ok(Some(rows)),
            Err(NvmlError::NotSupported) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Stable names of the active clock-throttle reasons (metric label values).
pub(crate) fn throttle_names(r: ThrottleReasons) -> Vec<&'static str> {
    const NAMES: [(ThrottleReasons, &str); 9] = [
        (ThrottleReasons::GPU_IDLE, "gpu-idle"),
        (ThrottleReasons::APPLICATIONS_CLOCKS_SETTING, "applications-clocks-setting"),
        (ThrottleReasons::SW_POWER_CAP, "sw-power-cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw-slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync-boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw-thermal"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw-thermal"),
        (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hw-power-brake"),
        (ThrottleReasons::DISPLAY_CLOCK_SETTING, "display-clocks"),
    ];
    NAMES.iter().filter(|(flag, _)| r.contains(*flag)).map(|&(_, name)| name).collect()
}

/// [`GpuProbe`] over the real NVML.
pub struct NvmlProbe {
    nvml: &'static Nvml,
    /// `None` when no GPU accepts critical XID events.
    events: Option<EventSet<'static>>,
    /// The GPUs whose critical XID events are watched.
    pub(crate) xid_gpus: Vec<u32>,
    remap: Option<RemapReader>,
}

// NB: for the suites' `unwrap_err`.
#[cfg(any(test, feature = "bench"))]
impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProbe")
            .field("xid_gpus", &self.xid_gpus)
            .field("remapped_rows", &self.remap.is_some())
            .finish()
    }
}

impl NvmlProbe {
    /// Load NVML (from `library_path`, or the loader's search path) and register for critical
    /// XID events on every GPU that supports them. Never panics.
    pub fn new(library_path: Option<&str>) -> Result<NvmlProbe, GpuError> {
        let library_path = library_path.filter(|p| !p.is_empty()).unwrap_or(DEFAULT_LIB);
        let nvml = nvml_for(library_path).map_err(init_error)?;
        let count = nvml.device_count().map_err(init_error)?;
        let candidates: Vec<u32> = (0..count)
            .filter(|&i| match nvml.device_by_index(i).and_then(|d| d.supported_event_types()) {
                Ok(types) => types.contains(EventTypes::CRITICAL_XID_ERROR),
                Err(e) => {
                    tracing::debug!(gpu = i, error = %e, "no XID events from this GPU");
                    false
                }
            })
            .collect();
        let (events, xid_gpus) = event_set(nvml, candidates);
        if xid_gpus.len() < count as usize {
            tracing::warn!(
                gpus = count,
                with_xid_events = xid_gpus.len(),
                "some GPUs do not deliver XID events; their hardware errors show only through samples"
            );
        }
        let remap = RemapReader::open(library_path);
        Ok(NvmlProbe { nvml, events, xid_gpus, remap })
    }

    /// How many GPUs NVML lists now.
    pub fn gpu_count(&self) -> Result<u32, GpuError> {
        self.nvml.device_count().map_err(|e| GpuError::Call(e.to_string()))
    }

    fn read(&self, index: u32, d: &Device<'static>) -> Option<GpuSample> {
        // Without a UUID the GPU has no identity to judge; it is left out like a lost one.
        let uuid = readable(index, d.uuid())?;
        let memory = field(index, "memory", d.memory_info());
        let ecc = |kind, counter| field(index, "ecc", d.total_ecc_errors(kind, counter));
        // Pages retired for either cause, read where the literal reads them (NVML's call order).
        let retired = || -> Result<u64, NvmlError> {
            let single = d.retired_pages(RetirementCause::MultipleSingleBitEccErrors)?.len() as u64;
            Ok(single + d.retired_pages(RetirementCause::DoubleBitEccError)?.len() as u64)
        };
        Some(GpuSample {
            index,
            uuid,
            minor_number: field(index, "minor_number", d.minor_number()),
            name: field(index, "name", d.name()).unwrap_or_default(),
            temperature_c: field(index, "temperature", d.temperature(TemperatureSensor::Gpu)),
            power_w: field(index, "power", d.power_usage()).map(|mw| f64::from(mw) / 1000.0),
            utilization: field(index, "utilization", d.utilization_rates())
                .map(|u| f64::from(u.gpu.min(100)) / 100.0),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            ecc_volatile_corrected: ecc(MemoryError::Corrected, EccCounter::Volatile),
            ecc_volatile_uncorrected: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
            ecc_aggregate_corrected: ecc(MemoryError::Corrected, EccCounter::Aggregate),
            ecc_aggregate_uncorrected: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
            retired_pages: field(index, "retired_pages", retired()),
            retired_pages_pending: field(
                index,
                "retired_pages_pending",
                d.are_pages_pending_retired(),
            ),
            remapped_rows: self
                .remap
                .as_ref()
                .and_then(|r| field(index, "remapped_rows", r.read(d)).flatten()),
            throttle_reasons: field(index, "throttle_reasons", d.current_throttle_reasons())
                .map(throttle_names)
                .unwrap_or_default(),
            // NB: the count form of nvmlDeviceGetComputeRunningProcesses: listing the processes
            // races with one starting between the two calls the list takes (InsufficientSize).
            compute_processes: field(
                index,
                "compute_processes",
                d.running_compute_processes_count(),
            ),
            recovery_action: recovery_action(index, d),
            energy_mj: field(index, "energy", d.total_energy_consumption()),
            persistence_mode: field(index, "persistence_mode", d.is_in_persistent_mode()),
            // The speed (issue 45, fail-slow; judged in `crate::accel::gpu::policy_slow`).
            pcie_replays: field(index, "pcie_replays", d.pcie_replay_counter()).map(u64::from),
            nvlink_errors: nvlink_errors(index, d),
            sm_clock_mhz: field(index, "sm_clock", d.clock_info(Clock::SM)),
            sm_clock_max_mhz: field(index, "sm_clock_max", d.max_clock_info(Clock::SM)),
        })
    }
}

/// `NVML_NVLINK_MAX_LINKS` of the NVML headers (18 on Hopper).
const MAX_LINKS: u32 = 18;

/// A GPU that cannot be read at all (its handle, its UUID) is left out, said at debug level.
fn readable<T>(index: u32, r: Result<T, NvmlError>) -> Option<T> {
    r.map_err(|e| tracing::debug!(gpu = index, error = %e, "GPU not readable")).ok()
}

/// A field that cannot be read is `None`, never a failed sample (ECC off, no sensor, old GPU,
/// no NVLink, an older driver, a MIG parent without the privilege).
fn field<T>(index: u32, what: &'static str, r: Result<T, NvmlError>) -> Option<T> {
    r.map_err(|e| tracing::debug!(gpu = index, field = what, error = %e, "GPU field not read")).ok()
}

/// The four data-link error counters summed over the GPU's active NVLinks; `None` when no link
/// is active (no NVLink) or none could be read.
fn nvlink_errors(index: u32, d: &Device<'_>) -> Option<u64> {
    use ErrorCounter::{DlCrcData, DlCrcFlit, DlRecovery, DlReplay};
    (0..MAX_LINKS)
        .map(|link| d.link_wrapper_for(link))
        .filter(|l| field(index, "nvlink_active", l.is_active()) == Some(true))
        .flat_map(|l| {
            [DlReplay, DlRecovery, DlCrcFlit, DlCrcData]
                .map(|c| field(index, "nvlink_errors", l.error_counter(c)))
        })
        .flatten()
        .reduce(u64::saturating_add)
}

/// The driver's recovery action for `d`, `None` where the driver does not report one.
fn recovery_action(index: u32, d: &Device<'_>) -> Option<RecoveryAction> {
    let ids = [FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)];
    let mut values = field(index, "recovery_action", d.field_values_for(&ids))?;
    let sample = field(index, "recovery_action", values.pop()?)?;
    let v = match field(index, "recovery_action", sample.value)? {
        SampleValue::U32(v) => u64::from(v),
        SampleValue::U64(v) => v,
        SampleValue::I64(v) => u64::try_from(v).ok()?,
        SampleValue::F64(_) => return None,
    };
    Some(RecoveryAction::from_nvml(u32::try_from(v).ok()?))
}

/// An event set with critical XIDs registered on `gpus`, and the GPUs actually registered.
///
/// NB: a failed registration frees the set (nvml-wrapper 0.13 does not hand it back), so the set
/// is rebuilt without the GPU that refused.
fn event_set(nvml: &'static Nvml, mut gpus: Vec<u32>) -> (Option<EventSet<'static>>, Vec<u32>) {
    'rebuild: while !gpus.is_empty() {
        let created = nvml.create_event_set().inspect_err(|e| {
            tracing::warn!(error = %e, "cannot create an NVML event set; XID events are not watched")
        });
        let Ok(mut set) = created else { return (None, Vec::new()) };
        for pos in 0..gpus.len() {
            let i = gpus[pos];
            let registered = nvml
                .device_by_index(i)
                .map_err(Into::into)
                .and_then(|d| d.register_events(EventTypes::CRITICAL_XID_ERROR, set));
            match registered {
                Ok(s) => set = s,
                Err(e) => {
                    tracing::warn!(gpu = i, error = %e, "cannot watch XID events on this GPU");
                    gpus.remove(pos);
                    continue 'rebuild;
                }
            }
        }
        return (Some(set), gpus);
    }
    (None, Vec::new())
}

impl GpuProbe for NvmlProbe {
    fn sample(&mut self) -> Result<Vec<GpuSample>, GpuError> {
        let count =
            self.nvml.device_count().map_err(|e| GpuError::Call(format!("listing GPUs: {e}")))?;
        Ok((0..count)
            .filter_map(|i| self.read(i, &readable(i, self.nvml.device_by_index(i))?))
            .collect())
    }

    fn wait_xids(&mut self, timeout: Duration) -> Result<Vec<XidEvent>, GpuError> {
        let Some(set) = &self.events else {
            std::thread::sleep(timeout);
            return Ok(Vec::new());
        };
        let deadline = Instant::now() + timeout;
        let mut xids = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(xids);
            }
            match set.wait(left.as_millis().clamp(1, u128::from(u32::MAX)) as u32) {
                Ok(ev) if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) => {}
                Ok(ev) => {
                    let Some(XidError::Value(xid)) = ev.event_data else {
                        tracing::debug!("critical XID event without an XID value");
                        continue;
                    };
                    let index = ev.device.index().unwrap_or(u32::MAX);
                    xids.push(XidEvent { index, uuid: ev.device.uuid().unwrap_or_default(), xid });
                }
                Err(NvmlError::Timeout) => return Ok(xids),
                Err(e) if xids.is_empty() => {
                    return Err(GpuError::Call(format!("waiting for XID events: {e}")))
                }
                // Do not lose what arrived before the error; the next wait reports it again.
                Err(_) => return Ok(xids),
            }
        }
    }
}

/// Loads NVML, one attempt, blocking: the seam of the monitor's start-up, so a test can fail it
/// N times and then hand over a fake probe.
pub type NvmlLoader = dyn FnMut() -> Result<Box<dyn GpuProbe>, GpuError> + Send;

/// Where to look for NVIDIA GPUs without the driver: `/dev` and `/sys/bus/pci/devices`.
#[derive(Debug, Clone, PartialEq, Eq, educe::Educe)]
#[educe(Default)]
pub struct HostPaths {
    #[educe(Default(expression = "/dev".into()))]
    pub dev: std::path::PathBuf,
    #[educe(Default(expression = "/sys/bus/pci/devices".into()))]
    pub pci_devices: std::path::PathBuf,
}

/// Whether this node has NVIDIA GPUs, asked of the host rather than the driver: a device file
/// `/dev/nvidiaN` (made when the driver loads), or a PCI function of NVIDIA's vendor id
/// (0x10de) whose class is a display or 3D controller (0x0300xx, 0x0302xx) — there before any
/// driver, which tells "no GPU here" from "GPUs, no driver yet" on a node whose driver
/// installer has not run. NVSwitches (class 0x0680) are not GPUs.
pub(crate) fn gpus_present(h: &HostPaths) -> bool {
    let nvidia_display = |addr: &String| {
        let raw = |f: &str| std::fs::read_to_string(h.pci_devices.join(addr).join(f));
        let read = |f: &str| raw(f).map(|s| s.trim().to_ascii_lowercase()).unwrap_or_default();
        read("vendor") == "0x10de" && matches!(read("class").get(..6), Some("0x0300" | "0x0302"))
    };
    names(&h.dev).is_ok_and(|files| files.iter().any(|f| numbered(f, "nvidia")))
        || names(&h.pci_devices).is_ok_and(|addrs| addrs.iter().any(nvidia_display))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_reason_names_are_stable() {
        assert!(throttle_names(ThrottleReasons::empty()).is_empty());
        assert!(throttle_names(ThrottleReasons::NONE).is_empty());
        assert_eq!(
            throttle_names(ThrottleReasons::all()),
            vec![
                "gpu-idle",
                "applications-clocks-setting",
                "sw-power-cap",
                "hw-slowdown",
                "sync-boost",
                "sw-thermal",
                "hw-thermal",
                "hw-power-brake",
                "display-clocks",
            ]
        );
        assert_eq!(
            throttle_names(ThrottleReasons::HW_SLOWDOWN | ThrottleReasons::SW_THERMAL_SLOWDOWN),
            vec!["hw-slowdown", "sw-thermal"]
        );
    }

    #[test]
    fn init_errors_map_to_what_an_operator_can_do() {
        assert!(matches!(init_error(NvmlError::DriverNotLoaded), GpuError::NoLibrary(_)));
        assert!(matches!(init_error(NvmlError::LibraryNotFound), GpuError::NoLibrary(_)));
        assert!(matches!(init_error(NvmlError::NoPermission), GpuError::NoPermission(_)));
        assert!(matches!(init_error(NvmlError::Unknown), GpuError::Call(_)));
        assert!(matches!(
            init_error(NvmlError::FailedToLoadSymbol("nvmlInit_v2".into())),
            GpuError::Call(_)
        ));
    }

    #[test]
    fn gpus_are_present_by_device_file_or_pci_function() {
        let dir = tempfile::tempdir().unwrap();
        let h = HostPaths { dev: dir.path().join("dev"), pci_devices: dir.path().join("pci") };
        assert!(!gpus_present(&h), "no directories at all");
        std::fs::create_dir_all(&h.dev).unwrap();
        for f in ["nvidiactl", "nvidia-uvm", "nvidia", "null"] {
            std::fs::write(h.dev.join(f), "").unwrap();
        }
        assert!(!gpus_present(&h), "control files are not GPUs");
        let pci = |name: &str, vendor: &str, class: &str| {
            let d = h.pci_devices.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
        };
        pci("0000:00:01.0", "0x8086", "0x030000");
        pci("0000:00:02.0", "0x10de", "0x068000");
        assert!(!gpus_present(&h), "an Intel VGA and an NVSwitch");
        pci("0000:00:04.0", "0x10de", "0x030200");
        assert!(gpus_present(&h), "an NVIDIA 3D controller, no driver yet");
        std::fs::remove_dir_all(&h.pci_devices).unwrap();
        std::fs::write(h.dev.join("nvidia3"), "").unwrap();
        assert!(gpus_present(&h), "a device file");
    }

    #[test]
    fn missing_library_is_no_library() {
        let err = NvmlProbe::new(Some("/nonexistent/vigil-test/libnvidia-ml.so.1")).unwrap_err();
        assert!(matches!(err, GpuError::NoLibrary(_)), "{err:?}");
        assert!(err.to_string().contains("GPU monitoring is off"));
    }
}
