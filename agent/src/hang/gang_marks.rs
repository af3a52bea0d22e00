//! A gang's Redis schema, read (the worker's is `crate::hang::marks`): every shard of its view
//! (each member's entry, written by the member's own agent with its cycle's batch) and its state
//! keys (incident, decision, last restart, run of fruitless restarts). Read by a member's agent
//! (`crate::hang::restart::gang`), a checkpoint round, a drill, and `vigil status` / `explain`.

use futures_util::future::join_all;

use crate::clock::Millis;
use crate::coord::{Coordinator, Keys, Result};
use crate::hang::model_gang::{GangState, Member};
use crate::hang::policy_gang as gp;

/// The most entries one read removes from one shard of a view: a shard is sized for this many
/// members, so what a whole gang's replacement left goes in one read, and the script that
/// removes them stays a few tens of KB however many have piled up.
const PRUNED_PER_SHARD: usize = gp::MEMBERS_PER_SHARD as usize;

/// Every member's entry: every shard of the gang's view (one pipelined round trip). With
/// `prune`, the entries not written since then are removed from the view, compare-and-delete:
/// at most [`PRUNED_PER_SHARD`] a shard, one script per shard, the shards at once; best-effort
/// (the next such read tries again). They are still returned: the caller's rules judge them.
///
/// NB: a member departed for good (its pod replaced under a new name: a JobSet's restart) is
/// never written again, while the others' writes keep the hash alive: unpruned, the view of a
/// job restarted often grows without bound, and every full read and checkpoint round reads it
/// all. An entry its member rewrote since this read (back from a long silence) is not the value
/// read: it stays.
pub(crate) async fn read_view(
    coord: &dyn Coordinator,
    k: &Keys,
    gang: &str,
    size: Option<u32>,
    prune: Option<Millis>,
) -> Result<Vec<Member>> {
    let shards: Vec<String> = (0..gp::shards(size)).map(|s| k.gang_members(gang, s)).collect();
    let hashes = coord.hgetall_many(&shards).await?;
    let (mut members, mut prunes) = (Vec::new(), Vec::new());
    for (shard, hash) in shards.iter().zip(hashes) {
        let mut stale = Vec::new();
        for (field, value) in hash {
            let Ok(m) = serde_json::from_str::<Member>(&value) else { continue };
            if prune.is_some_and(|before| m.at < before) && stale.len() < PRUNED_PER_SHARD {
                stale.push((field, value));
            }
            members.push(m);
        }
        if !stale.is_empty() {
            prunes.push(remove_stale(coord, shard, stale));
        }
    }
    join_all(prunes).await;
    Ok(members)
}

/// Remove the `stale` entries (field, value as read) from `shard` where they still hold that
/// value.
async fn remove_stale(coord: &dyn Coordinator, shard: &str, stale: Vec<(String, String)>) {
    match coord.hdel_if_equal(shard, &stale).await {
        Ok(removed) => tracing::debug!(
            shard,
            removed,
            "departed members' entries removed from the gang's view"
        ),
        Err(e) => {
            tracing::warn!(shard, error = %e, "could not remove departed members' entries from the gang's view; the gang's next full read tries again")
        }
    }
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
