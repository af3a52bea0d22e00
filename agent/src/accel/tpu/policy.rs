//! TPU decisions (pure): which kernel messages and PCIe error counters are device errors of a TPU
//! chip, the node's TPU verdict from the chips' device files against the Node's allocatable
//! `google.com/tpu` and the recent device errors, and the Vigil-owned Node fields for it.
//!
//! Facts this rests on (sources in docs/tpu.md): a TPU v4 (and older) chip is a character device
//! `/dev/accelN` of Google's `accel` class (char major 121); TPU v5e, v5p, v6e and TPU7x chips are
//! bound to `vfio-pci` and opened through their IOMMU group, `/dev/vfio/N`. Every chip is a PCI
//! function of vendor `0x1ae0` (Google). The kernel logs a device's messages through
//! `dev_printk`, which puts `SUBSYSTEM=` and `DEVICE=` (`+pci:<address>` for a PCI function,
//! `c<major>:<minor>` for a character device) on the record in `/dev/kmsg`; PCIe AER prints
//! `severity=Uncorrectable (Fatal)` (`Uncorrected (Fatal)` on older kernels) and counts every
//! error in `/sys/bus/pci/devices/<address>/aer_dev_{fatal,nonfatal,correctable}`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::accel::model::Health;
use crate::accel::policy::{verdict_condition, Accelerator, Names};
use crate::accel::tpu::model::{
    AerCounts, DeviceError, ErrorSeverity, KernelRecord, TpuChips, TpuHealth, TpuReading, TpuReport,
};
use crate::clock::ms;
use crate::vocab::node::{truncate, NodeCondition, TPU_CONDITION, TPU_FAILED_TAINT};
use crate::vocab::node_info::TPU_RESOURCE;

/// The character-device major of Google's `accel` class (TPU v4 and older).
pub(crate) const ACCEL_MAJOR: u32 = 121;
/// At most this many device errors are kept, the newest, so an error storm cannot grow the
/// monitor's memory without bound.
pub(crate) const MAX_ERRORS: usize = 256;

/// Whether `rec` is a device error of one of `chips`: the chip and how bad (`None` when the
/// record is about something else, or is not an error).
///
/// A record is about a chip when its dictionary names it (`DEVICE=+pci:<address>`, or
/// `SUBSYSTEM=accel` with `DEVICE=c121:<n>` for `accel<n>`), when its text starts with the
/// device's `dev_printk` prefix (`accel accel0: `), or when its text names a chip's PCI address
/// (a root port's AER message names the function that sent the error). It is fatal when it says
/// `(Fatal)` (AER's uncorrectable fatal severity), an error at log level `err` or worse or when it
/// says `(Non-Fatal)`; a warning (AER's correctable errors are warnings) is not a device error.
pub(crate) fn classify(rec: &KernelRecord, chips: &TpuChips) -> Option<(String, ErrorSeverity)> {
    let device = record_device(rec, chips)?;
    let t = &rec.text;
    let severity = if t.contains("Uncorrectable (Fatal)") || t.contains("Uncorrected (Fatal)") {
        ErrorSeverity::Fatal
    } else if rec.level <= 3 || t.contains("(Non-Fatal)") {
        ErrorSeverity::Error
    } else {
        return None;
    };
    Some((device, severity))
}

/// The chip `rec` is about, if any (see [`classify`]), looked for in this order: the PCI
/// function its dictionary names, the accel device it names, the device its text's prefix
/// names, a chip's PCI address in its text.
fn record_device(rec: &KernelRecord, chips: &TpuChips) -> Option<String> {
    let accel = |name: &str| chips.accel.iter().any(|a| a == name);
    let d = rec.device.as_deref().unwrap_or_default();
    let pci = d.strip_prefix("+pci:").filter(|addr| chips.pci.iter().any(|p| p == *addr));
    let on_accel = rec.subsystem.as_deref() == Some("accel");
    let minor = d.strip_prefix(&format!("c{ACCEL_MAJOR}:")).filter(|_| on_accel);
    let prefix = rec.text.strip_prefix("accel ").and_then(|rest| rest.split(':').next());
    pci.map(str::to_string)
        .or_else(|| minor.map(|n| format!("accel{n}")).filter(|name| accel(name)))
        .or_else(|| prefix.filter(|name| accel(name)).map(str::to_string))
        .or_else(|| chips.pci.iter().find(|addr| names_address(&rec.text, addr)).cloned())
}

/// Whether `text` names PCI address `addr` as a whole word (`0000:00:04.0` is not in
/// `0000:00:04.01`).
fn names_address(text: &str, addr: &str) -> bool {
    let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '.'));
    text.match_indices(addr).any(|(i, _)| {
        boundary(text[..i].chars().next_back()) && boundary(text[i + addr.len()..].chars().next())
    })
}

/// AER totals per TPU PCI function.
type AerTotals = BTreeMap<String, AerCounts>;

/// The device errors that the AER counters' rise from `prev` to `next` means, at `at_ms`. A
/// function seen for the first time is a baseline (errors from before the agent ran cannot be
/// dated); a counter that went down (the device was removed and probed again) is a new baseline.
pub(crate) fn aer_errors(prev: &AerTotals, next: &AerTotals, at_ms: i64) -> Vec<DeviceError> {
    let mut out = Vec::new();
    for (addr, n) in next {
        let Some(p) = prev.get(addr) else { continue };
        for (severity, before, now, what) in [
            (ErrorSeverity::Fatal, p.fatal, n.fatal, "fatal"),
            (ErrorSeverity::Error, p.nonfatal, n.nonfatal, "non-fatal"),
        ] {
            if now > before {
                let message = format!("{} uncorrectable {what} PCIe error(s) (AER)", now - before);
                let device = addr.clone();
                out.push(DeviceError { at_ms, severity, device, source: "aer", message });
            }
        }
    }
    out
}

/// Keep the errors within `window` of `now_ms` (and at most [`MAX_ERRORS`], the newest).
pub(crate) fn prune(errors: &mut Vec<DeviceError>, now_ms: i64, window: Duration) {
    errors.retain(|e| now_ms - e.at_ms < ms(window));
    errors.drain(..errors.len().saturating_sub(MAX_ERRORS));
}

/// The Node's allocatable `google.com/tpu` from its quantity string (`"4"`); `None` when it is
/// not a whole number (an extended resource always is).
pub fn allocatable_chips(quantity: &str) -> Option<u32> {
    quantity.trim().parse().ok()
}

/// The node's TPU verdict at `now_ms` (pure), with the device errors counted so far.
///
/// - Not a TPU node (no device file, and no `google.com/tpu` advertised): no verdict.
/// - Fewer device files than the Node's allocatable `google.com/tpu`: failed (a chip is gone:
///   a workload that asks for the host's chips cannot start).
/// - A fatal device error within `window`: failed.
/// - More device files than advertised (the device plugin withholds chips it finds unhealthy, or
///   has not registered them yet), or a device error within `window`: degraded.
///
/// The reasons carry no time, so that a report changes only when the facts do.
pub(crate) fn verdict(mem: &TpuMemory, now_ms: i64, window: Duration) -> TpuReport {
    let present = mem.device_files.len() as u32;
    let expected = mem.expected;
    if present == 0 && expected.unwrap_or(0) == 0 {
        return TpuReport { expected, errors_total: mem.errors_total, ..TpuReport::default() };
    }
    let mut health = TpuHealth::Healthy;
    let mut reasons = Vec::new();
    let mut worsen = |h: TpuHealth, reason: String| {
        health = health.max(h);
        reasons.push(reason);
    };
    // The chips with a device file against the chips the Node advertises, when they differ.
    let found = if present == 0 { "none".to_string() } else { mem.device_files.join(", ") };
    match expected {
        Some(n) if present < n => worsen(
            TpuHealth::Failed,
            format!("{present} of {n} TPU chips have a device file (found: {found})"),
        ),
        Some(n) if present > n => worsen(
            TpuHealth::Degraded,
            format!(
                "{present} TPU chips have a device file but the Node advertises {n} \
                 {TPU_RESOURCE}: the device plugin withholds the others (unhealthy, or not yet \
                 registered)"
            ),
        ),
        _ => {}
    }
    let by_chip = recent_by_chip(&mem.errors, now_ms, window);
    let recent = |s| by_chip.iter().filter(|(k, _)| k.1 == s).map(|(_, n)| n.0).sum();
    let recent_errors = (recent(ErrorSeverity::Error), recent(ErrorSeverity::Fatal));
    let within = humantime::format_duration(window);
    for ((device, severity), (count, last)) in by_chip.into_iter().rev() {
        let h = match severity {
            ErrorSeverity::Fatal => TpuHealth::Failed,
            ErrorSeverity::Error => TpuHealth::Degraded,
        };
        let (what, source, said) = (severity.as_str(), last.source, truncate(&last.message, 200));
        let why = format!(
            "{count} {what} device error(s) on {device} within {within} (last, {source}: {said})"
        );
        worsen(h, why);
    }
    TpuReport {
        monitoring: true,
        present,
        expected,
        devices: mem.device_files.clone(),
        health,
        reasons,
        recent_errors,
        errors_total: mem.errors_total,
    }
}

/// Device errors per chip and severity: how many and the last one.
type ByChip<'a> = BTreeMap<(&'a str, ErrorSeverity), (u32, &'a DeviceError)>;

/// The errors within `window` of `now_ms`, per chip and severity.
fn recent_by_chip(errors: &[DeviceError], now_ms: i64, window: Duration) -> ByChip<'_> {
    let mut by_chip = ByChip::new();
    for e in errors.iter().filter(|e| now_ms - e.at_ms < ms(window)) {
        let slot = by_chip.entry((e.device.as_str(), e.severity)).or_insert((0, e));
        slot.0 += 1;
        if e.at_ms >= slot.1.at_ms {
            slot.1 = e;
        }
    }
    by_chip
}

/// What the monitor remembers between readings: the chips as last read and the device errors
/// kept, which [`verdict`] judges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TpuMemory {
    /// AER totals of the last reading: the baseline of the next.
    aer: AerTotals,
    /// The chips' device files found, relative to the device directory and sorted:
    /// `accel0`, … (TPU v4 and older) or `vfio/0`, … (TPU v5e, v5p, v6e, TPU7x).
    device_files: Vec<String>,
    /// The chips the Node advertises: its allocatable `google.com/tpu`; `None` while unknown.
    expected: Option<u32>,
    /// Device errors seen so far, within `tpu.error_window` (at most [`MAX_ERRORS`]).
    errors: Vec<DeviceError>,
    /// Device errors counted so far: (error, fatal).
    errors_total: (u64, u64),
}

/// Fold one reading taken at `now_ms` into `mem` and return the verdict (pure): the kernel
/// records that are device errors of a chip (dated by their age, else `now_ms`), the AER
/// counters' rise, the device files and the Node's allocatable `google.com/tpu` (`expected`).
/// An error already older than `window` (a record from long before the agent started) is
/// neither kept nor counted.
pub(crate) fn fold(
    mem: &mut TpuMemory,
    reading: &TpuReading,
    expected: Option<u32>,
    now_ms: i64,
    window: Duration,
) -> TpuReport {
    let mut new = aer_errors(&mem.aer, &reading.aer, now_ms);
    mem.aer = reading.aer.clone();
    for (rec, age) in &reading.records {
        if let Some((device, severity)) = classify(rec, &reading.chips) {
            let (at_ms, message) = (now_ms - age.unwrap_or(0), rec.text.clone());
            new.push(DeviceError { at_ms, severity, device, source: "kernel-log", message });
        }
    }
    new.retain(|e| now_ms - e.at_ms < ms(window));
    let count = |s: ErrorSeverity| new.iter().filter(|e| e.severity == s).count() as u64;
    mem.errors_total.0 += count(ErrorSeverity::Error);
    mem.errors_total.1 += count(ErrorSeverity::Fatal);
    mem.errors.extend(new);
    mem.errors.sort_by_key(|e| e.at_ms);
    prune(&mut mem.errors, now_ms, window);
    (mem.device_files, mem.expected) = (reading.device_files.clone(), expected);
    verdict(mem, now_ms, window)
}

/// The TPU's row of the accelerators' table.
pub static TPU: Names = Names {
    label: "tpu-health",
    taint: TPU_FAILED_TAINT,
    condition: TPU_CONDITION,
    events: ["VigilTpuHealthy", "VigilTpuDegraded", "VigilTpuFailed"],
};

impl Accelerator for TpuReport {
    const NAMES: &'static Names = &TPU;
    fn monitoring(&self) -> bool {
        self.monitoring
    }
    fn health(&self) -> Health {
        self.health
    }
    fn reasons(&self) -> &[String] {
        &self.reasons
    }
    fn reasons_mut(&mut self) -> &mut Vec<String> {
        &mut self.reasons
    }
    /// `VigilTPUUnhealthy`: True when the chips failed, False when healthy or degraded (still
    /// usable; the reason and the summary say why); `None` (the condition is removed) when this
    /// is not a TPU node or TPU monitoring is off.
    fn condition(&self) -> Option<NodeCondition> {
        self.monitoring.then(|| verdict_condition(&TPU, self.health, &self.summary()))
    }
    fn differs(&self, o: &Self) -> bool {
        let headline = |r: &Self| (r.monitoring, r.health, r.present, r.expected);
        headline(self) != headline(o)
    }
    fn detail(&self, prev: &Self) -> String {
        format!("{} (was {})", self.summary(), prev.shown().map_or("unknown", Health::as_str))
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
