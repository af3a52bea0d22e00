//! `[gpu]`: the NVML monitor, what each XID calls for (NVIDIA's table in
//! `crate::accel::gpu::policy_xid`, overridable per XID: [`XidAction`], the values of
//! `gpu.xid_actions`), which XIDs are evidence for a hang, and where a GPU's failure is kept across
//! agent restarts.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{at_least_a_second, bad, bad_if, ConfigError, Switch};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct GpuConfig {
    /// `auto` (load NVML; when the node has GPUs but no driver yet, keep trying), `on`, `off`.
    #[educe(Default(expression = Switch::Auto))]
    pub enabled: Switch,
    /// Path of `libnvidia-ml.so`; empty = the loader's search path.
    pub library_path: String,
    /// How often every GPU is read (XID events are waited for continuously).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(15)))]
    pub sample_interval: Duration,
    /// Per-XID overrides of NVIDIA's immediate action (`"79" = "reboot-node"`); the rest follow
    /// the built-in table (`vigil policy gpu`).
    pub xid_actions: BTreeMap<String, XidAction>,
    /// XIDs attached to a hang alert of a worker on that GPU, as evidence.
    #[educe(Default(expression = vec![43, 109]))]
    pub evidence_xids: Vec<u64>,
    /// How far back an evidence XID is attached to a hang alert.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30 * 60)))]
    pub evidence_window: Duration,
    /// Put a `NoSchedule` taint on the Node while a GPU has failed.
    pub taint_on_failure: bool,
    /// On a cluster whose GPUs are allocated through DRA: a failed GPU becomes a
    /// `DeviceTaintRule` for its device (the node's other GPUs stay schedulable), removed when
    /// it recovers — instead of the Node taint (docs/gpu.md). Opt-in; needs the RBAC of
    /// `deploy/components/dra-device-taints`.
    pub device_taints: bool,
    /// The DRA driver whose ResourceSlices list this node's GPUs (the device's `uuid` attribute
    /// names the GPU).
    #[educe(Default(expression = "gpu.nvidia.com".into()))]
    pub dra_driver: String,
    /// The version of `resource.k8s.io` the cluster serves `DeviceTaintRule` in: `v1alpha3`
    /// (1.33–1.35, feature gate `DRADeviceTaints`), `v1beta2` (1.36), `v1` (1.37).
    #[educe(Default(expression = "v1beta2".into()))]
    pub dra_api_version: String,
    /// On Kubernetes, how often the node's pods are read for the GPUs the kubelet reports
    /// `Unhealthy` to them (`allocatedResourcesStatus`, the device plugin's health check): such
    /// a GPU is failed in Vigil's verdict, as an XID's failure, until it is reset. `0s` = not read.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30)))]
    pub kubelet_health_interval: Duration,
    /// Where failed GPUs are kept across agent restarts (JSON, with the node's boot id); empty
    /// = not kept.
    #[educe(Default(expression = "/var/lib/vigil/gpu-state.json".into()))]
    pub state_file: String,
    /// When a non-fatal XID counts, and what one episode of an XID is.
    pub xid_threshold: XidThreshold,
    /// How long one NVML call may take before the driver counts as wedged: the GPUs' health is
    /// then unknown until it answers.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30)))]
    pub call_deadline: Duration,
}

/// `[gpu.xid_threshold]`: events of one XID on one GPU less than `window` apart are one episode
/// (one log line and one Event, however many events); an XID NVIDIA's table does not list
/// degrades the GPU only once `count` of its events fall within `window`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct XidThreshold {
    #[educe(Default(expression = 1))]
    pub count: u32,
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30 * 60)))]
    pub window: Duration,
}

impl GpuConfig {
    /// A sampling interval of at least a second; `xid_actions` keys are XID numbers.
    pub fn validate(&self) -> Result<(), ConfigError> {
        at_least_a_second("gpu.sample_interval", self.sample_interval)?;
        bad_if(self.xid_threshold.count == 0, "gpu.xid_threshold.count", "must be at least 1")?;
        at_least_a_second("gpu.xid_threshold.window", self.xid_threshold.window)?;
        // NB: the XID wait itself lasts up to a second; a deadline near it would call a
        // healthy driver wedged.
        let why = "must be at least 2s";
        bad_if(self.call_deadline < Duration::from_secs(2), "gpu.call_deadline", why)?;
        // NB: one list of the node's pods per interval per node: a fleet of 1,000 nodes at 5s
        // would be 200 lists a second on the API server.
        let every = self.kubelet_health_interval;
        let too_often = !every.is_zero() && every < Duration::from_secs(10);
        let why = "must be 0s (not read) or at least 10s";
        bad_if(too_often, "gpu.kubelet_health_interval", why)?;
        let version = &self.dra_api_version;
        let why = format!("{version:?} is not a version of resource.k8s.io that serves DeviceTaintRule (v1alpha3, v1beta2 or v1)");
        let served = matches!(version.as_str(), "v1alpha3" | "v1beta2" | "v1");
        bad_if(!served, "gpu.dra_api_version", why)?;
        let why = "must name the DRA driver of the GPUs when gpu.device_taints is on";
        bad_if(self.device_taints && self.dra_driver.trim().is_empty(), "gpu.dra_driver", why)?;
        let not_a_number = self.xid_actions.keys().find(|k| k.trim().parse::<u64>().is_err());
        let Some(k) = not_a_number else { return Ok(()) };
        let why = format!("{k:?} is not an XID number (write \"79\" = \"reboot-node\")");
        bad("gpu.xid_actions", why)
    }

    /// Every override of the built-in XID table (`xid_actions`, its keys parsed: a key that is
    /// not a number was refused by validate).
    pub(crate) fn xid_overrides(&self) -> BTreeMap<u64, XidAction> {
        self.xid_actions.iter().filter_map(|(k, &a)| Some((k.trim().parse().ok()?, a))).collect()
    }
}

/// What an event on a GPU calls for, after NVIDIA's "Resolution Bucket (Immediate Action)".
/// Only [`XidAction::fails`] actions make a GPU `failed`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub enum XidAction {
    /// Recorded (and counted) only.
    #[default]
    Informational,
    /// The application must restart (RESTART_APP): the worker's restart is the fix, so it never
    /// blocks one.
    RestartApp,
    /// The GPU needs a reset (RESET_GPU, `nvidia-smi -r`) before it is usable again.
    ResetGpu,
    /// Drain peer-to-peer traffic (and reset): stop the GPU's work first.
    Drain,
    /// The node must restart (RESTART_BM, RESTART_VM, NODE_REBOOT).
    RebootNode,
}

impl XidAction {
    /// Whether the GPU is unusable until someone acts: `failed` (taint, no restarts on it).
    pub(crate) fn fails(self) -> bool {
        matches!(self, XidAction::ResetGpu | XidAction::Drain | XidAction::RebootNode)
    }

    /// What an operator does about it, for reasons and alerts.
    pub(crate) fn advice(self) -> &'static str {
        match self {
            XidAction::Informational => "no action",
            XidAction::RestartApp => "restart the application",
            XidAction::ResetGpu => "reset the GPU (nvidia-smi -r) or reboot the node",
            XidAction::Drain => "drain the GPU's work, then reset it",
            XidAction::RebootNode => "reboot the node",
        }
    }
}
as_str!(pub XidAction);

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, parse};
    use super::*;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[gpu]\nenabled = \"maybe\"", "gpu.enabled"),
            ("[gpu]\nsample_interval = \"500ms\"", "gpu.sample_interval"),
            ("[gpu.xid_threshold]\ncount = 0", "gpu.xid_threshold.count"),
            ("[gpu.xid_threshold]\nwindow = \"0s\"", "gpu.xid_threshold.window"),
            ("[gpu]\ncall_deadline = \"1s\"", "gpu.call_deadline"),
            ("[gpu.xid_actions]\n\"79\" = \"panic\"", "gpu.xid_actions.79"),
            ("[gpu.xid_actions]\nseventy = \"reset-gpu\"", "gpu.xid_actions"),
        ]);
    }

    #[test]
    fn xid_actions_override_the_table_and_the_old_lists_are_refused() {
        let c = parse("[gpu.xid_actions]\n\"92\" = \"reset-gpu\"\n\" 13 \" = \"informational\"")
            .unwrap();
        let o = c.gpu.xid_overrides();
        assert_eq!(o.get(&92), Some(&XidAction::ResetGpu));
        assert_eq!(o.get(&13), Some(&XidAction::Informational));
        for key in ["hardware_xids", "application_xids"] {
            let err = parse(&format!("[gpu]\n{key} = [63]")).unwrap_err().to_string();
            assert!(err.contains(&format!("gpu.{key} was removed: use gpu.xid_actions")), "{err}");
        }
    }

    #[test]
    fn defaults_have_no_overrides() {
        let c = GpuConfig::default();
        assert!(c.xid_overrides().is_empty());
        assert!(c.validate().is_ok());
    }
}
