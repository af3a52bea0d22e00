//! TPU chips as the node's kernel shows them, read from files so that tests plug in a fake tree.
//!
//! Map: [`FsProbe`] is the one blocking adapter (one reading of the chips), over a device
//! directory, a sysfs root, the kernel log and an uptime file, each path configurable (`[tpu]`).
//! The TPU monitor (`crate::accel::tpu::monitor`) runs it on a dedicated thread; what the readings
//! mean is decided in `crate::accel::tpu::policy`.
//!
//! Facts this module relies on (sources in docs/tpu.md):
//! - device files: `accel<N>` in the device directory (Google's `accel` class, TPU v4 and older)
//!   and `vfio/<group>` (TPU v5e, v5p, v6e, TPU7x, bound to `vfio-pci`); `vfio/vfio` is VFIO's
//!   container node, not a chip;
//! - a TPU is a PCI function of vendor `0x1ae0` whose `device` is one of [`TPU_DEVICE_IDS`];
//!   its AER counters are `aer_dev_fatal` / `aer_dev_nonfatal` (Linux ≥ 4.19), whose
//!   `TOTAL_ERR_FATAL` / `TOTAL_ERR_NONFATAL` lines carry the totals;
//! - `/dev/kmsg`: each `read()` returns one record, `<prio>,<seq>,<µs since boot>,<flags>;<text>`
//!   then ` KEY=value` dictionary lines (`SUBSYSTEM=`, `DEVICE=`); the first read after `open()`
//!   returns the oldest record still in the buffer, `EAGAIN` (non-blocking) means none is left,
//!   `EPIPE` means records were overwritten before they were read (reading goes on), and
//!   `SEEK_END` skips to after the last record. A regular file of such lines reads the same way,
//!   which is how the tests feed it;
//! - `/proc/uptime`: seconds since boot, the clock of the kernel log's timestamps.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::accel::tpu::model::{AerCounts, KernelRecord, TpuChips, TpuReading};
use crate::accel::{names, numbered};

/// Google's PCI vendor id.
pub(crate) const GOOGLE_VENDOR: &str = "0x1ae0";
/// PCI device ids of TPU chips: v2/v3, v4, v5p, v5e, v6e, TPU7x (Google's `tpu-info` and JAX's
/// `hardware_utils.py` list the same).
pub(crate) const TPU_DEVICE_IDS: [&str; 6] =
    ["0x0027", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"];

/// Why the chips could not be read.
// NB: a field named `source` is the error's source (`Error::source`): thiserror reads the name.
#[derive(Debug, thiserror::Error)]
pub enum TpuError {
    #[error("cannot read the device directory {path}: {source} (tpu.device_dir; on Kubernetes the host's /dev is mounted there by the tpu overlay)")]
    DeviceDir { path: String, source: std::io::Error },
    #[error("cannot read the kernel log {path}: {source} (tpu.kernel_log; /dev/kmsg needs CAP_SYSLOG where kernel.dmesg_restrict is set, and access to the device in a container; set it empty to turn it off)")]
    KernelLog { path: String, source: std::io::Error },
}

/// The source of TPU readings, over files. Blocking: called from a dedicated thread, never the
/// executor.
pub struct FsProbe {
    device_dir: PathBuf,
    sys_dir: PathBuf,
    uptime: PathBuf,
    /// The kernel log's path until it is opened (or failed to open).
    log_path: Option<PathBuf>,
    log: Option<KernelLog>,
    log_error: Option<TpuError>,
}

impl FsProbe {
    /// Over `device_dir`, `sys_dir` and, unless `None`, the kernel log at `kernel_log`; the
    /// kernel's clock from `uptime` (`/proc/uptime`).
    ///
    /// NB: the kernel log is opened at the first reading that finds a TPU chip (a device file
    /// or a TPU PCI function), not before: a node without TPUs never opens `/dev/kmsg`, and says
    /// nothing about it. One that cannot be opened is kept for `FsProbe::kernel_log_error`
    /// and the probe runs without it.
    pub fn new(
        device_dir: impl Into<PathBuf>,
        sys_dir: impl Into<PathBuf>,
        kernel_log: Option<&Path>,
        uptime: impl Into<PathBuf>,
    ) -> FsProbe {
        let (device_dir, sys_dir, uptime) = (device_dir.into(), sys_dir.into(), uptime.into());
        let log_path = kernel_log.map(Path::to_path_buf);
        FsProbe { device_dir, sys_dir, uptime, log_path, log: None, log_error: None }
    }

    /// Open the kernel log, once.
    fn open_log(&mut self) {
        let Some(p) = self.log_path.take() else { return };
        // Without the kernel's clock the old records cannot be dated: skip them.
        let skip_backlog = uptime_ms(&self.uptime).is_none();
        let path = p.display().to_string();
        match KernelLog::open(&p, skip_backlog) {
            Ok(log) => self.log = Some(log),
            Err(source) => self.log_error = Some(TpuError::KernelLog { path, source }),
        }
    }

    /// The kernel records since the last call, each with its age when the kernel's clock is
    /// readable. A log that fails is said once and closed.
    fn records(&mut self) -> Vec<(KernelRecord, Option<i64>)> {
        let Some(log) = &mut self.log else { return Vec::new() };
        let now = uptime_ms(&self.uptime);
        match log.drain() {
            Ok(rs) => rs
                .into_iter()
                .map(|r| {
                    let age = now.map(|n| (n - (r.ts_us / 1000) as i64).max(0));
                    (r, age)
                })
                .collect(),
            Err(source) => {
                self.log_error = Some(TpuError::KernelLog { path: log.path.clone(), source });
                self.log = None;
                Vec::new()
            }
        }
    }

    /// Read the chips now. A kernel log that cannot be read is said in the error of
    /// [`FsProbe::kernel_log_error`], not here: the device files still make a verdict.
    pub(crate) fn read(&mut self) -> Result<TpuReading, TpuError> {
        let device_files = device_files(&self.device_dir)?;
        let (pci, aer) = tpu_functions(&self.sys_dir);
        if !device_files.is_empty() || !pci.is_empty() {
            self.open_log();
        }
        let accel = device_files.iter().filter(|f| f.starts_with("accel")).cloned().collect();
        let records = self.records();
        Ok(TpuReading { device_files, chips: TpuChips { pci, accel }, aer, records })
    }

    /// Why the kernel log is not read (taken: said once).
    pub(crate) fn kernel_log_error(&mut self) -> Option<TpuError> {
        self.log_error.take()
    }
}

/// The chips' device files under `dir`, sorted: `accel<N>` and `vfio/<N>`.
pub(crate) fn device_files(dir: &Path) -> Result<Vec<String>, TpuError> {
    let path = dir.display().to_string();
    let listed = names(dir).map_err(|source| TpuError::DeviceDir { path, source })?;
    let mut out: Vec<String> = listed.into_iter().filter(|n| numbered(n, "accel")).collect();
    // No vfio directory: no VFIO-bound chip (TPU v4), not an error.
    let vfio = names(&dir.join("vfio")).unwrap_or_default();
    out.extend(vfio.into_iter().filter(|n| numbered(n, "")).map(|n| format!("vfio/{n}")));
    out.sort_by_key(|n| {
        let digits = n.trim_start_matches(|c: char| !c.is_ascii_digit());
        (n.starts_with("vfio"), digits.parse::<u64>().unwrap_or(u64::MAX))
    });
    Ok(out)
}

/// The TPU PCI functions under `<sys>/bus/pci/devices` (sorted) and their AER totals. An
/// unreadable sysfs is no function (a fake tree, or a kernel without PCI): the device files
/// still make a verdict.
pub(crate) fn tpu_functions(sys: &Path) -> (Vec<String>, BTreeMap<String, AerCounts>) {
    let root = sys.join("bus/pci/devices");
    let read = |addr: &str, file: &str| std::fs::read_to_string(root.join(addr).join(file)).ok();
    let is_tpu = |a: &String| {
        read(a, "vendor").is_some_and(|v| v.trim() == GOOGLE_VENDOR)
            && read(a, "device").is_some_and(|d| TPU_DEVICE_IDS.contains(&d.trim()))
    };
    let mut pci = names(&root).unwrap_or_default();
    pci.retain(is_tpu);
    pci.sort();
    let counts = pci.iter().filter_map(|addr| {
        let total = |file: &str, key: &str| read(addr, file).and_then(|t| aer_total(&t, key));
        let fatal = total("aer_dev_fatal", "TOTAL_ERR_FATAL");
        let nonfatal = total("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL");
        Some((addr.clone(), AerCounts { fatal: fatal?, nonfatal: nonfatal? }))
    });
    let aer = counts.collect();
    (pci, aer)
}

/// The `<key> <n>` line of an AER statistics file.
fn aer_total(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Milliseconds since boot from `/proc/uptime` (`<seconds> <idle seconds>`).
fn uptime_ms(path: &Path) -> Option<i64> {
    let secs: f64 = std::fs::read_to_string(path).ok()?.split_whitespace().next()?.parse().ok()?;
    Some((secs * 1000.0) as i64)
}

/// The kernel log, read without blocking.
struct KernelLog {
    path: String,
    file: File,
    /// Bytes after the last newline, for the next read (a file written in pieces).
    partial: Vec<u8>,
}

impl KernelLog {
    fn open(path: &Path, skip_backlog: bool) -> std::io::Result<KernelLog> {
        let mut file =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
        if skip_backlog {
            file.seek(SeekFrom::End(0))?;
        }
        Ok(KernelLog { path: path.display().to_string(), file, partial: Vec::new() })
    }

    /// Every record written since the last call.
    fn drain(&mut self) -> std::io::Result<Vec<KernelRecord>> {
        // A `/dev/kmsg` record is at most 8 KiB with its dictionary; a read into a smaller
        // buffer fails (EINVAL).
        let mut buf = vec![0u8; 16 * 1024];
        let mut bytes = std::mem::take(&mut self.partial);
        loop {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // Records were overwritten before we read them: the next read goes on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) => return Err(e),
            }
        }
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        self.partial = bytes.split_off(complete);
        Ok(parse_records(&String::from_utf8_lossy(&bytes)))
    }
}

/// `/dev/kmsg` records from their text: a header line, then its ` KEY=value` lines.
pub(crate) fn parse_records(text: &str) -> Vec<KernelRecord> {
    let mut out: Vec<KernelRecord> = Vec::new();
    for line in text.lines() {
        if let Some(kv) = line.strip_prefix(' ') {
            let Some(last) = out.last_mut() else { continue };
            match kv.split_once('=') {
                Some(("SUBSYSTEM", v)) => last.subsystem = Some(v.to_string()),
                Some(("DEVICE", v)) => last.device = Some(v.to_string()),
                _ => {}
            }
        } else if let Some(r) = parse_header(line) {
            out.push(r);
        }
    }
    out
}

/// `<prio>,<seq>,<µs>,<flags>[,…];<text>`; `None` for a line that is not one.
fn parse_header(line: &str) -> Option<KernelRecord> {
    let (prefix, text) = line.split_once(';')?;
    let mut fields = prefix.split(',');
    let prio: u32 = fields.next()?.parse().ok()?;
    let _seq: u64 = fields.next()?.parse().ok()?;
    let ts_us: u64 = fields.next()?.parse().ok()?;
    let level = (prio & 7) as u8;
    // The dictionary (`SUBSYSTEM=`, `DEVICE=`) follows on lines of its own.
    Some(KernelRecord { level, ts_us, text: text.to_string(), ..KernelRecord::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn records_parse_with_their_dictionary() {
        let text = "3,812,5000123,-;vfio-pci 0000:00:04.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal)\n \
                    SUBSYSTEM=pci\n DEVICE=+pci:0000:00:04.0\n\
                    6,813,5000200,-,caller=T1;eth0: link up\n\
                    not a record\n \
                    ORPHAN=1\n\
                    14,814,1,c;user facility, info\n";
        let rs = parse_records(text);
        assert_eq!(rs.len(), 3, "{rs:?}");
        assert_eq!(rs[0].level, 3);
        assert_eq!(rs[0].ts_us, 5_000_123);
        assert_eq!(rs[0].subsystem.as_deref(), Some("pci"));
        assert_eq!(rs[0].device.as_deref(), Some("+pci:0000:00:04.0"));
        assert!(rs[0].text.ends_with("severity=Uncorrectable (Fatal)"));
        assert_eq!((rs[1].level, rs[1].device.as_deref()), (6, None));
        assert_eq!(rs[2].level, 6, "facility bits are not the level");
    }

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "").unwrap();
    }

    #[test]
    fn device_files_are_accel_and_vfio_groups_only() {
        let d = tempfile::tempdir().unwrap();
        for f in ["accel10", "accel2", "accel", "accelx", "vfio/vfio", "vfio/3", "vfio/12", "null"]
        {
            touch(&d.path().join(f));
        }
        assert_eq!(device_files(d.path()).unwrap(), ["accel2", "accel10", "vfio/3", "vfio/12"]);
        assert!(device_files(&d.path().join("absent")).is_err());
    }

    #[test]
    fn pci_functions_are_googles_tpus_with_their_aer_totals() {
        let d = tempfile::tempdir().unwrap();
        let dev = |addr: &str, vendor: &str, device: &str| {
            let p = d.path().join("bus/pci/devices").join(addr);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(p.join("device"), format!("{device}\n")).unwrap();
            p
        };
        let tpu = dev("0000:00:05.0", "0x1ae0", "0x0063");
        std::fs::write(tpu.join("aer_dev_fatal"), "Undefined 0\nDLP 0\nTOTAL_ERR_FATAL 2\n")
            .unwrap();
        std::fs::write(tpu.join("aer_dev_nonfatal"), "Undefined 0\nTOTAL_ERR_NONFATAL 7\n")
            .unwrap();
        dev("0000:00:04.0", "0x1ae0", "0x005e"); // a TPU without AER statistics
        dev("0000:00:03.0", "0x1ae0", "0x0001"); // Google, not a TPU (gVNIC)
        dev("0000:00:06.0", "0x10de", "0x0063"); // another vendor
        let (pci, aer) = tpu_functions(d.path());
        assert_eq!(pci, ["0000:00:04.0", "0000:00:05.0"]);
        assert_eq!(
            aer,
            BTreeMap::from([("0000:00:05.0".to_string(), AerCounts { fatal: 2, nonfatal: 7 })])
        );
        assert_eq!(tpu_functions(&d.path().join("none")), (vec![], BTreeMap::new()));
    }

    #[test]
    fn the_log_is_read_as_it_grows_and_a_partial_line_waits() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("kmsg");
        let uptime = d.path().join("uptime");
        std::fs::write(&log, "3,1,1000000,-;accel accel0: old error\n").unwrap();
        std::fs::write(&uptime, "61.00 100.00\n").unwrap();
        touch(&d.path().join("dev/accel0"));
        let mut p = FsProbe::new(d.path().join("dev"), d.path(), Some(&log), &uptime);
        let r = p.read().unwrap();
        assert!(p.kernel_log_error().is_none());
        // The backlog, dated by the kernel's clock: 60 s old.
        assert_eq!(r.records.len(), 1);
        assert_eq!(r.records[0].1, Some(60_000));
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"3,2,61000000,-;accel accel0: new").unwrap();
        assert!(p.read().unwrap().records.is_empty(), "half a line waits");
        f.write_all(b" error\n SUBSYSTEM=accel\n DEVICE=c121:0\n").unwrap();
        let r = p.read().unwrap();
        assert_eq!(r.records.len(), 1);
        assert_eq!(r.records[0].0.text, "accel accel0: new error");
        assert_eq!(r.records[0].0.device.as_deref(), Some("c121:0"));
        assert_eq!(r.records[0].1, Some(0));
    }

    #[test]
    fn without_the_kernels_clock_the_backlog_is_skipped() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("kmsg");
        std::fs::write(&log, "3,1,1000000,-;accel accel0: old error\n").unwrap();
        touch(&d.path().join("dev/vfio/0"));
        let mut p = FsProbe::new(d.path().join("dev"), d.path(), Some(&log), d.path().join("no"));
        assert!(p.read().unwrap().records.is_empty());
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap()
            .write_all(b"3,2,2000000,-;accel accel0: new error\n")
            .unwrap();
        let r = p.read().unwrap();
        assert_eq!(r.records.len(), 1);
        assert_eq!(r.records[0].1, None, "undated: just arrived");
    }

    #[test]
    fn a_missing_kernel_log_is_said_once_and_only_on_a_tpu_node() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("dev")).unwrap();
        let missing = d.path().join("kmsg");
        let mut p = FsProbe::new(d.path().join("dev"), d.path(), Some(&missing), "/proc/uptime");
        assert!(p.read().unwrap().device_files.is_empty());
        assert!(p.kernel_log_error().is_none(), "no TPU: the log is not opened");
        touch(&d.path().join("dev/accel0"));
        assert_eq!(p.read().unwrap().device_files, ["accel0"]);
        let e = p.kernel_log_error().expect("said");
        assert!(e.to_string().contains("tpu.kernel_log"), "{e}");
        assert_eq!(p.read().unwrap().device_files, ["accel0"], "the rest still reads");
        assert!(p.kernel_log_error().is_none(), "said once");
        let mut p = FsProbe::new(d.path().join("nodev"), d.path(), None, "/proc/uptime");
        assert!(matches!(p.read(), Err(TpuError::DeviceDir { .. })));
    }
}
