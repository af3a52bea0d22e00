//! `[fleet]`: the node's place in the fleet (pool, slice) and its heartbeat record.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// Node pool this node belongs to; env `VIGIL_POOL`.
    pub pool: String,
    /// Slice (a group of nodes that train together, e.g. a TPU slice); env `VIGIL_SLICE`.
    pub(crate) slice: String,
    /// The agent's heartbeat record expires after this; a node silent longer is "down".
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(60)))]
    pub heartbeat_ttl: Duration,
}
