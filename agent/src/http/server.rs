//! The read-only HTTP server Prometheus and the kubelet's probes reach: `/metrics`, `/healthz`,
//! `/readyz`, GET only. Workers write on their own, authenticated listener
//! (`crate::worker_api`); a write sent here is refused with a pointer to it.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::coord::{Coordinator, Keys, Result};
use crate::http::health::Health;
use crate::http::listen::{serve_router, Limits};
use crate::metrics::Metrics;

/// Longest a `/readyz` check waits on one dependency.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A client that opened a connection and has not sent a whole request head in this long (a
/// half-open or idle keep-alive connection) is dropped, so stuck clients cannot pile up. A real
/// client sends its head at once: a few seconds is plenty on any network.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The metrics port serves Prometheus and the kubelet's probes: a few clients, small heads. A
/// peer holds at most 16 connections, the port 64; past either, the connection idle the longest
/// gives way (`crate::http::admission`), so idle junk never keeps a probe out.
const LIMITS: Limits = Limits {
    header_timeout: HEADER_READ_TIMEOUT,
    max_head: 16 * 1024,
    max_connections: 64,
    per_peer: 16,
    max_age: Duration::from_secs(300),
};

/// A dependency `/readyz` waits on besides the coordinator: the container runtime. The server
/// asks only this of it, so observe/ needs no runtime types (runtime/ implements it for
/// `Arc<dyn ContainerRuntime>`); the arrow between the two runs one way.
#[async_trait::async_trait]
pub(crate) trait Probe: Send + Sync {
    /// What it is, for the `/readyz` body.
    fn describe(&self) -> String;
    /// One cheap call; `Err` says why it did not answer (the dependency's own error, its cause
    /// kept: the server names no runtime type).
    async fn ping(&self) -> Result<(), ProbeError>;
}

/// Why a dependency did not answer a readiness probe.
pub(crate) type ProbeError = Box<dyn std::error::Error + Send + Sync>;

/// What `/v1/status` answers: the fleet view as `vigil status` words it, read from the server's
/// own coordinator under its prefix. The fleet feature implements it
/// (`crate::fleet::view::StatusPage`) and the wiring hands it in, so the server names no feature.
#[async_trait::async_trait]
pub(crate) trait StatusReport: Send + Sync {
    /// The report as text, or as JSON; an error when the coordinator cannot be read.
    async fn report(&self, coord: &dyn Coordinator, prefix: &str, json: bool) -> Result<String>;
}

#[derive(Clone)]
pub(crate) struct ServerState {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) health: Arc<Health>,
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) runtime: Arc<dyn Probe>,
    /// A loop that has not finished a cycle for this long is wedged.
    pub(crate) max_cycle_age: Duration,
    /// This node's keys: whose trail `/v1/trail` shows, under which prefix `/v1/status` reads.
    pub(crate) keys: Keys,
    /// What `/v1/status` shows.
    pub(crate) status: Arc<dyn StatusReport>,
}

/// The most trail entries one `/v1/trail` answers with.
const MAX_TRAIL: usize = 1000;

pub(crate) fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/status", get(status))
        .route("/v1/trail", get(trail))
        .route("/v1/workers/{id}/status", any(not_here))
        .with_state(state)
}

/// OpenMetrics for scrapers that ask for it (Prometheus does), the classic text format for the
/// rest (`curl`, `promtool check metrics`).
async fn metrics(State(s): State<ServerState>, headers: axum::http::HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let wants_openmetrics = accept.is_some_and(|v| v.contains("application/openmetrics-text"));
    let text = s.metrics.encode();
    let (kind, body) = if wants_openmetrics {
        ("application/openmetrics-text; version=1.0.0; charset=utf-8", text)
    } else {
        ("text/plain; version=0.0.4; charset=utf-8", crate::metrics::to_classic_text(&text))
    };
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

/// 200 with the text, or 503 with why.
fn answer(text: Result<String, impl std::fmt::Display>) -> Response {
    match text {
        Ok(text) => (StatusCode::OK, text).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

#[derive(Debug, serde::Deserialize)]
struct StatusQuery {
    format: Option<String>,
}

/// `vigil status` as the agent sees it (`?format=json` for JSON): what the CLI shows when it has
/// no Redis of its own to read (the embedded coordinator, or a config without the agent's
/// `REDIS_URL`). Read-only, like everything on this port.
async fn status(State(s): State<ServerState>, Query(q): Query<StatusQuery>) -> Response {
    let json = q.format.as_deref() == Some("json");
    answer(s.status.report(s.coord.as_ref(), s.keys.prefix(), json).await)
}

#[derive(Debug, serde::Deserialize)]
struct TrailQuery {
    limit: Option<usize>,
}

/// This node's decision trail, oldest first, as `vigil explain` prints it.
async fn trail(State(s): State<ServerState>, Query(q): Query<TrailQuery>) -> Response {
    let limit = q.limit.unwrap_or(50).clamp(1, MAX_TRAIL);
    let entries = s.coord.read_recent(&s.keys.trail(), limit).await;
    answer(entries.map(|entries| crate::trail::render(s.keys.node(), &entries)))
}

async fn healthz(State(s): State<ServerState>) -> Response {
    answer(match s.health.alive(s.max_cycle_age).await {
        true => Ok("ok\n".into()),
        false => Err("the evaluation loop has not completed a cycle recently"),
    })
}

async fn readyz(State(s): State<ServerState>) -> Response {
    let mut problems = Vec::new();
    // NB: a probe never blocks on a dependency: each check gets a short deadline of its own,
    // and both run at once. The coordinator's cheapest request is its clock.
    let (coord, runtime) = tokio::join!(
        tokio::time::timeout(PROBE_TIMEOUT, s.coord.time()),
        tokio::time::timeout(PROBE_TIMEOUT, s.runtime.ping()),
    );
    match coord {
        Ok(Ok(_)) => {}
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
    let warnings = s.health.warnings.lines().into_iter().map(|w| format!("warning: {w}"));
    let ready = problems.is_empty();
    let lines = if ready { vec!["ready".to_string()] } else { problems };
    let body = lines.into_iter().chain(warnings).collect::<Vec<_>>().join("\n");
    answer(if ready { Ok(body + "\n") } else { Err(body) })
}

/// The metrics port takes no write: a worker (or anyone) trying the old status API here learns
/// where it moved, and gets nothing done.
async fn not_here() -> (StatusCode, &'static str) {
    (
        StatusCode::FORBIDDEN,
        "this port serves /metrics, /healthz and /readyz only; workers write their status on the worker API \
         (worker_api.listen or worker_api.socket, authenticated as the worker: see docs/security.md)\n",
    )
}

/// Serve until `shutdown` fires, then let requests in flight finish.
pub(crate) async fn serve(listener: TcpListener, state: ServerState, shutdown: CancellationToken) {
    serve_router(listener, router(state), shutdown, LIMITS).await;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use super::{router, serve_router, Probe, ServerState, LIMITS};
    use crate::clock::SystemClock;
    use crate::coord::memory::MemoryCoordinator;
    use crate::http::health::Health;
    use crate::http::listen::Limits;
    use crate::metrics::Metrics;

    /// A runtime that always answers.
    struct Up;

    #[async_trait::async_trait]
    impl Probe for Up {
        fn describe(&self) -> String {
            "test runtime".into()
        }
        async fn ping(&self) -> Result<(), super::ProbeError> {
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
            max_cycle_age: Duration::from_secs(60),
            keys: crate::coord::Keys::new("vigil", "node-a"),
            status: Arc::new(crate::fleet::view::StatusPage {
                timing: crate::hang::policy_gang::Timing::of(&crate::config::Config::default()),
            }),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve_router(
            listener,
            router(state),
            stop.clone(),
            Limits { header_timeout, ..LIMITS },
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

    /// The issue's two lines, against the metrics port: refused, and the port still serves.
    #[tokio::test]
    async fn the_metrics_port_refuses_every_write() {
        let (addr, stop) = start(Duration::from_secs(10)).await;
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/v1/workers/trainer-0/status");
        for body in [r#"{"state":"error"}"#, r#"{"checkpoint_ack":"x"}"#] {
            let r = client.put(&url).body(body).send().await.unwrap();
            assert_eq!(r.status(), 403);
            assert!(r.text().await.unwrap().contains("worker_api"));
            let r = client.post(&url).body(body).send().await.unwrap();
            assert_eq!(r.status(), 403);
        }
        let r = client.post(format!("http://{addr}/metrics")).send().await.unwrap();
        assert_eq!(r.status(), 405, "GET only");
        let r = client.get(format!("http://{addr}/metrics")).send().await.unwrap();
        assert_eq!(r.status(), 200);
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
        // NB: every connection here is one peer's (127.0.0.1), held at most `per_peer` at once: a
        // scrape connected but not yet in its request is idle, and may give way to a newcomer
        // (a connection error, by design). Whatever is answered is a 200.
        let mut answered = 0;
        for s in scrapes {
            if let Ok(status) = s.await.unwrap() {
                assert_eq!(status, 200);
                answered += 1;
            }
        }
        assert!(answered > 0, "no scrape answered");
        for r in raw {
            r.await.expect("no panic on junk");
        }
        // NB: on new connections: one the scrapes left idle in the client's pool may have been
        // closed by the server (its idle timeout, or given way to a newcomer), and reusing it
        // races the close (hyper's IncompleteMessage, seen once under a loaded run).
        let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
        let r = client.get(format!("http://{addr}/healthz")).send().await.unwrap();
        assert!(r.status().is_success() || r.status().as_u16() == 503);
        let r = client.get(format!("http://{addr}/metrics")).send().await.unwrap();
        assert_eq!(r.status(), 200, "still serving");
        stop.cancel();
    }

    /// Issue 41: 200 connections that send half a request head and then nothing, all from the
    /// probes' own address, and more arriving while the probes run: `/healthz`, `/readyz` and
    /// `/metrics` are still answered (the idle junk gives way), and what the server holds stays
    /// within its bounds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_are_answered_while_half_open_junk_holds_connections() {
        let (addr, stop) = start(Duration::from_secs(30)).await;
        let mut junk = Vec::new();
        for _ in 0..200 {
            let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let _ = c.write_all(b"GET /metrics HTTP/1.1\r\n").await;
            junk.push(c);
        }
        // NB: a connection per probe, as the kubelet's are: a kept-alive one idle between
        // rounds is rightly the first to give way to the next round's junk (a reset, flaky
        // under load on 2 cores), which says nothing about a probe getting in.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        for round in 0..10 {
            for _ in 0..20 {
                let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
                let _ = c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x").await;
                junk.push(c);
            }
            for path in ["/healthz", "/readyz", "/metrics"] {
                let r = client.get(format!("http://{addr}{path}")).send().await;
                let code = r.map(|r| r.status().as_u16());
                assert!(
                    matches!(code, Ok(200) | Ok(503)),
                    "round {round}: {path} not answered while junk holds the port: {code:?}"
                );
            }
        }
        stop.cancel();
    }

    #[test]
    fn worker_ids_are_restricted() {
        assert!(crate::hang::model::valid_worker_id("trainer-0.a_b"));
        assert!(!crate::hang::model::valid_worker_id("a:b"));
        assert!(!crate::hang::model::valid_worker_id(""));
        assert!(!crate::hang::model::valid_worker_id("a{b}"));
    }
}
