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
use crate::vocab::stand_down::{NodeFacts, SharedFacts};

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
    /// The controller's facts as they stand (a writer that panicked left them readable).
    pub(crate) fn read_facts(&self) -> std::sync::RwLockReadGuard<'_, NodeFacts> {
        self.facts.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the TPU monitor's last report says the node's TPU has failed.
    pub(crate) fn tpu_failed(&self) -> bool {
        let failed = |t: &TpuReport| t.monitoring && t.health == TpuHealth::Failed;
        self.tpu.as_ref().is_some_and(|rx| failed(&rx.borrow()))
    }

    /// Why the node, as it is *now*, forbids a restart: the agent is shutting down, it has not
    /// read its node yet since it started, a maintenance notice arrived, the worker's GPU or the
    /// node's TPU failed, or the node is being drained (cordoned, or going away: a restart would
    /// race the platform or a person). Read when the restart is decided and again right before
    /// the command, because the pipeline can take a minute (logs, alert retries).
    pub(crate) fn stand_down(
        &self,
        c: &Container,
        now: Millis,
        md: &MetadataConfig,
    ) -> Option<StandDown> {
        if self.term.is_cancelled() {
            return Some(StandDown::ShuttingDown);
        }
        // NB: the bound (`metadata.first_read_wait`) is read here, with the clock: it holds
        // whatever the controller that clears the wait does.
        if let Some(what) = self.read_facts().unread_at(tokio::time::Instant::now()) {
            return Some(StandDown::Unread(what));
        }
        if self.read_facts().stands_down(now, md) {
            return Some(StandDown::Maintenance);
        }
        if let Some(rx) = &self.gpu {
            let gpu = rx.borrow();
            if gpu.failures_known() && gpu_policy::worker_on_failed_gpu(&gpu, c.gpus.as_deref()) {
                return Some(StandDown::GpuFailed);
            }
        }
        if self.tpu_failed() {
            return Some(StandDown::TpuFailed);
        }
        let info = self.node_info.as_ref()?.borrow();
        crate::vocab::stand_down::being_drained(info.as_ref()).map(StandDown::Drained)
    }
}

/// Why the node forbids a restart right now (see [`NodeWatch::stand_down`]); its words are the
/// trail's and the gang's blockers'.
#[derive(Debug, Clone, PartialEq, Eq, strum::Display)]
pub(crate) enum StandDown {
    #[strum(to_string = "the agent is shutting down")]
    ShuttingDown,
    /// The agent has not read this (its node's maintenance state, the Node) since it started.
    #[strum(
        to_string = "the agent has not read {0} since it started (restarts wait for it, at most metadata.first_read_wait)"
    )]
    Unread(&'static str),
    #[strum(to_string = "a maintenance notice arrived")]
    Maintenance,
    #[strum(to_string = "the worker's GPU failed")]
    GpuFailed,
    #[strum(to_string = "the node's TPU failed")]
    TpuFailed,
    /// A cordon, or the node going away: why.
    #[strum(transparent)]
    Drained(String),
}

impl StandDown {
    /// It passes by itself within seconds (the start-up wait for the first reads): the trail
    /// says it each time (its once-per-incident note stays free for a lasting condition), and a
    /// gang member's wait defers its gang's decision instead of blocking it with a page
    /// (`crate::hang::policy_gang::starting`).
    pub(crate) fn passing(&self) -> bool {
        matches!(self, StandDown::Unread(_))
    }
}
