//! `[gpu]`: the NVML monitor, and which XIDs mean broken hardware, an application's fault, or
//! evidence for a hang.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, ConfigError, Switch};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuConfig {
    /// `auto` (load NVML; off, said once, when there is no driver), `on`, or `off`.
    pub enabled: Switch,
    /// Path of `libnvidia-ml.so`; empty = the loader's search path.
    pub library_path: String,
    /// How often every GPU is read (XID events are waited for continuously).
    #[serde(with = "humantime_serde")]
    pub sample_interval: Duration,
    /// XIDs that mean the hardware is broken: the GPU is `failed`.
    pub hardware_xids: Vec<u64>,
    /// XIDs caused by the application: recorded, never a hardware verdict.
    pub application_xids: Vec<u64>,
    /// XIDs attached to a hang alert of a worker on that GPU, as evidence.
    pub evidence_xids: Vec<u64>,
    /// How far back an evidence XID is attached to a hang alert.
    #[serde(with = "humantime_serde")]
    pub evidence_window: Duration,
    /// Put a `NoSchedule` taint on the Node while a GPU has failed.
    pub taint_on_failure: bool,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: Switch::Auto,
            library_path: String::new(),
            sample_interval: Duration::from_secs(15),
            hardware_xids: vec![48, 63, 64, 74, 79, 92, 94, 95],
            application_xids: vec![13, 31, 43, 45, 68, 109],
            evidence_xids: vec![43, 109],
            evidence_window: Duration::from_secs(30 * 60),
            taint_on_failure: false,
        }
    }
}

impl GpuConfig {
    /// A sampling interval of at least a second; no XID both the hardware's and the application's.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.sample_interval < Duration::from_secs(1) {
            return bad("gpu.sample_interval", "must be at least 1s");
        }
        if let Some(x) = self
            .hardware_xids
            .iter()
            .find(|x| self.application_xids.contains(x))
        {
            return bad(
                "gpu.hardware_xids",
                format!("XID {x} is also in gpu.application_xids; it must be one or the other"),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_names_keys;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[gpu]\nenabled = \"maybe\"", "gpu.enabled"),
            ("[gpu]\nsample_interval = \"500ms\"", "gpu.sample_interval"),
            (
                "[gpu]\nhardware_xids = [79]\napplication_xids = [79]",
                "gpu.hardware_xids",
            ),
        ]);
    }
}
