//! The node controller's accelerator health, one path for every kind: a GPU or TPU report folded
//! into the Node (label, condition, taint), the trail, Events and alerts.

use crate::accel::gpu::model::{GpuMonitorState, GpuReport};
use crate::accel::gpu::policy::new_cleared;
use crate::accel::gpu::policy_episode::new_begun;
use crate::accel::gpu::policy_node::{announced, hung_line};
use crate::accel::model::Health;
use crate::accel::policy::event_for;
use crate::accel::tpu::model::TpuReport;
use crate::accel::tracker::{Change, Tracked};
use crate::alerts::Alert;
use crate::config::XidAction;
use crate::trail::Code;
use crate::vocab::node::EventType;

use super::Controller;

impl Controller {
    /// A new GPU report: the failures it clears go in the trail, then it is applied; a verdict
    /// shown is what the node's GPU Events have said from then on (kept by the monitor).
    pub(crate) async fn apply_gpu(&mut self, report: GpuReport) {
        self.gpu_seen = Some(tokio::time::Instant::now());
        self.lose_to_gpus(&report);
        self.note_cleared(&report).await;
        self.announce_episodes(&report).await;
        let was = self.gpu.report().state;
        if report.state == GpuMonitorState::NvmlHung && was != GpuMonitorState::NvmlHung {
            self.node.event("VigilGpuNvmlHung", &hung_line(&report), EventType::Warning).await;
        }
        let Some(change) = self.gpu.fold(report, &self.metrics) else { return };
        let r = self.gpu.report().clone();
        self.node.view.gpu = r.clone();
        // NB: the monitor's first verdict follows no verdict, whatever the Node showed while it
        // waited for the driver or the GPUs (kept failures, with no health label): it is judged
        // as one, against what the last Event said (`announced`).
        let verdict_before = matches!(was, GpuMonitorState::On | GpuMonitorState::NvmlHung);
        let announce = announced(&r, change.prev.filter(|_| verdict_before));
        let told = r.monitoring().then(|| (r.told.clone(), r.node));
        self.show_health(r, change, announce).await;
        // After its Event: an agent stopped before it went out says it again when it restarts.
        if let Some((told, health)) = told {
            told.said(health);
        }
    }

    /// A new TPU report, folded into its tracker (metrics always) and shown when it changed.
    pub(super) async fn apply_tpu(&mut self, report: TpuReport) {
        let Some(change) = self.tpu.fold(report, &self.metrics) else { return };
        let r = self.tpu.report().clone();
        self.node.view.tpu = Some(r.clone());
        let announce = change.announced(&r);
        self.show_health(r, change, announce).await;
    }

    /// One Event per XID episode that began (`VigilGpuXid`), not per event: a GPU repeating an
    /// error is one Event until it has been quiet for `gpu.xid_threshold.window`.
    async fn announce_episodes(&mut self, report: &GpuReport) {
        for b in new_begun(report, &mut self.gpu_begun_seen) {
            let informational = b.action == Some(XidAction::Informational);
            let kind = if informational { EventType::Normal } else { EventType::Warning };
            self.node.event("VigilGpuXid", &b.detail, kind).await;
        }
    }

    /// A report of any kind whose health, headline facts or reasons changed (`change`, from its
    /// tracker), `r` now in the Node's view: the Node, the trail, and when `announce` (the
    /// kind's rule: [`Change::announced`], the GPU's [`announced`]) an Event and (on failure)
    /// an alert.
    async fn show_health<A: Tracked>(&mut self, r: A, change: Change, announce: bool) {
        if r.noted(change.prev) {
            self.note(A::TRAIL, change.detail.clone()).await;
        }
        self.node.publish().await;
        if !announce {
            return;
        }
        let (reason, kind) = event_for(A::NAMES, r.health());
        self.node.event(reason, &change.detail, kind).await;
        if let (Health::Failed, Some(n)) = (r.health(), &self.notifier) {
            let detail = format!("{}; {}", change.detail, A::ADVICE);
            n.send(&Alert::new(A::ALERT, &self.cfg.node_name, detail)).await;
        }
    }

    /// A `gpu-failure-cleared` trail entry for each GPU failure the report clears (by a reset, a
    /// driver reload or a reboot), saying why.
    pub(super) async fn note_cleared(&mut self, report: &GpuReport) {
        for c in new_cleared(report, &mut self.gpu_cleared_seen) {
            let detail =
                format!("{}: failure cleared: {} (it was: {})", c.gpu, c.why, c.causes.join("; "));
            self.note(Code::GpuFailureCleared, detail).await;
        }
    }
}
