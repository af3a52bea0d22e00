//! Accelerators: GPU and TPU health, one path for every kind.
//!
//! `model` is the one health scale, `policy` the [`policy::Accelerator`] trait each kind
//! implements (health, reasons, the Node's desired fields: a row of `policy::Names`), `tracker`
//! the one generic tracker that publishes a kind's health, `clock_ms` the monitors' clock. Each
//! kind is a folder: its data (`model`), its pure rules (`policy*`), its monitor loop
//! (`monitor`), the adapter that reads the hardware (`gpu::nvml`, `tpu::chips`; [`names`] and
//! [`numbered`] list the device files both look for) and how the tracker publishes it
//! (`tracked`: its alert, trail code and metric series). A third kind is one such folder and a
//! row.

pub mod gpu;
pub mod model;
pub mod policy;
pub mod tpu;
pub(crate) mod tracker;

/// The accelerator monitors' clock: monotonic milliseconds since the first call in this process.
/// The `now_ms` of every GPU and TPU report the monitors compute; pass it to
/// [`crate::accel::gpu::policy::evidence`].
// NB: real monotonic time on purpose: the monitors run on their own threads and loops, outside
// the coordinator's clock.
#[allow(clippy::disallowed_types)]
pub fn clock_ms() -> i64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_millis().min(i64::MAX as u128) as i64
}

/// The names in `dir` (those that are not UTF-8 left out).
pub(crate) fn names(dir: &std::path::Path) -> std::io::Result<Vec<String>> {
    Ok(std::fs::read_dir(dir)?.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
}

/// `name` is `prefix` then a number (`nvidia0`, `accel3`; `12` for an empty prefix).
pub(crate) fn numbered(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}
