//! TPU data: what the TPU source reads (the chips' device files, the device errors the kernel
//! reported) and what Vigil concludes (the node's TPU report). The rules that turn one into the
//! other are in `crate::accel::tpu::policy`; docs/tpu.md says where each fact comes from.

use std::collections::BTreeMap;
use strum::{IntoStaticStr, VariantArray};

/// Health of the node's TPU chips: the accelerators' one scale (degraded: a recoverable device
/// error, more chips present than the device plugin advertises; failed: a chip is gone or
/// reported a fatal error, so the node cannot run a full-host TPU workload).
pub type TpuHealth = crate::accel::model::Health;

/// How bad one device error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum ErrorSeverity {
    /// An error the kernel logged about the chip (log level `err` or worse), or an uncorrectable
    /// non-fatal PCIe error: the chip may have recovered.
    Error,
    /// An uncorrectable fatal PCIe error (AER): the link or the device needs a reset.
    Fatal,
}

as_str!(pub ErrorSeverity);

/// One device error about a TPU chip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceError {
    /// When, on the monitor's monotonic ms clock (`crate::accel::clock_ms`).
    pub(crate) at_ms: i64,
    pub(crate) severity: ErrorSeverity,
    /// The chip it is about: its PCI address (`0000:00:04.0`) or accel device (`accel0`).
    pub(crate) device: String,
    /// `kernel-log` (a kernel message) or `aer` (a PCIe AER counter in sysfs went up).
    pub(crate) source: &'static str,
    /// The kernel's words, for the reasons (cut to a line).
    pub(crate) message: String,
}

/// The node's TPU chips as the PCI bus and the device directory show them: whose kernel
/// messages are device errors of a TPU chip.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TpuChips {
    /// PCI addresses of the TPU functions (`0000:00:04.0`).
    pub(crate) pci: Vec<String>,
    /// Names of the accel devices (`accel0`), from the device files.
    pub(crate) accel: Vec<String>,
}

/// One record of the kernel log, as `/dev/kmsg` gives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KernelRecord {
    /// The syslog level (0 = emerg … 3 = err, 4 = warning … 7 = debug).
    pub(crate) level: u8,
    /// Microseconds since boot, the kernel's timestamp.
    pub(crate) ts_us: u64,
    pub(crate) text: String,
    /// `SUBSYSTEM=` of the record's dictionary (`pci`, `accel`, …).
    pub(crate) subsystem: Option<String>,
    /// `DEVICE=` of the record's dictionary (`+pci:0000:00:04.0`, `c121:0`, …).
    pub(crate) device: Option<String>,
}

/// A PCI function's AER counters (`TOTAL_ERR_FATAL`, `TOTAL_ERR_NONFATAL` of sysfs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AerCounts {
    pub(crate) fatal: u64,
    pub(crate) nonfatal: u64,
}

/// One reading of the chips by the TPU source (`crate::accel::tpu::chips`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TpuReading {
    /// Device files found, sorted: `accel0`, `vfio/0`, ….
    pub(crate) device_files: Vec<String>,
    /// The TPU PCI functions and the accel devices.
    pub(crate) chips: TpuChips,
    /// AER totals per TPU PCI function that has them.
    pub(crate) aer: BTreeMap<String, AerCounts>,
    /// Kernel log records since the last reading, each with its age in ms when the kernel's
    /// clock was readable, else `None` (it just arrived).
    pub(crate) records: Vec<(KernelRecord, Option<i64>)>,
}

/// The TPU verdict of this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TpuReport {
    /// The monitor runs and this is a TPU node (chips found, or `google.com/tpu` advertised).
    /// `false`: no verdict at all, and Vigil's TPU label and condition are taken off the Node.
    pub monitoring: bool,
    /// Chips whose device file is present.
    pub present: u32,
    /// The Node's allocatable `google.com/tpu`, when known.
    pub expected: Option<u32>,
    /// The device files found, sorted: `accel0`, … (TPU v4 and older) or `vfio/0`, … (TPU v5e,
    /// v5p, v6e, TPU7x).
    pub devices: Vec<String>,
    pub health: TpuHealth,
    /// Why the chips are not healthy, one line per cause, for operators.
    pub reasons: Vec<String>,
    /// Device errors within `tpu.error_window`, by severity: (error, fatal).
    pub recent_errors: (u32, u32),
    /// Device errors seen since the monitor started, by severity: (error, fatal).
    pub errors_total: (u64, u64),
}

impl TpuReport {
    /// One line for the condition's message and the trail: the count and the reasons.
    pub fn summary(&self) -> String {
        let expected = self.expected.map_or("unknown".to_string(), |n| n.to_string());
        let (health, present) = (self.health.as_str(), self.present);
        let head = format!(
            "TPU health {health}: {present} chip(s) present, allocatable google.com/tpu {expected}"
        );
        [vec![head], self.reasons.clone()].concat().join("; ")
    }
}
