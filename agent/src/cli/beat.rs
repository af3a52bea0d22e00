//! `vigil beat`: publish a worker's status record (for shell workers), to Redis or to an agent's
//! worker API (TCP with the worker's token, or the unix socket, where the kernel names the
//! worker's container).

use std::path::Path;
use std::time::Duration;

use super::{failed, BeatArgs, CliError};
use crate::config::Config;
use crate::coord::redis::RedisCoordinator;
use crate::coord::{heartbeat_value, write_status, Keys};
use crate::http::http_error;

/// Where `scripts/run.sh` (scripts/local.toml) serves the worker API.
const LOCAL_DEFAULT: &str = "http://127.0.0.1:9465";

/// `vigil beat`: the fields given, sent to Redis or to an agent's worker API.
pub(super) async fn command(args: BeatArgs) -> Result<(), CliError> {
    let cfg = super::load(&args.config)?;
    let fields: Vec<(String, String)> = [
        ("state", args.state),
        ("job", args.job),
        ("gang", args.gang),
        ("gang_size", args.gang_size),
        ("progress", args.progress),
        ("checkpoint_ack", args.checkpoint_ack),
        ("checkpoint_step", args.checkpoint_step),
        ("compute_ms", args.compute_ms),
        ("grace", args.grace),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
    .collect();
    let agent = args.agent.or_else(|| cfg.embedded().then(|| local_worker_api(&cfg)));
    if let Some(agent) = agent {
        return to_agent(&agent, &args.worker, fields, args.token_file.as_deref()).await;
    }
    let coord = RedisCoordinator::from_config(&cfg.redis).map_err(failed)?;
    let keys = Keys::new(&cfg.redis.key_prefix, &cfg.node_name);
    let now =
        write_status(&coord, &keys, &args.worker, &fields, "heartbeat").await.map_err(failed)?;
    println!("{} heartbeat={}", keys.status(&args.worker), heartbeat_value(now));
    Ok(())
}

/// This node's worker API as `[worker_api]` configures it: the TCP listener (on loopback when
/// it listens on every address), else the unix socket, else where `scripts/run.sh` serves it.
fn local_worker_api(cfg: &Config) -> String {
    let socket = &cfg.worker_api.socket;
    match cfg.worker_api.listen {
        Some(addr) => super::local_url(addr),
        None if !socket.as_os_str().is_empty() => format!("unix:{}", socket.display()),
        None => LOCAL_DEFAULT.to_string(),
    }
}

async fn to_agent(
    agent: &str,
    worker: &str,
    fields: Vec<(String, String)>,
    token_file: Option<&Path>,
) -> Result<(), CliError> {
    let body: serde_json::Map<String, serde_json::Value> =
        fields.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
    let (client, url) = client_for(agent, &format!("/v1/workers/{worker}/status"))?;
    let mut req = client.put(&url).timeout(Duration::from_secs(10)).json(&body);
    if let Some(file) = token_file {
        let token = std::fs::read_to_string(file)
            .map_err(|e| CliError::Failed(format!("token file {}: {e}", file.display())))?;
        req = req.bearer_auth(token.trim());
    }
    // NB: what is printed of the address: a URL could carry credentials.
    let agent = &crate::redact::url(agent);
    let resp = req.send().await.map_err(|e| {
        CliError::Failed(format!("the agent at {agent} did not answer: {}", http_error(e)))
    })?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let why = format!("the agent at {agent} refused the beat: {status} {}", text.trim());
        return Err(CliError::Failed(why));
    }
    println!("beat sent to {agent}");
    // A shell worker learns of a checkpoint request here (a signal carries no id): it saves,
    // then acknowledges exactly this id with `--checkpoint-ack <id>`.
    let answer: serde_json::Value = resp.json().await.unwrap_or_default();
    if let Some(id) = answer.get("checkpoint_request").and_then(|v| v.as_str()) {
        let reason = answer.get("checkpoint_reason").and_then(|v| v.as_str()).unwrap_or_default();
        println!("checkpoint_request={id} checkpoint_reason={reason}");
    }
    Ok(())
}

/// A client for the agent's address (`http(s)://…` or `unix:<socket>`) and the URL of `path`
/// there.
pub(super) fn client_for(agent: &str, path: &str) -> Result<(reqwest::Client, String), CliError> {
    let builder = reqwest::Client::builder();
    // NB: plain HTTP needs no CA roots, and a worker image may have none (loading them fails).
    let builder = if agent.starts_with("https://") { builder } else { builder.tls_certs_only([]) };
    let (client, url) = match agent.strip_prefix("unix:") {
        Some(socket) => (builder.unix_socket(socket).build(), format!("http://localhost{path}")),
        None => (builder.build(), format!("{}{path}", agent.trim_end_matches('/'))),
    };
    Ok((client.map_err(|e| failed(format!("HTTP client: {}", http_error(e))))?, url))
}
