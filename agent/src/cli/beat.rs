//! `vigil beat`: publish a worker's status record (for shell workers), to Redis or, without it,
//! to the local agent's status API.

use std::time::Duration;

use super::CliError;
use crate::config::Config;
use crate::coord::redis::RedisCoordinator;
use crate::coord::{heartbeat_value, write_status, Keys};

pub(super) async fn run(
    cfg: &Config,
    worker: &str,
    fields: Vec<(String, String)>,
    agent: &str,
) -> Result<(), CliError> {
    if cfg.embedded() {
        let body: serde_json::Map<String, serde_json::Value> = fields
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect();
        let url = format!("{}/v1/workers/{worker}/status", agent.trim_end_matches('/'));
        let resp = reqwest::Client::new()
            .put(&url)
            .timeout(Duration::from_secs(10))
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                CliError::Failed(format!(
                    "no REDIS_URL, and the local agent at {url} did not answer: {e}"
                ))
            })?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(CliError::Failed(format!(
                "agent at {url} refused the beat: {status} {}",
                text.trim()
            )));
        }
        println!("beat sent to {url}");
        return Ok(());
    }
    let coord =
        RedisCoordinator::from_config(&cfg.redis).map_err(|e| CliError::Failed(e.to_string()))?;
    let keys = Keys::new(&cfg.redis.key_prefix, &cfg.node_name);
    let now = write_status(&coord, &keys, worker, &fields)
        .await
        .map_err(|e| CliError::Failed(e.to_string()))?;
    println!("{} heartbeat={}", keys.status(worker), heartbeat_value(now));
    Ok(())
}
