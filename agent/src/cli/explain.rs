//! `vigil explain`: the decision trail of a node, oldest first, then whether the checkpoint
//! budgets fit that node's worker pods (`super::budget`): a checkpoint that timed out is often a
//! budget the platform never gave.

use super::{failed, CliError};
use crate::config::Config;
use crate::coord::redis::RedisCoordinator;
use crate::coord::{Coordinator, Keys};

pub(super) async fn run(cfg: &Config, node: Option<String>, limit: usize) -> Result<(), CliError> {
    if cfg.embedded() {
        return Err(CliError::Failed(
            "explain reads the trail from Redis: set REDIS_URL (with the embedded coordinator the trail lives in the agent's memory and its log)".into(),
        ));
    }
    let node = node.unwrap_or_else(|| cfg.node_name.clone());
    let coord = RedisCoordinator::from_config(&cfg.redis).map_err(failed)?;
    let keys = Keys::new(&cfg.redis.key_prefix, &node);
    let entries = coord
        .read_recent(&keys.trail(), limit)
        .await
        .map_err(failed)?;
    print!("{}", crate::observe::trail::render(&node, &entries));
    print!("{}", super::budget::check(cfg, &node).await.render());
    Ok(())
}
