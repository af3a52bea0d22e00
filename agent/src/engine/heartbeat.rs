//! The heartbeat: re-publishes this node's record for the fleet view when no cycle has for a
//! while, so a long cycle (a restart can take minutes) never lets the record expire. A node
//! whose cycles run costs nothing here: the cycle publishes, once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::coord::{Coordinator, Keys};
use crate::observe::fleet::{publish, NodeRecord};

/// The record the agent last published, and when, shared with [`heartbeat_loop`].
pub(crate) type SharedRecord = Arc<Mutex<Option<(NodeRecord, tokio::time::Instant)>>>;

/// Re-publish the last record, stamped with the coordinator's clock, whenever it is `every`
/// old, until `stop`: the agent loop may be busy with a restart for minutes, the node is not
/// down.
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
        let Some((mut rec, published)) = rec else {
            continue;
        };
        if published.elapsed() < every {
            continue;
        }
        let Ok(now) = coord.time().await else {
            continue;
        };
        rec.updated_at = now;
        match publish(coord.as_ref(), &keys, &rec, ttl).await {
            Ok(()) => {
                if let Ok(mut shared) = record.lock() {
                    let newer = shared.as_ref().is_some_and(|(_, t)| *t > published);
                    if !newer {
                        *shared = Some((rec, tokio::time::Instant::now()));
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "heartbeat not published"),
        }
    }
}
