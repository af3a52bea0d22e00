//! The node controller's accelerator health: GPU and TPU reports folded into the Node (label,
//! condition, taint), the trail, Events and alerts.

use crate::actions::alert::{Alert, AlertKind};
use crate::model::gpu::{GpuHealth, GpuReport};
use crate::model::tpu::{TpuHealth, TpuReport};
use crate::observe::trail::Code;
use crate::policy::maintenance::gpu_event_for;
use crate::policy::tpu::tpu_event_for;

use super::Controller;

impl Controller {
    /// A new GPU report: metrics always; the Node, an Event, the trail and an alert when the
    /// node's GPU health or its reasons change.
    pub(crate) async fn apply_gpu(&mut self, report: GpuReport) {
        self.gpu_seen = Some(tokio::time::Instant::now());
        self.note_cleared(&report).await;
        let Some(change) = self.gpu.fold(report, &self.metrics) else {
            return;
        };
        let r = self.gpu.report().clone();
        self.node.view.gpu = r.clone();
        if r.monitoring() {
            self.note(Code::GpuHealth, change.detail.clone()).await;
        }
        self.node.publish().await;
        if change.prev == r.node || !r.monitoring() {
            return;
        }
        let (reason, kind) = gpu_event_for(r.node);
        let message = format!("vigil: {}", change.detail);
        self.node.event(reason, &message, kind).await;
        if let (GpuHealth::Failed, Some(n)) = (r.node, &self.notifier) {
            let a = Alert::new(
                AlertKind::GpuFailed,
                &self.cfg.node_name,
                format!(
                    "{}; a restart cannot fix hardware: drain the node and have the GPU checked",
                    change.detail
                ),
            );
            n.send(&a).await;
        }
    }

    /// A new TPU report: metrics always; the Node, the trail, an Event and (on failure) an
    /// alert when the node's TPU health, its chip counts or its reasons change — as for the GPU.
    pub(crate) async fn apply_tpu(&mut self, report: TpuReport) {
        let Some(change) = self.tpu.fold(report, &self.metrics) else {
            return;
        };
        let r = self.tpu.report().clone();
        self.node.view.tpu = Some(r.clone());
        if r.monitoring || change.prev.is_some() {
            self.note(Code::TpuHealth, change.detail.clone()).await;
        }
        self.node.publish().await;
        if !r.monitoring || change.prev == Some(r.health) {
            return;
        }
        let (reason, kind) = tpu_event_for(r.health);
        let message = format!("vigil: {}", change.detail);
        self.node.event(reason, &message, kind).await;
        if let (TpuHealth::Failed, Some(n)) = (r.health, &self.notifier) {
            let a = Alert::new(
                AlertKind::TpuFailed,
                &self.cfg.node_name,
                format!(
                    "{}; a restart cannot fix hardware: drain the node and have its TPU chips \
                     checked",
                    change.detail
                ),
            );
            n.send(&a).await;
        }
    }

    /// A `gpu-failure-cleared` trail entry for each GPU failure the report clears (by a reset, a
    /// driver reload or a reboot), saying why.
    pub(super) async fn note_cleared(&mut self, report: &GpuReport) {
        for c in self.gpu.new_cleared(report) {
            let detail = format!(
                "{}: failure cleared: {} (it was: {})",
                c.gpu,
                c.why,
                c.causes.join("; ")
            );
            self.note(Code::GpuFailureCleared, detail).await;
        }
    }
}
