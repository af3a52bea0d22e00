//! `vigil explain`: the decision trail of a node, oldest first, then whether the checkpoint
//! budgets fit that node's worker pods (`super::budget`): a checkpoint that timed out is often a
//! budget the platform never gave. Without a Redis URL of its own it asks the local agent for
//! this node's trail (`GET /v1/trail`, on the agent's HTTP port).

use super::{failed, local_agent, CliError};
use crate::config::Config;
use crate::coord::redis::RedisCoordinator;
use crate::coord::{Coordinator, Keys};

pub(super) async fn run(cfg: &Config, node: Option<String>, limit: usize) -> Result<(), CliError> {
    let node = node.unwrap_or_else(|| cfg.node_name.clone());
    if cfg.embedded() {
        // NB: the local agent knows its own trail only: another node's lives in Redis.
        if node != cfg.node_name {
            return Err(CliError::Failed(format!(
                "without a Redis URL only this node's trail can be read, from its agent; node {node}'s is in Redis: set REDIS_URL (or redis.url)"
            )));
        }
        print!(
            "{}",
            local_agent(cfg, &format!("/v1/trail?limit={limit}")).await?
        );
        print!("{}", super::budget::check(cfg, &node).await.render());
        return Ok(());
    }
    let coord: Box<dyn Coordinator> =
        Box::new(RedisCoordinator::from_config(&cfg.redis).map_err(failed)?);
    let keys = Keys::new(&cfg.redis.key_prefix, &node);
    let entries = coord
        .read_recent(&keys.trail(), limit)
        .await
        .map_err(failed)?;
    print!("{}", crate::trail::render(&node, &entries));
    print!("{}", super::budget::check(cfg, &node).await.render());
    Ok(())
}
