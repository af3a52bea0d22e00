//! `vigil status`: the fleet from Redis, per node and per slice (`--json` for a trainer to poll).

use super::{failed, CliError};
use crate::config::Config;
use crate::coord::redis::RedisCoordinator;
use crate::coord::Coordinator;
use crate::observe::fleet;

pub(super) async fn run(cfg: &Config, json: bool) -> Result<(), CliError> {
    if cfg.embedded() {
        return Err(CliError::Failed(
            "status reads the fleet from Redis: set REDIS_URL".into(),
        ));
    }
    let coord = RedisCoordinator::from_config(&cfg.redis).map_err(failed)?;
    let now = coord.time().await.map_err(failed)?;
    let (views, last_slice) = fleet::read(&coord, &cfg.redis.key_prefix)
        .await
        .map_err(failed)?;
    let slices = fleet::slices(&views, &last_slice);
    if json {
        let body = serde_json::json!({ "at": now, "nodes": views, "slices": slices });
        println!(
            "{}",
            serde_json::to_string_pretty(&body).unwrap_or_default()
        );
    } else {
        print!("{}", fleet::render(&views, &slices, now));
    }
    Ok(())
}
