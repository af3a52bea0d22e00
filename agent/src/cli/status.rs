//! `vigil status`: the fleet from Redis, per node and per slice (`--json` for a trainer to poll).
//! Without a Redis URL of its own (the embedded coordinator, or a config that leaves the agent's
//! `REDIS_URL` to its environment) it asks the local agent, which serves the same read-only on
//! its HTTP port (`GET /v1/status`).

use super::{failed, local_agent, CliError};
use crate::config::Config;
use crate::coord::redis::RedisCoordinator;
use crate::fleet::view as fleet;

pub(super) async fn run(cfg: &Config, json: bool) -> Result<(), CliError> {
    if cfg.embedded() {
        let query = if json { "?format=json" } else { "" };
        print!("{}", local_agent(cfg, &format!("/v1/status{query}")).await?);
        return Ok(());
    }
    let coord = RedisCoordinator::from_config(&cfg.redis).map_err(failed)?;
    let timing = crate::hang::policy_gang::Timing::of(cfg);
    let text = fleet::report(&coord, &cfg.redis.key_prefix, json, &timing).await.map_err(failed)?;
    print!("{text}");
    Ok(())
}
