//! The worker write API: every write, by how it ended, so a refused worker (a missing token, a
//! token of another pod) shows on a dashboard and not only in the agent's log.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Labels;

#[derive(Default)]
pub(crate) struct WorkerApiMetrics {
    /// A write's listener (`tcp`, `unix`) and outcome (`accepted`, `read`, `unauthenticated`,
    /// `forbidden`, `unavailable`, `invalid`).
    pub(crate) writes: Family<Labels<2>, Counter>,
}

impl WorkerApiMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        let m = WorkerApiMetrics::default();
        register!(reg;
            "worker_api_writes" => m.writes,
                "Requests to the worker API by listener (tcp, unix) and outcome (accepted: a write stored, read: a record read, unauthenticated, forbidden, unavailable, invalid)";
        );
        m
    }

    pub(crate) fn write(&self, listener: &'static str, outcome: &'static str) {
        self.writes.get_or_create(&[("listener", listener), ("outcome", outcome)]).inc();
    }
}
