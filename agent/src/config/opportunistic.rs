//! `[opportunistic]`: offering an idle node for maintenance, one node of a pool at a time.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct OpportunisticConfig {
    /// Opt-in: label the node `cloud.google.com/perform-maintenance=true` when it is idle.
    pub enabled: bool,
    /// Every worker idle at least this long.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30 * 60)))]
    pub idle_for: Duration,
    /// Other nodes of the pool that must remain serving (healthy, with no maintenance notice or
    /// only a pending one).
    #[educe(Default(expression = 1))]
    pub min_nodes: u32,
    /// The pool claim's TTL (one node of a pool at a time), renewed by its holder every poll:
    /// how long a claim outlives a holder that stopped renewing it.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(2 * 3600)))]
    pub(crate) claim_ttl: Duration,
}
