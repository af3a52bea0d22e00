//! The admin and status HTTP server: `/metrics`, `/healthz`, `/readyz`, and the local status API
//! (`PUT /v1/workers/{id}/status`) through which workers without a Redis client — or any worker
//! when the agent runs with the embedded coordinator — publish their status record.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
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

/// Longest a `/readyz` check waits on one dependency.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A client that opened a connection and has not sent a whole request head in this long (a
/// half-open or idle keep-alive connection) is dropped, so stuck clients cannot pile up.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A status body is a few short strings; anything bigger is a mistake.
const MAX_STATUS_BODY: usize = 64 * 1024;

/// An oversized body is read and thrown away up to this much, so the client gets its 413
/// instead of a connection reset (closing with unread data makes the kernel send RST, which
/// discards the answer); beyond it the connection is closed.
const MAX_DRAIN: usize = 16 * 1024 * 1024;

/// Longest the agent waits for a status body once the head has arrived.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A dependency `/readyz` waits on besides the coordinator: the container runtime. The server
/// asks only this of it, so observe/ needs no runtime types (runtime/ implements it for
/// `Arc<dyn ContainerRuntime>`); the arrow between the two runs one way.
#[async_trait::async_trait]
pub trait Probe: Send + Sync {
    /// What it is, for the `/readyz` body.
    fn describe(&self) -> String;
    /// One cheap call; `Err` says why it did not answer.
    async fn ping(&self) -> Result<(), String>;
}

#[derive(Clone)]
pub struct ServerState {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub coord: Arc<dyn Coordinator>,
    pub runtime: Arc<dyn Probe>,
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

/// Reads a status body of at most [`MAX_STATUS_BODY`] bytes, answering 413 (after draining, see
/// [`MAX_DRAIN`]) when it is bigger and 408 when the client stalls.
async fn read_status_body(body: Body) -> Result<Bytes, Response> {
    use http_body_util::BodyExt;
    let read = async move {
        let mut body = body;
        let mut kept = Vec::new();
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| (StatusCode::BAD_REQUEST, format!("body: {e}\n")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            seen += data.len();
            if seen <= MAX_STATUS_BODY {
                kept.extend_from_slice(&data);
            } else if seen > MAX_DRAIN {
                break;
            }
        }
        Ok::<_, (StatusCode, String)>((kept, seen))
    };
    match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            format!("body not received within {BODY_READ_TIMEOUT:?}\n"),
        )
            .into_response()),
        Ok(Err(e)) => Err(e.into_response()),
        Ok(Ok((_, seen))) if seen > MAX_STATUS_BODY => Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("status body is limited to {MAX_STATUS_BODY} bytes\n"),
        )
            .into_response()),
        Ok(Ok((kept, _))) => Ok(Bytes::from(kept)),
    }
}

/// The record fields of a status body (pure: fuzzed in `crate::fuzz`), or the answer that says
/// what is wrong with it.
pub(crate) fn status_fields(body: &[u8]) -> Result<Vec<(String, String)>, (StatusCode, String)> {
    let parsed: StatusBody = serde_json::from_slice(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("body must be JSON {{\"state\":..,\"job\":..,\"progress\":..,\"checkpoint_ack\":..}}: {e}\n"),
        )
    })?;
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
        let (code, why) = StatusBody::EMPTY_ERROR;
        return Err((code, why.to_string()));
    }
    Ok(fields)
}

async fn put_status(
    State(s): State<ServerState>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    // A declared length past what would ever be drained is refused before any read: nobody
    // gets to hold a connection for `BODY_READ_TIMEOUT` by announcing gigabytes.
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_DRAIN as u64) {
        let why = format!("status body is limited to {MAX_STATUS_BODY} bytes\n");
        return (StatusCode::PAYLOAD_TOO_LARGE, why).into_response();
    }
    if !valid_worker_id(&id) {
        return (
            StatusCode::BAD_REQUEST,
            "worker id must be 1-128 characters of [A-Za-z0-9._-]\n",
        )
            .into_response();
    }
    let body = match read_status_body(body).await {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    let fields = match status_fields(&body) {
        Ok(f) => f,
        Err(answer) => return answer.into_response(),
    };
    match write_status(s.coord.as_ref(), &s.keys, &id, &fields).await {
        Ok(now) => (StatusCode::OK, format!("{{\"heartbeat_ms\":{now}}}\n")).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

/// Serve until `shutdown` fires, then let requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_router(listener, router(state), shutdown, HEADER_READ_TIMEOUT).await;
    Ok(())
}

/// hyper directly rather than `axum::serve`, which sets no timer and so no header-read timeout:
/// a client that connects and says nothing would hold its connection forever.
pub(crate) async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: CancellationToken,
    header_timeout: Duration,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "status server: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let service = TowerToHyperService::new(app.clone());
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "status server: connection ended with an error");
            }
        });
    }
    connections.close();
    connections.wait().await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use super::{router, serve_router, Probe, ServerState, MAX_STATUS_BODY};
    use crate::clock::SystemClock;
    use crate::coord::memory::MemoryCoordinator;
    use crate::coord::Keys;
    use crate::observe::health::Health;
    use crate::observe::metrics::Metrics;

    /// A runtime that always answers.
    struct Up;

    #[async_trait::async_trait]
    impl Probe for Up {
        fn describe(&self) -> String {
            "test runtime".into()
        }
        async fn ping(&self) -> Result<(), String> {
            Ok(())
        }
    }

    /// A status server on a free port with a short header timeout; stopped when the token drops.
    async fn start(header_timeout: Duration) -> (String, CancellationToken) {
        let state = ServerState {
            metrics: Arc::new(Metrics::new()),
            health: Arc::new(Health::default()),
            coord: Arc::new(MemoryCoordinator::new(Arc::new(SystemClock))),
            runtime: Arc::new(Up),
            keys: Keys::new("vigil", "node-a"),
            max_cycle_age: Duration::from_secs(60),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve_router(
            listener,
            router(state),
            stop.clone(),
            header_timeout,
        ));
        (addr.to_string(), stop)
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_head_is_disconnected() {
        let (addr, stop) = start(Duration::from_millis(200)).await;
        let mut half_open = tokio::net::TcpStream::connect(&addr).await.unwrap();
        half_open.write_all(b"PUT /v1/workers/w/sta").await.unwrap();
        let mut buf = Vec::new();
        // The guard only bounds a hang of the test itself; the server closes after ~200 ms.
        let read = tokio::time::timeout(Duration::from_secs(30), half_open.read_to_end(&mut buf))
            .await
            .expect("the server kept a half-open connection");
        assert!(read.is_err() || buf.is_empty() || String::from_utf8_lossy(&buf).contains("408"));
        // An idle keep-alive connection (no request at all) is dropped the same way.
        let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(30), idle.read(&mut [0u8; 64]))
            .await
            .expect("the server kept an idle connection");
        assert!(matches!(n, Ok(0) | Err(_)));
        stop.cancel();
    }

    #[tokio::test]
    async fn an_oversized_body_gets_413_and_a_small_one_is_accepted() {
        let (addr, stop) = start(Duration::from_secs(10)).await;
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/v1/workers/trainer-0/status");
        let big = format!("{{\"state\":\"{}\"}}", "x".repeat(10 * 1024 * 1024));
        let r = client.put(&url).body(big).send().await.unwrap();
        assert_eq!(r.status(), 413);
        assert!(r
            .text()
            .await
            .unwrap()
            .contains(&MAX_STATUS_BODY.to_string()));
        // The same client (connection reused when kept alive) still works.
        let r = client
            .put(&url)
            .body(r#"{"state":"training"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        stop.cancel();
    }

    /// 200 concurrent scrapes and a burst of junk (raw garbage, bad methods, bad paths, bad
    /// JSON, invalid worker ids, truncated requests): every scrape answers 200, every junk
    /// request gets an answer or a closed connection, never a crash, and the server still
    /// serves afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_scrapes_and_junk_requests_never_break_the_server() {
        let (addr, stop) = start(Duration::from_millis(500)).await;
        let client = reqwest::Client::new();
        let scrapes = (0..200).map(|_| {
            let (client, url) = (client.clone(), format!("http://{addr}/metrics"));
            tokio::spawn(async move { client.get(url).send().await.map(|r| r.status()) })
        });
        let junk: Vec<&[u8]> = vec![
            b"\x00\x01\x02\xff\xfe garbage\r\n\r\n",
            b"BREW /coffee HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
            b"PUT /v1/workers/a:b/status HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
            b"PUT /v1/workers/w/status HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{\"state\":",
            b"PUT /v1/workers/w/status HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{}",
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ];
        let mut raw = Vec::new();
        for _ in 0..20 {
            for (i, j) in junk.iter().enumerate() {
                let (addr, j) = (addr.clone(), j.to_vec());
                raw.push(tokio::spawn(async move {
                    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
                    let _ = c.write_all(&j).await;
                    let mut buf = Vec::new();
                    let read =
                        tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut buf))
                            .await;
                    assert!(
                        read.is_ok(),
                        "junk #{i} held open after {:?}",
                        String::from_utf8_lossy(&buf)
                    );
                }));
            }
        }
        for s in scrapes {
            assert_eq!(s.await.unwrap().unwrap(), 200);
        }
        for r in raw {
            r.await.expect("no panic on junk");
        }
        let r = client
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success() || r.status().as_u16() == 503);
        let r = client
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "still serving");
        stop.cancel();
    }

    #[test]
    fn worker_ids_are_restricted() {
        assert!(crate::model::worker::valid_worker_id("trainer-0.a_b"));
        assert!(!crate::model::worker::valid_worker_id("a:b"));
        assert!(!crate::model::worker::valid_worker_id(""));
        assert!(!crate::model::worker::valid_worker_id("a{b}"));
    }
}
