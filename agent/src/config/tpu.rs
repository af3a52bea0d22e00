//! `[tpu]`: the TPU monitor — where the chips' device files, the PCI devices and the kernel log
//! are read, how often, and how long a device error counts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{at_least_a_second, bad_if, ConfigError, Switch};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct TpuConfig {
    /// `auto` (a verdict on nodes that have TPU chips, none elsewhere), `on` (the same, and a
    /// missing device directory is an error in the log), or `off`.
    #[educe(Default(expression = Switch::Auto))]
    pub(crate) enabled: Switch,
    /// Where the chips' device files are: `accelN` (TPU v4) and `vfio/N` (TPU v5e and later).
    #[educe(Default(expression = "/dev".into()))]
    pub(crate) device_dir: String,
    /// The sysfs root: TPU PCI functions and their AER counters (`bus/pci/devices/*`).
    #[educe(Default(expression = "/sys".into()))]
    pub(crate) sys_dir: String,
    /// The kernel log, read as `/dev/kmsg` records (a file of such lines in tests); empty = off.
    #[educe(Default(expression = "/dev/kmsg".into()))]
    pub(crate) kernel_log: String,
    /// How often the chips are read.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(10)))]
    pub sample_interval: Duration,
    /// How long a device error keeps the chips degraded (or failed, for a fatal one).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(10 * 60)))]
    pub(crate) error_window: Duration,
    /// Put a `NoSchedule` taint on the Node while the TPU chips have failed.
    pub taint_on_failure: bool,
}

impl TpuConfig {
    /// Absolute paths; a sampling interval of at least a second; a window of at least one
    /// interval (an error must be seen by one sample at least).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, dir) in [("tpu.device_dir", &self.device_dir), ("tpu.sys_dir", &self.sys_dir)] {
            bad_if(!dir.starts_with('/'), key, "must be an absolute path")?;
        }
        let relative = !self.kernel_log.is_empty() && !self.kernel_log.starts_with('/');
        bad_if(relative, "tpu.kernel_log", "must be an absolute path, or empty for off")?;
        at_least_a_second("tpu.sample_interval", self.sample_interval)?;
        let why = "must be at least tpu.sample_interval";
        bad_if(self.error_window < self.sample_interval, "tpu.error_window", why)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, parse};
    use super::*;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[tpu]\nenabled = \"maybe\"", "tpu.enabled"),
            ("[tpu]\ndevice_dir = \"dev\"", "tpu.device_dir"),
            ("[tpu]\nsys_dir = \"\"", "tpu.sys_dir"),
            ("[tpu]\nkernel_log = \"kmsg\"", "tpu.kernel_log"),
            ("[tpu]\nsample_interval = \"500ms\"", "tpu.sample_interval"),
            ("[tpu]\nsample_interval = \"30s\"\nerror_window = \"10s\"", "tpu.error_window"),
            ("[tpu]\nfoo = 1", "tpu.foo"),
        ]);
    }

    #[test]
    fn a_section_parses_and_the_kernel_log_may_be_off() {
        let c = parse(
            "[tpu]\nenabled = \"on\"\ndevice_dir = \"/host/dev\"\nkernel_log = \"\"\n\
             error_window = \"1h\"\ntaint_on_failure = true\n",
        )
        .expect("valid");
        assert_eq!(c.tpu.enabled, Switch::On);
        assert_eq!(c.tpu.device_dir, "/host/dev");
        assert_eq!(c.tpu.kernel_log, "");
        assert_eq!(c.tpu.error_window, Duration::from_secs(3600));
        assert!(c.tpu.taint_on_failure);
        assert_eq!(TpuConfig::default().sys_dir, "/sys");
    }
}
