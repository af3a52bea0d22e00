//! The heartbeat: re-publishes this node's record for the fleet view between cycles, so a long
//! cycle (a restart can take minutes) never lets the record expire.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::coord::{Coordinator, Keys};
use crate::observe::fleet::{publish, NodeRecord};

/// The record the agent last computed, shared with [`heartbeat_loop`].
pub(crate) type SharedRecord = Arc<Mutex<Option<NodeRecord>>>;

/// Re-publish the last record every `every`, stamped with the coordinator's clock, until
/// `stop`: the agent loop may be busy with a restart for minutes, the node is not down.
pub(crate) async fn heartbeat_loop(
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    record: SharedRecord,
    every: Duration,
    ttl: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let rec = record.lock().map(|r| r.clone()).unwrap_or(None);
        let Some(mut rec) = rec else { continue };
        let Ok(now) = coord.time().await else {
            continue;
        };
        rec.updated_at = now;
        if let Err(e) = publish(coord.as_ref(), &keys, &rec, ttl).await {
            tracing::debug!(error = %e, "heartbeat not published");
        }
    }
}
