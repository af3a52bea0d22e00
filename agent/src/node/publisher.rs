//! The Node as Vigil shows it: one desired state — maintenance, GPU and TPU health, the last
//! checkpoint and the perform-maintenance label — reconciled onto the Node, plus the Events. Every call is
//! bounded: the Node is informative, checkpoints are what matter.

use std::sync::Arc;
use std::time::Duration;

use crate::accel::gpu::model::{GpuHealth, GpuMonitorState, GpuReport};
use crate::accel::policy::{desired, Accelerator};
use crate::accel::tpu::model::TpuReport;
use crate::config::Config;
use crate::kube::device_taints::{reconcile, KubeDeviceTaints};
use crate::kube::node::{EventType, NodeApi};
use crate::maintenance::policy::node_desired;
use crate::metrics::Metrics;
use crate::vocab::maintenance::MaintenanceState;
use crate::vocab::node::{slow_desired, SlowNamed, SlowTaintNow};

/// Longest wait on one Kubernetes call.
const KUBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the DRA device taints are reconciled when nothing changed.
const DEVICE_RECHECK: Duration = Duration::from_secs(300);

/// Where the failed GPUs' DRA device taints stand after a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taints {
    /// `gpu.device_taints` off.
    Off,
    /// Every failed GPU's device has its rule (or none failed).
    Covered,
    /// Not every failed GPU has one: not read yet, or a GPU no device stands for.
    Uncovered,
    /// The API failed: tried again next tick.
    Failed,
}

/// What the Node should show.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeView {
    pub(crate) maintenance: MaintenanceState,
    pub(crate) gpu: GpuReport,
    /// The TPU monitor's last report; `None` until its first, when Vigil's TPU fields on the
    /// Node are left as they are (an agent restarting on a TPU node does not take its TPU label
    /// and condition off for the second before the monitor's first reading).
    pub(crate) tpu: Option<TpuReport>,
    /// `<time> <reason>: acked=… timed-out=… failed=…` of the last checkpoint round.
    pub(crate) last_checkpoint: Option<String>,
    /// The perform-maintenance label: `Some(true)` while this node holds the pool's claim,
    /// `Some(false)` to remove the label it set, `None` to leave the label alone.
    ///
    /// NB: only a label this node set is ever removed: an operator's own is left alone.
    pub(crate) perform_maintenance: Option<bool>,
    /// The slow gangs naming a member of this node (`gang.pace`): the `VigilSlow` condition.
    pub(crate) slow: SlowNamed,
    /// Until when the slow taint stands (coordinator ms: `gang.pace.taint_for` after the node
    /// was last named), whether it stands now, and whether strong evidence named the node (it
    /// may then be `NoExecute`).
    pub(crate) slow_until: Option<crate::clock::Millis>,
    pub(crate) slow_tainted: bool,
    pub(crate) slow_evict: bool,
}

pub(crate) struct NodePublisher {
    api: Option<Arc<dyn NodeApi>>,
    /// With `gpu.device_taints`: a failed GPU is a DRA `DeviceTaintRule` for its device, not a
    /// Node taint.
    pub(crate) device_taints: Option<Arc<KubeDeviceTaints>>,
    /// When the device taints were last reconciled.
    device_checked: Option<tokio::time::Instant>,
    cfg: Config,
    metrics: Arc<Metrics>,
    pub(crate) view: NodeView,
    /// The last write failed (API down, 500, a timeout, a 403): the Node may not show the view,
    /// so it is written again at the next tick until it does.
    pub(crate) stale: bool,
}

impl NodePublisher {
    pub fn new(cfg: &Config, api: Option<Arc<dyn NodeApi>>, metrics: Arc<Metrics>) -> Self {
        let (device_taints, device_checked, cfg, view) =
            (None, None, cfg.clone(), Default::default());
        NodePublisher { api, device_taints, device_checked, cfg, metrics, view, stale: false }
    }

    /// Run in observe mode (`dry_run`) or not from now on (a SIGHUP): the Node and the device
    /// taints are written again at the next tick (the slow taint comes off or goes on; a
    /// device's rule takes its `None` or `NoSchedule` effect).
    pub(crate) fn set_dry_run(&mut self, dry_run: bool) {
        if self.cfg.dry_run != dry_run {
            self.cfg.dry_run = dry_run;
            self.stale = true;
            self.device_checked = None;
        }
    }

    /// Make the Node show the view (no write when it already does); with device taints, the
    /// failed GPUs' DRA devices first.
    pub(crate) async fn publish(&mut self) {
        let Some(api) = self.api.clone() else { return };
        let taints = self.publish_device_taints().await;
        let (v, k) = (&self.view, &self.cfg.kubernetes);
        let mut want =
            node_desired(k, &v.maintenance, v.last_checkpoint.as_deref(), v.perform_maintenance);
        // NB: with device taints a failed GPU taints its device, not the Node — while every
        // failed GPU has its device's rule: a failed write or a GPU no device stands for leaves
        // the Node taint standing in (`gpu.taint_on_failure`).
        desired(k, &v.gpu, self.cfg.gpu.taint_on_failure && taints != Taints::Covered, &mut want);
        if let Some(tpu) = &v.tpu {
            desired(k, tpu, self.cfg.tpu.taint_on_failure, &mut want);
        }
        // NB: observe mode shows the condition and never taints (a NoExecute taint evicts).
        let taint = SlowTaintNow { on: v.slow_tainted && !self.cfg.dry_run, evict: v.slow_evict };
        slow_desired(k, &self.cfg.gang.pace, &v.slow, taint, &mut want);
        // Stale until the write is seen to land.
        let was_stale = std::mem::replace(&mut self.stale, true);
        match tokio::time::timeout(KUBE_TIMEOUT, api.reconcile(&self.cfg.node_name, &want)).await {
            Ok(Ok(())) => {
                if was_stale {
                    tracing::info!("the Node shows Vigil's state again");
                }
                // NB: a failed device taint keeps it stale: tried again next tick.
                self.stale = taints == Taints::Failed;
                // The label this node set is gone now (`Some(false)`): from here on it is not
                // ours to touch.
                self.view.perform_maintenance = self.view.perform_maintenance.filter(|&on| on);
            }
            Ok(Err(e)) => {
                self.metrics.kube.error(e.op());
                if !was_stale {
                    tracing::error!(error = %e, "could not update the Node; retrying every poll_interval until it matches");
                }
            }
            Err(_) => {
                self.metrics.kube.error("patch");
                if !was_stale {
                    tracing::error!("the Kubernetes API did not answer within {KUBE_TIMEOUT:?}; retrying every poll_interval until the Node matches");
                }
            }
        }
    }

    /// Device taints on, and not reconciled for [`DEVICE_RECHECK`]: slices that came back, a
    /// rule someone deleted, a device renumbered.
    pub(crate) fn device_taints_due(&self) -> bool {
        self.device_taints.is_some()
            && self.device_checked.is_none_or(|t| t.elapsed() >= DEVICE_RECHECK)
    }

    /// Make this node's `DeviceTaintRule`s match its failed GPUs (`crate::kube::device_taints`).
    /// Nothing while the GPUs have not been read (a rule is neither made nor removed on a
    /// guess), nor in observe mode on `v1alpha3` (its `None` effect needs Kubernetes 1.35).
    async fn publish_device_taints(&mut self) -> Taints {
        let Some(api) = self.device_taints.clone() else { return Taints::Off };
        let (gpu, g) = (&self.view.gpu, &self.cfg.gpu);
        let observe_on_v1alpha3 = self.cfg.dry_run && g.dra_api_version == "v1alpha3";
        // NB: looked at even when there is nothing to do: otherwise every tick would publish the
        // Node again on a node without GPUs. A new GPU report publishes at once (`apply_gpu`),
        // and a change of observe mode looks again (`set_dry_run`).
        self.device_checked = Some(tokio::time::Instant::now());
        // NB: only from GPUs NVML read (or one that hangs in a call after reading them): kept
        // failures before NVML loads may be an old write's, and a reconcile would delete the
        // rules of GPUs that failed after it; the Node taint stands in meanwhile.
        let read = matches!(gpu.state, GpuMonitorState::On | GpuMonitorState::NvmlHung);
        if !gpu.settled() || !read || observe_on_v1alpha3 {
            return Taints::Uncovered;
        }
        let failed = gpu.gpus.iter().filter(|g| g.health == GpuHealth::Failed);
        let failed: Vec<String> = failed.map(|g| g.uuid.clone()).collect();
        let node = &self.cfg.node_name;
        let call = reconcile(api.as_ref(), node, &g.dra_driver, &failed, self.cfg.dry_run);
        let plan = match tokio::time::timeout(KUBE_TIMEOUT, call).await {
            Ok(Ok(plan)) => plan,
            Ok(Err(e)) => {
                self.metrics.kube.error("device-taint");
                tracing::warn!(error = %e, "could not update the GPUs' DRA device taints; retrying next tick");
                return Taints::Failed;
            }
            Err(_) => {
                self.metrics.kube.error("device-taint");
                tracing::warn!("the Kubernetes API did not answer for the DRA device taints within {KUBE_TIMEOUT:?}; retrying next tick");
                return Taints::Failed;
            }
        };
        for r in &plan.create {
            tracing::warn!(gpu = %r.gpu, device = %r.device.name, rule = %r.name, effect = r.effect, "GPU failed: its DRA device is tainted");
        }
        for name in &plan.delete {
            tracing::info!(rule = %name, "DRA device taint removed (its GPU no longer failed, or replaced)");
        }
        for gpu in &plan.unmatched {
            tracing::warn!(gpu = %gpu, driver = %g.dra_driver, "GPU failed, but no device of this node's ResourceSlices is it: no device taint (the Node taint stands in)");
        }
        if plan.unmatched.is_empty() {
            Taints::Covered
        } else {
            Taints::Uncovered
        }
    }

    /// Record a Kubernetes Event about the Node (best-effort), its message marked as Vigil's:
    /// `vigil: <message>`.
    pub(crate) async fn event(&self, reason: &str, message: &str, kind: EventType) {
        let Some(api) = &self.api else { return };
        let node = &self.cfg.node_name;
        let message = format!("vigil: {message}");
        match tokio::time::timeout(KUBE_TIMEOUT, api.event(node, reason, &message, kind)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.metrics.kube.error(e.op());
                tracing::warn!(error = %e, reason, "could not record the Event");
            }
            Err(_) => {
                self.metrics.kube.error("event");
                tracing::warn!(reason, "the Kubernetes API did not answer; Event not recorded");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node without GPUs (or a monitor not started, or off) has no device taint to reconcile:
    /// one look, then the periodic recheck, not a publish of the Node on every tick.
    #[tokio::test]
    async fn device_taints_without_gpus_are_not_due_again_at_the_next_tick() {
        let api = KubeDeviceTaints::connect("http://127.0.0.1:9", "v1beta2").await;
        let api = Arc::new(api.expect("a client is made without a call"));
        for state in [GpuMonitorState::NoGpu, GpuMonitorState::Starting, GpuMonitorState::Off] {
            let mut p = NodePublisher::new(&Config::default(), None, Arc::new(Metrics::new()));
            p.device_taints = Some(api.clone());
            p.view.gpu = GpuReport::in_state(state);
            assert!(p.device_taints_due(), "{state:?}: never looked at yet");
            assert_eq!(p.publish_device_taints().await, Taints::Uncovered, "{state:?}");
            assert!(!p.device_taints_due(), "{state:?}: looked at just now");
        }
    }
}
