//! The GPU report as the Node shows it (pure): the `GPU` row of the accelerators' table (its
//! label, annotation, taint, condition and Events), the report read through the shared
//! accelerator rules (`crate::accel::policy::Accelerator`), which of its changes are an Event and
//! an alert ([`announced`]), the `VigilGPUUnhealthy` condition and the line for a wedged driver.

use std::collections::BTreeSet;

use crate::accel::gpu::model::{GpuMonitorState, GpuReport, GpuStatus};
use crate::accel::model::Health;
use crate::accel::policy::{verdict_condition, Accelerator, Names};
use crate::vocab::node::{problem_condition, NodeCondition, GPU_CONDITION, GPU_FAILED_TAINT};

/// The GPU's row of the accelerators' table.
pub static GPU: Names = Names {
    label: "gpu-health",
    taint: GPU_FAILED_TAINT,
    condition: GPU_CONDITION,
    events: ["VigilGpuHealthy", "VigilGpuDegraded", "VigilGpuFailed"],
};

impl Accelerator for GpuReport {
    const NAMES: &'static Names = &GPU;
    fn monitoring(&self) -> bool {
        GpuReport::monitoring(self)
    }
    fn failures_known(&self) -> bool {
        GpuReport::failures_known(self)
    }
    fn health(&self) -> Health {
        self.node
    }
    fn reasons(&self) -> &[String] {
        &self.node_reasons
    }
    fn reasons_mut(&mut self) -> &mut Vec<String> {
        &mut self.node_reasons
    }
    fn settled(&self) -> bool {
        self.state != GpuMonitorState::Starting
    }
    fn condition(&self) -> Option<NodeCondition> {
        Some(gpu_condition(self))
    }
    // NB: the monitor's state too (starting → no GPU → waiting for the driver): the condition's
    // reason says which. And which GPUs failed: a second GPU failing leaves the node's health as
    // it was, yet its DRA device's taint, its reason on the Node and its trail entry must not
    // wait out the minute that holds back a storm's recounted reasons.
    fn differs(&self, other: &Self) -> bool {
        self.state != other.state || self.node != other.node || failed(self) != failed(other)
    }
    // NB: none while the monitor starts: the Node then still shows what the agent before this
    // one left there (`settled`), and that is not known here; the first verdict's Event and
    // alert are for [`announced`] to judge. From then on a GPU is shown healthy until told
    // otherwise, NVML or not.
    fn shown(&self) -> Option<Health> {
        (self.state != GpuMonitorState::Starting).then_some(self.node)
    }
    fn noted(&self, _prev: Option<Health>) -> bool {
        GpuReport::monitoring(self)
    }
    fn detail(&self, prev: &Self) -> String {
        let (was, now) = (prev.shown().map_or("unknown", Health::as_str), self.node.as_str());
        match self.state {
            GpuMonitorState::NvmlHung => format!("GPU health {was} → unknown: {}", hung_line(self)),
            _ if self.node_reasons.is_empty() => format!("GPU health {was} → {now}"),
            _ => format!("GPU health {was} → {now}: {}", self.node_reasons.join("; ")),
        }
    }
}

/// Whether a change to `report` from a report that showed `prev` is an Event (and, failed, an
/// alert): a change of health while monitoring. The monitor's first verdict (`prev` `None`) is
/// one when it is not what the node's last Event said before the agent started (`report.told`,
/// kept in `gpu.state_file`): a rollout of the agent must not page again for a failed GPU, nor
/// keep quiet about a failure written before its Event went out. Where that is not known,
/// neither a GPU that comes up healthy (healthy until told otherwise) nor a failure made only
/// of failures kept from before the agent restarted is one.
pub(crate) fn announced(report: &GpuReport, prev: Option<Health>) -> bool {
    match (prev, report.told.before) {
        (None, Some(said)) => report.monitoring() && report.node != said,
        (None, None) if report.node == Health::Healthy || only_kept(report) => false,
        _ => report.monitoring() && prev != Some(report.node),
    }
}

/// Whether `report` has failed GPUs, each failed by a failure kept from before the agent
/// restarted (`gpu.state_file`).
fn only_kept(report: &GpuReport) -> bool {
    let mut failed = report.gpus.iter().filter(|g| g.health == Health::Failed).peekable();
    failed.peek().is_some() && failed.all(|g| g.failure.as_ref().is_some_and(|f| f.kept))
}

/// The failed GPUs of `report`, each by its [`identity`].
fn failed(report: &GpuReport) -> BTreeSet<(&str, Option<u32>)> {
    report.gpus.iter().filter(|g| g.health == Health::Failed).map(identity).collect()
}

/// A GPU as the policy tells GPUs apart: by UUID (a driver reload may renumber the indices), by
/// index when it has none.
fn identity(g: &GpuStatus) -> (&str, Option<u32>) {
    if g.uuid.is_empty() {
        ("", Some(g.index))
    } else {
        (g.uuid.as_str(), None)
    }
}

/// `VigilGPUUnhealthy`: True when a GPU failed, False when healthy or degraded (still usable;
/// the reason and message say why), Unknown without GPU monitoring — the same fact as the
/// `gpu-health` label.
pub(crate) fn gpu_condition(report: &GpuReport) -> NodeCondition {
    use crate::accel::gpu::model::GpuMonitorState as S;
    let (reason, message) = match report.state {
        // The verdict's condition, its message from the reasons.
        S::On if report.node_reasons.is_empty() => {
            let message = format!("GPU health {}", report.node.as_str());
            return verdict_condition(&GPU, report.node, &message);
        }
        S::On => return verdict_condition(&GPU, report.node, &report.node_reasons.join("; ")),
        S::Off => ("MonitoringOff", "GPU monitoring is off (gpu.enabled = off)".into()),
        S::NoGpu => (
            "NoGpu",
            "no NVIDIA GPU on this node (no /dev/nvidiaN, no NVIDIA PCI display device)".into(),
        ),
        S::WaitingForDriver => (
            "WaitingForDriver",
            "waiting for the NVIDIA driver: the node has GPUs but NVML does not load yet".into(),
        ),
        S::Starting => ("Starting", "GPU monitoring is starting".into()),
        S::NvmlHung => ("NvmlHung", hung_line(report)),
    };
    problem_condition(GPU_CONDITION, None, reason, message)
}

/// Why a `nvml-hung` report has no verdict.
pub(crate) fn hung_line(report: &GpuReport) -> String {
    format!(
        "an NVML call ({}): the NVIDIA driver may be wedged; GPU health is unknown until it answers",
        report.hung.as_deref().unwrap_or("a call has not returned")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accel::gpu::model::{Failure, Told};

    /// A monitor's first verdict: its GPU is `health`, failed (if so) by a failure kept from
    /// before the agent restarted when `kept`; the node's last Event before it said `said`.
    fn first(health: Health, kept: bool, said: Option<Health>) -> GpuReport {
        let failure = (health == Health::Failed).then(|| Failure { kept, ..Failure::default() });
        let gpu = GpuStatus { uuid: "GPU-0".into(), health, failure, ..GpuStatus::default() };
        let (state, told) = (GpuMonitorState::On, Told::restored(said));
        GpuReport { state, gpus: vec![gpu], node: health, told, ..GpuReport::default() }
    }

    #[test]
    fn a_first_verdict_is_an_event_when_the_last_one_said_otherwise() {
        use Health::{Degraded, Failed, Healthy};
        // (health now, kept, what the last Event said, an Event?)
        for (now, kept, said, event) in [
            // Said before the restart: not again, an XID's kept failure or one read again from
            // the GPU (a row remapping failed, or pending).
            (Failed, true, Some(Failed), false),
            (Failed, false, Some(Failed), false),
            (Degraded, false, Some(Degraded), false),
            // Written before its Event went out: said now.
            (Failed, true, Some(Healthy), true),
            (Failed, true, Some(Degraded), true),
            // Changed while the agent was away.
            (Healthy, false, Some(Failed), true),
            (Degraded, false, Some(Healthy), true),
            (Healthy, false, Some(Healthy), false),
            // Not known: a kept failure was announced, a healthy GPU is no news (as before).
            (Failed, true, None, false),
            (Failed, false, None, true),
            (Degraded, false, None, true),
            (Healthy, false, None, false),
        ] {
            let r = first(now, kept, said);
            assert_eq!(announced(&r, None), event, "{now:?} kept={kept} said={said:?}");
            // Before NVML reads the GPUs: never.
            let waiting = GpuReport { state: GpuMonitorState::WaitingForDriver, ..r.clone() };
            assert!(!announced(&waiting, None), "{now:?} kept={kept} said={said:?}");
            // From then on, a change of health and nothing else.
            for prev in [Healthy, Degraded, Failed] {
                assert_eq!(announced(&r, Some(prev)), prev != now, "{prev:?} → {now:?}");
            }
        }
    }
}
