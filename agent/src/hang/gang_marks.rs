//! A gang's Redis schema, read (the worker's is `crate::hang::marks`): every shard of its view
//! (each member's entry, written by the member's own agent with its cycle's batch) and its state
//! keys (incident, decision, last restart, run of fruitless restarts). Read by a member's agent
//! (`crate::hang::restart::gang`), a checkpoint round, a drill, and `vigil status` / `explain`.

use crate::coord::{Coordinator, Keys, Result};
use crate::hang::model_gang::{GangState, Member};
use crate::hang::policy_gang as gp;

/// Every member's entry: every shard of the gang's view (one pipelined round trip).
pub(crate) async fn read_view(
    coord: &dyn Coordinator,
    k: &Keys,
    gang: &str,
    size: Option<u32>,
) -> Result<Vec<Member>> {
    let shards: Vec<String> = (0..gp::shards(size)).map(|s| k.gang_members(gang, s)).collect();
    let hashes = coord.hgetall_many(&shards).await?;
    let entries = hashes.iter().flat_map(|h| h.values());
    Ok(entries.filter_map(|v| serde_json::from_str(v).ok()).collect())
}

/// The gang's incident, decision, last restart and run of fruitless restarts (one round trip,
/// one slot).
pub(crate) async fn read_state(coord: &dyn Coordinator, k: &Keys, gang: &str) -> Result<GangState> {
    let state_keys = [
        k.gang_incident(gang),
        k.gang_decision(gang),
        k.gang_restarted(gang),
        k.gang_fruitless(gang),
    ];
    Ok(GangState::decode(&coord.get_many(&state_keys).await?))
}
