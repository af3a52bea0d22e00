//! `vigil explain`: the decision trail of a node, oldest first, then the gangs its workers are
//! members of (`crate::fleet::gangs`), then whether the checkpoint
//! budgets fit that node's worker pods (`super::budget`): a checkpoint that timed out is often a
//! budget the platform never gave. Without a Redis URL of its own it asks the local agent for
//! this node's trail (`GET /v1/trail`, on the agent's HTTP port).

use super::{failed, local_agent, CliError};
use crate::config::Config;
use crate::coord::redis::RedisCoordinator;
use crate::coord::{Coordinator, Keys};
use crate::fleet::gangs;
use crate::fleet::view::NodeRecord;

pub(super) async fn run(cfg: &Config, node: Option<String>, limit: usize) -> Result<(), CliError> {
    let node = node.unwrap_or_else(|| cfg.node_name.clone());
    if cfg.embedded() {
        // NB: the local agent knows its own trail only: another node's lives in Redis.
        if node != cfg.node_name {
            return Err(failed(format!(
                "without a Redis URL only this node's trail can be read, from its agent; node {node}'s is in Redis: set REDIS_URL (or redis.url)"
            )));
        }
        print!("{}", local_agent(cfg, &format!("/v1/trail?limit={limit}")).await?);
    } else {
        let coord: &dyn Coordinator = &RedisCoordinator::from_config(&cfg.redis).map_err(failed)?;
        let keys = Keys::new(&cfg.redis.key_prefix, &node);
        let entries = coord.read_recent(&keys.trail(), limit).await.map_err(failed)?;
        print!("{}", crate::trail::render(&node, &entries));
        print!("{}", gangs_of(coord, cfg, &keys).await?);
    }
    print!("{}", super::budget::check(cfg, &node).await.render());
    Ok(())
}

/// The gangs this node's workers are members of (from its node record), each with its verdict,
/// incident, decision and blockers.
async fn gangs_of(coord: &dyn Coordinator, cfg: &Config, keys: &Keys) -> Result<String, CliError> {
    let record = coord.hgetall(&keys.agent()).await.map_err(failed)?;
    let Some(rec) = NodeRecord::from_fields(&record) else { return Ok(String::new()) };
    let now = coord.time().await.map_err(failed)?;
    let timing = crate::hang::policy_gang::Timing::of(cfg);
    let prefix = &cfg.redis.key_prefix;
    let views =
        gangs::views(coord, prefix, &timing, rec.gangs.into_values(), now).await.map_err(failed)?;
    Ok(gangs::render(&views, now))
}
