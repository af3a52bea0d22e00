//! `[gpu]`: the NVML monitor, what each XID calls for (NVIDIA's table in `crate::policy::xid`,
//! overridable per XID), which XIDs are evidence for a hang, and where a GPU's failure is kept
//! across agent restarts.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, ConfigError, Switch};
use crate::model::gpu::XidAction;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuConfig {
    /// `auto` (load NVML; when the node has GPUs but no driver yet, keep trying), `on`, `off`.
    pub enabled: Switch,
    /// Path of `libnvidia-ml.so`; empty = the loader's search path.
    pub library_path: String,
    /// How often every GPU is read (XID events are waited for continuously).
    #[serde(with = "humantime_serde")]
    pub sample_interval: Duration,
    /// Per-XID overrides of NVIDIA's immediate action (`"79" = "reboot-node"`); the rest follow
    /// the built-in table (`vigil policy gpu`).
    pub xid_actions: BTreeMap<String, XidAction>,
    /// Deprecated: each XID as `reset-gpu` in `xid_actions`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hardware_xids: Option<Vec<u64>>,
    /// Deprecated: each XID as `restart-app` in `xid_actions`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub application_xids: Option<Vec<u64>>,
    /// XIDs attached to a hang alert of a worker on that GPU, as evidence.
    pub evidence_xids: Vec<u64>,
    /// How far back an evidence XID is attached to a hang alert.
    #[serde(with = "humantime_serde")]
    pub evidence_window: Duration,
    /// Put a `NoSchedule` taint on the Node while a GPU has failed.
    pub taint_on_failure: bool,
    /// Where failed GPUs are kept across agent restarts (JSON, with the node's boot id); empty
    /// = not kept.
    pub state_file: String,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: Switch::Auto,
            library_path: String::new(),
            sample_interval: Duration::from_secs(15),
            xid_actions: BTreeMap::new(),
            hardware_xids: None,
            application_xids: None,
            evidence_xids: vec![43, 109],
            evidence_window: Duration::from_secs(30 * 60),
            taint_on_failure: false,
            state_file: "/var/lib/vigil/gpu-state.json".into(),
        }
    }
}

impl GpuConfig {
    /// A sampling interval of at least a second; `xid_actions` keys are XID numbers; an XID set
    /// both by a deprecated list and by `xid_actions`, or by both lists, is refused.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.sample_interval < Duration::from_secs(1) {
            return bad("gpu.sample_interval", "must be at least 1s");
        }
        for k in self.xid_actions.keys() {
            if k.trim().parse::<u64>().is_err() {
                return bad(
                    "gpu.xid_actions",
                    format!("{k:?} is not an XID number (write \"79\" = \"reboot-node\")"),
                );
            }
        }
        let hw = self.hardware_xids.as_deref().unwrap_or_default();
        let app = self.application_xids.as_deref().unwrap_or_default();
        if let Some(x) = hw.iter().find(|x| app.contains(x)) {
            return bad(
                "gpu.hardware_xids",
                format!("XID {x} is also in gpu.application_xids; it must be one or the other"),
            );
        }
        let explicit = self.explicit_actions();
        for (key, list) in [("gpu.hardware_xids", hw), ("gpu.application_xids", app)] {
            if let Some(x) = list.iter().find(|x| explicit.contains_key(x)) {
                return bad(
                    key,
                    format!(
                        "XID {x} is also in gpu.xid_actions; set it there only (this key is deprecated)"
                    ),
                );
            }
        }
        Ok(())
    }

    /// `xid_actions` with its keys parsed (a key that is not a number was refused by validate).
    fn explicit_actions(&self) -> BTreeMap<u64, XidAction> {
        self.xid_actions
            .iter()
            .filter_map(|(k, &a)| k.trim().parse().ok().map(|x| (x, a)))
            .collect()
    }

    /// Every override of the built-in XID table: `xid_actions`, and the deprecated lists as
    /// `reset-gpu` (hardware) and `restart-app` (application).
    pub fn xid_overrides(&self) -> BTreeMap<u64, XidAction> {
        let mut out = self.explicit_actions();
        for &x in self.hardware_xids.as_deref().unwrap_or_default() {
            out.insert(x, XidAction::ResetGpu);
        }
        for &x in self.application_xids.as_deref().unwrap_or_default() {
            out.insert(x, XidAction::RestartApp);
        }
        out
    }

    /// A line per deprecated key the file set, for the start-up warnings.
    pub(super) fn deprecated(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (key, list, action) in [
            ("hardware_xids", &self.hardware_xids, XidAction::ResetGpu),
            (
                "application_xids",
                &self.application_xids,
                XidAction::RestartApp,
            ),
        ] {
            if let Some(list) = list {
                let entries: Vec<String> = list
                    .iter()
                    .map(|x| format!("\"{x}\" = \"{}\"", action.as_str()))
                    .collect();
                out.push(format!(
                    "gpu.{key} is deprecated: its XIDs are honoured as {}; write them as \
                     [gpu.xid_actions] {} (or drop the key to follow NVIDIA's table: vigil policy gpu)",
                    action.as_str(),
                    entries.join(", ")
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, parse};
    use super::*;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[gpu]\nenabled = \"maybe\"", "gpu.enabled"),
            ("[gpu]\nsample_interval = \"500ms\"", "gpu.sample_interval"),
            (
                "[gpu]\nhardware_xids = [79]\napplication_xids = [79]",
                "gpu.hardware_xids",
            ),
            (
                "[gpu.xid_actions]\n\"79\" = \"panic\"",
                "gpu.xid_actions.79",
            ),
            (
                "[gpu.xid_actions]\nseventy = \"reset-gpu\"",
                "gpu.xid_actions",
            ),
            (
                "[gpu]\napplication_xids = [13]\n[gpu.xid_actions]\n\"13\" = \"informational\"",
                "gpu.application_xids",
            ),
        ]);
    }

    #[test]
    fn xid_actions_override_and_deprecated_lists_are_honoured_with_a_warning() {
        let c = parse("[gpu.xid_actions]\n\"92\" = \"reset-gpu\"\n\" 13 \" = \"informational\"")
            .unwrap();
        let o = c.gpu.xid_overrides();
        assert_eq!(o.get(&92), Some(&XidAction::ResetGpu));
        assert_eq!(o.get(&13), Some(&XidAction::Informational));
        assert!(c.deprecated.is_empty(), "{:?}", c.deprecated);

        let c = parse("[gpu]\nhardware_xids = [63, 94]\napplication_xids = [13]").unwrap();
        let o = c.gpu.xid_overrides();
        assert_eq!(o.get(&63), Some(&XidAction::ResetGpu));
        assert_eq!(o.get(&94), Some(&XidAction::ResetGpu));
        assert_eq!(o.get(&13), Some(&XidAction::RestartApp));
        assert_eq!(c.deprecated.len(), 2, "{:?}", c.deprecated);
        assert!(
            c.deprecated[0].contains("gpu.hardware_xids is deprecated")
                && c.deprecated[0].contains("\"63\" = \"reset-gpu\"")
                && c.deprecated[0].contains("gpu.xid_actions"),
            "{}",
            c.deprecated[0]
        );
        assert!(c.deprecated[1].contains("\"13\" = \"restart-app\""));
    }

    #[test]
    fn defaults_have_no_overrides() {
        let c = GpuConfig::default();
        assert!(c.xid_overrides().is_empty());
        assert!(c.deprecated().is_empty());
        assert!(c.validate().is_ok());
    }
}
