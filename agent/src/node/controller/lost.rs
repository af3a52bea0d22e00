//! The node controller's share of the time lost (`crate::hang::policy_lost`): a maintenance or
//! preemption from its notice to its end or the node's going, and each failed GPU while failed.
//! The restart path counts the incidents' own.

use crate::accel::gpu::model::{GpuHealth, GpuReport};
use crate::clock::{Clock, Millis, SystemClock};
use crate::hang::policy_lost::Interrupted;
use crate::trail::Code;
use crate::vocab::maintenance::Interruption;

use super::Controller;

/// What is being lost now.
#[derive(Debug, Default)]
pub(super) struct Losses {
    interrupted: Option<Interrupted>,
    /// The failed GPUs at the last GPU report, and when it came (monotonic: no clock read of
    /// the coordinator on every report).
    failed_gpus: Option<(usize, tokio::time::Instant)>,
}

impl Controller {
    /// An interruption of this `kind` begins at `now` (its notice): its time is lost from here
    /// until [`Controller::end_interruption`].
    pub(super) fn begin_interruption(&mut self, kind: Interruption, now: Millis) {
        let cause = if kind == Interruption::Preemption { "preemption" } else { "maintenance" };
        self.losses.interrupted = Some(Interrupted { cause, notice: now, checkpoint: None });
    }

    /// A checkpoint round ended: the interruption under way has had its checkpoint.
    pub(super) fn lose_to_round(&mut self, now: Millis) {
        if let Some(i) = self.losses.interrupted.as_mut() {
            i.checkpoint.get_or_insert(now);
        }
    }

    /// The interruption under way ends at `now` (`how`): counted, and said in the trail.
    pub(super) async fn end_interruption(&mut self, now: Millis, how: &str) {
        let Some(i) = self.losses.interrupted.take() else { return };
        let (total, line) = i.ended(now, how);
        self.metrics.lost.add(i.cause, total, now);
        self.note(Code::TimeLost, line).await;
    }

    /// Each failed GPU of the last report lost the time since then (GPU-seconds).
    pub(super) fn lose_to_gpus(&mut self, report: &GpuReport) {
        let now = tokio::time::Instant::now();
        if let Some((failed, at)) = self.losses.failed_gpus {
            let ms = now.duration_since(at).as_millis().min(i64::MAX as u128) as Millis;
            // The node's clock only places the time in the last day's hourly ledger.
            self.metrics.lost.add("gpu-failed", failed as Millis * ms, SystemClock.now());
        }
        let known = report.failures_known();
        let failed = report.gpus.iter().filter(|g| known && g.health == GpuHealth::Failed).count();
        self.losses.failed_gpus = Some((failed, now));
    }
}
