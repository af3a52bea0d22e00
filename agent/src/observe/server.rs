//! The admin and status HTTP server: `/metrics`, `/healthz`, `/readyz`, and the local status API
//! (`PUT /v1/workers/{id}/status`) through which workers without a Redis client — or any worker
//! when the agent runs with the embedded coordinator — publish their status record.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::Router;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::coord::{write_status, Coordinator, Keys};
use crate::model::worker::valid_worker_id;
use crate::observe::health::Health;
use crate::observe::metrics::Metrics;
use crate::runtime::ContainerRuntime;

/// Longest a `/readyz` check waits on one dependency.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct ServerState {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub coord: Arc<dyn Coordinator>,
    pub runtime: Arc<dyn ContainerRuntime>,
    pub keys: Keys,
    /// A loop that has not finished a cycle for this long is wedged.
    pub max_cycle_age: Duration,
}

/// Body of `PUT /v1/workers/{id}/status`; `heartbeat` is stamped by the agent. Every field is
/// optional, but at least one must be given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatusBody {
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub job: Option<String>,
    #[serde(default)]
    pub progress: Option<String>,
    /// Acknowledges a checkpoint request (ideally with its id).
    #[serde(default)]
    pub checkpoint_ack: Option<String>,
}

impl StatusBody {
    const EMPTY_ERROR: (StatusCode, &'static str) = (
        StatusCode::BAD_REQUEST,
        "give at least one of state, job, progress, checkpoint_ack\n",
    );
}

pub(crate) fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/workers/{id}/status", put(put_status).post(put_status))
        .with_state(state)
}

/// OpenMetrics for scrapers that ask for it (Prometheus does), the classic text format for the
/// rest (`curl`, `promtool check metrics`).
async fn metrics(State(s): State<ServerState>, headers: axum::http::HeaderMap) -> Response {
    let wants_openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let text = s.metrics.encode();
    if wants_openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            crate::observe::metrics::to_classic_text(&text),
        )
            .into_response()
    }
}

async fn healthz(State(s): State<ServerState>) -> Response {
    if s.health.alive(s.max_cycle_age).await {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the evaluation loop has not completed a cycle recently\n",
        )
            .into_response()
    }
}

async fn readyz(State(s): State<ServerState>) -> Response {
    let mut problems = Vec::new();
    // NB: a probe never blocks on a dependency: each check gets a short deadline of its own,
    // and both run at once.
    let (coord, runtime) = tokio::join!(
        tokio::time::timeout(PROBE_TIMEOUT, s.coord.ping()),
        tokio::time::timeout(PROBE_TIMEOUT, s.runtime.ping()),
    );
    match coord {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("coordinator: {e}")),
        Err(_) => problems.push(format!("coordinator: no answer within {PROBE_TIMEOUT:?}")),
    }
    match runtime {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("runtime: {e}")),
        Err(_) => problems.push(format!(
            "runtime: {} did not answer within {PROBE_TIMEOUT:?}",
            s.runtime.describe()
        )),
    }
    // Warnings do not make the agent unready (a DaemonSet rollout would stall on them), but
    // they are in the detail, where `kubectl describe` and a probe's output show them.
    let warnings = s.health.warnings.lines();
    if problems.is_empty() {
        let mut body = "ready\n".to_string();
        for w in warnings {
            body.push_str(&format!("warning: {w}\n"));
        }
        (StatusCode::OK, body).into_response()
    } else {
        problems.extend(warnings.into_iter().map(|w| format!("warning: {w}")));
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", problems.join("\n")),
        )
            .into_response()
    }
}

async fn put_status(State(s): State<ServerState>, Path(id): Path<String>, body: Bytes) -> Response {
    if !valid_worker_id(&id) {
        return (
            StatusCode::BAD_REQUEST,
            "worker id must be 1-128 characters of [A-Za-z0-9._-]\n",
        )
            .into_response();
    }
    let parsed: StatusBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("body must be JSON {{\"state\":..,\"job\":..,\"progress\":..,\"checkpoint_ack\":..}}: {e}\n"),
            )
                .into_response()
        }
    };
    let fields: Vec<(String, String)> = [
        ("state", parsed.state),
        ("job", parsed.job),
        ("progress", parsed.progress),
        ("checkpoint_ack", parsed.checkpoint_ack),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
    .collect();
    if fields.is_empty() {
        return (StatusBody::EMPTY_ERROR.0, StatusBody::EMPTY_ERROR.1).into_response();
    }
    match write_status(s.coord.as_ref(), &s.keys, &id, &fields).await {
        Ok(now) => (StatusCode::OK, format!("{{\"heartbeat_ms\":{now}}}\n")).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

/// Serve until `shutdown` fires.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    #[test]
    fn worker_ids_are_restricted() {
        assert!(crate::model::worker::valid_worker_id("trainer-0.a_b"));
        assert!(!crate::model::worker::valid_worker_id("a:b"));
        assert!(!crate::model::worker::valid_worker_id(""));
        assert!(!crate::model::worker::valid_worker_id("a{b}"));
    }
}
