//! What makes the node forbid restarts, read at the moment it matters: the agent's own shutdown,
//! maintenance (from the controller's shared facts) and the worker's GPU (from the monitor).

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::accel::gpu::model::GpuReport;
use crate::accel::gpu::policy as gpu_policy;
use crate::accel::tpu::model::{TpuHealth, TpuReport};
use crate::clock::Millis;
use crate::config::MetadataConfig;
use crate::runtime::container::Container;
use crate::vocab::node_info::NodeInfo;
use crate::vocab::stand_down::SharedFacts;

/// The agent's view of the node's state, fed by other tasks.
#[derive(Default)]
pub(crate) struct NodeWatch {
    /// Fired at SIGTERM: a restart that has not started by then does not start.
    pub(crate) term: CancellationToken,
    /// Maintenance state from the controller (restarts stand down while it says so).
    pub(crate) facts: SharedFacts,
    /// GPU reports from the NVML monitor.
    pub(crate) gpu: Option<watch::Receiver<GpuReport>>,
    /// TPU reports from the TPU monitor.
    pub(crate) tpu: Option<watch::Receiver<TpuReport>>,
    /// The Node as last read (pool, provisioning, accelerator, TPU topology) for the record.
    pub(crate) node_info: Option<watch::Receiver<Option<NodeInfo>>>,
}

impl NodeWatch {
    /// Whether maintenance stands restarts down at `now` (coordinator clock).
    pub(crate) fn stands_down_at(&self, now: Millis, md: &MetadataConfig) -> bool {
        let f = self.facts.read().unwrap_or_else(|p| p.into_inner());
        f.stands_down(now, md)
    }

    /// Whether the TPU monitor's last report says the node's TPU has failed.
    pub(crate) fn tpu_failed(&self) -> bool {
        self.tpu.as_ref().is_some_and(|rx| {
            let t = rx.borrow();
            t.monitoring && t.health == TpuHealth::Failed
        })
    }

    /// Why the node, as it is *now*, forbids a restart: the agent is shutting down, a
    /// maintenance notice arrived, the worker's GPU or the node's TPU failed, or the node is
    /// being drained (cordoned, or going away: a restart would race the platform or a person).
    /// Read when the restart is decided and again right before the command, because the
    /// pipeline can take a minute (logs, alert retries).
    pub(crate) fn stand_down(
        &self,
        c: &Container,
        now: Millis,
        md: &MetadataConfig,
    ) -> Option<String> {
        // NB: the shutdown first (`conditions` says it), then the wait, then the rest.
        let shutting_down = self.term.is_cancelled();
        let waiting = self.awaiting().filter(|_| !shutting_down);
        waiting.or_else(|| self.conditions(c, now, md))
    }

    /// Why restarts wait for the agent's first reads of the node, while they do (at most
    /// `metadata.first_read_wait` after the start: the bound is read here, with the clock).
    pub(crate) fn awaiting(&self) -> Option<String> {
        let f = self.facts.read().unwrap_or_else(|p| p.into_inner());
        let what = f.unread_at(tokio::time::Instant::now())?;
        Some(format!(
            "the agent has not read {what} since it started (restarts wait for it, at most metadata.first_read_wait)"
        ))
    }

    /// [`NodeWatch::stand_down`] without the wait for the first reads: the conditions that
    /// last (the shutdown, a maintenance, a failed accelerator, a drain), which a gang member's
    /// entry tells the other members' agents (a wait for the first reads only defers the
    /// gang's decision: `crate::hang::policy_gang::starting`).
    pub(crate) fn conditions(
        &self,
        c: &Container,
        now: Millis,
        md: &MetadataConfig,
    ) -> Option<String> {
        if self.term.is_cancelled() {
            return Some("the agent is shutting down".into());
        }
        if self.stands_down_at(now, md) {
            return Some("a maintenance notice arrived".into());
        }
        if let Some(rx) = &self.gpu {
            let gpu = rx.borrow();
            if gpu.failures_known() && gpu_policy::worker_on_failed_gpu(&gpu, c.gpus.as_deref()) {
                return Some("the worker's GPU failed".into());
            }
        }
        if self.tpu_failed() {
            return Some("the node's TPU failed".into());
        }
        let node = self.node_info.as_ref()?;
        let info = node.borrow();
        crate::vocab::stand_down::being_drained(info.as_ref())
    }
}
