//! A faithful fake of the GCE metadata server, for the metadata tests, the end-to-end tests and
//! the demo: real HTTP on `127.0.0.1`, serving the three keys the agent watches.
//!
//! What it copies from the real server (see `agent/src/maintenance/metadata.rs` for the sources):
//! - `GET /computeMetadata/v1/instance/{maintenance-event,upcoming-maintenance,preempted}`;
//!   refused with 403 without `Metadata-Flavor: Google` or with `X-Forwarded-For`; answers carry
//!   `Metadata-Flavor: Google` and an `ETag` that is a hash of the content (setting the same
//!   value again is not a change).
//! - `?wait_for_change=true&last_etag=E&timeout_sec=N`: returns at once when `E` is stale,
//!   otherwise holds the request until the value changes or `N` seconds pass, then returns the
//!   current value. Without `last_etag` it waits for the next change from the request's arrival.
//! - `upcoming-maintenance` with nothing scheduled answers 503 with the body
//!   `{ "error": "no notifications have been received yet, try again later" }` (switchable to a
//!   200 `{ }`); a scheduled event is the snake_case JSON of [`upcoming_json`].
//!
//! Scriptable over HTTP, so a separate process can drive it:
//! - `PUT /fake/value/{key}` — body is the new value (`key` is `maintenance-event` or
//!   `instance/maintenance-event`, etc.); an empty body unsets `upcoming-maintenance`.
//! - `POST /fake/fault/{key}?kind=503|429|garbage|404|403&count=N` — the next N answers for the
//!   key are that fault (`garbage`: a 200 with a nonsense body and a new ETag). Waiting
//!   long-polls are woken so the fault is delivered at once.
//! - `PUT /fake/upcoming-unset?mode=503|empty` — how an unset `upcoming-maintenance` answers.
//! - `GET /fake/requests` — `{"maintenance-event": n, "upcoming-maintenance": n, "preempted": n,
//!   "refused": n}`: accepted requests per key, and requests refused for their headers.

#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The keys served, by their short names.
pub const KEYS: [&str; 3] = ["maintenance-event", "upcoming-maintenance", "preempted"];

/// The body of the real server's 503 for an `upcoming-maintenance` that never had a notice.
pub const NO_NOTIFICATIONS_BODY: &str =
    r#"{ "error": "no notifications have been received yet, try again later" }"#;

/// The longest a long-poll is held when the client gives no `timeout_sec`.
const MAX_HOLD: Duration = Duration::from_secs(300);

/// An `upcoming-maintenance` value in the metadata server's format (snake_case, and
/// `can_reschedule` as a *string*), e.g. `upcoming_json("PENDING", true)`.
pub fn upcoming_json(status: &str, can_reschedule: bool) -> String {
    serde_json::json!({
        "can_reschedule": can_reschedule.to_string(),
        "latest_window_start_time": "2030-01-08T19:00:00Z",
        "maintenance_reasons": ["PLANNED_UPDATE"],
        "maintenance_status": status,
        "type": "SCHEDULED",
        "window_end_time": "2030-01-01T21:00:00Z",
        "window_start_time": "2030-01-01T19:00:00Z",
    })
    .to_string()
}

/// How an unset `upcoming-maintenance` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsetMode {
    /// 503 with [`NO_NOTIFICATIONS_BODY`] (the real server's answer when no notice ever came).
    NoNotifications503,
    /// 200 with `{ }` (the answer once notices have been received and none is scheduled).
    EmptyObject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Unavailable,
    RateLimited,
    Garbage,
    NotFound,
    Forbidden,
    /// Hold the request past any client's timeout ([`HANG`]), then give up.
    Hang,
    /// 200 with an empty body (and an ETag of its own).
    Empty,
    /// The current value under an ETag the server never issued (a server that lost its
    /// ETags): a client long-polling with it must get the current value back at once.
    ResetEtag,
}

/// How long a `hang` fault holds its request.
pub const HANG: std::time::Duration = std::time::Duration::from_secs(4);

impl Fault {
    fn parse(s: &str) -> Option<Fault> {
        Some(match s {
            "503" => Fault::Unavailable,
            "429" => Fault::RateLimited,
            "garbage" => Fault::Garbage,
            "404" => Fault::NotFound,
            "403" => Fault::Forbidden,
            "hang" => Fault::Hang,
            "empty" => Fault::Empty,
            "reset-etag" => Fault::ResetEtag,
            _ => return None,
        })
    }
}

struct KeyState {
    /// `None`: unset (only `upcoming-maintenance` can be).
    value: Option<String>,
    etag: String,
    faults: VecDeque<Fault>,
    requests: usize,
    garbage_sent: u64,
}

struct Inner {
    keys: HashMap<&'static str, KeyState>,
    refused: usize,
    unset_mode: UnsetMode,
}

impl Inner {
    fn key(&mut self, name: &str) -> Option<&mut KeyState> {
        self.keys.get_mut(name)
    }

    /// Recompute `name`'s ETag from what it would answer now; true when it changed.
    fn refresh_etag(&mut self, name: &'static str) -> bool {
        let mode = self.unset_mode;
        let Some(k) = self.keys.get_mut(name) else {
            return false;
        };
        let content = match (&k.value, mode) {
            (Some(v), _) => v.clone(),
            (None, UnsetMode::EmptyObject) => "{ }".to_string(),
            (None, UnsetMode::NoNotifications503) => "\0unset-503".to_string(),
        };
        let etag = etag_of(name, &content);
        let changed = etag != k.etag;
        k.etag = etag;
        changed
    }
}

struct Shared {
    inner: Mutex<Inner>,
    /// Woken on every value change and every scripted fault.
    changed: Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panicking test thread must not take the fake down with it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running fake metadata server. Dropping it stops accepting connections.
pub struct FakeMetadata {
    /// `127.0.0.1:PORT`, the value for `GCE_METADATA_HOST`.
    pub host: String,
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    http: reqwest::Client,
    task: JoinHandle<()>,
}

impl FakeMetadata {
    /// Start on an ephemeral port, with maintenance-event `NONE`, preempted `FALSE` and nothing
    /// scheduled (503 "no notifications" mode).
    pub async fn start() -> FakeMetadata {
        FakeMetadata::start_on("127.0.0.1:0")
            .await
            .expect("bind the fake metadata server on 127.0.0.1:0")
    }

    /// Start on a given address (the demo uses a fixed port).
    pub async fn start_on(addr: &str) -> std::io::Result<FakeMetadata> {
        let mut inner =
            Inner { keys: HashMap::new(), refused: 0, unset_mode: UnsetMode::NoNotifications503 };
        for (name, value) in [
            ("maintenance-event", Some("NONE")),
            ("upcoming-maintenance", None),
            ("preempted", Some("FALSE")),
        ] {
            inner.keys.insert(
                name,
                KeyState {
                    value: value.map(str::to_string),
                    etag: String::new(),
                    faults: VecDeque::new(),
                    requests: 0,
                    garbage_sent: 0,
                },
            );
            inner.refresh_etag(name);
        }
        let shared = Arc::new(Shared { inner: Mutex::new(inner), changed: Notify::new() });
        let app = Router::new()
            .route("/computeMetadata/v1/{*path}", get(metadata))
            .route("/fake/value/{*key}", put(set_value))
            .route("/fake/fault/{*key}", post(add_fault))
            .route("/fake/upcoming-unset", put(set_unset_mode))
            .route("/fake/requests", get(request_counts))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeMetadata {
            host: addr.to_string(),
            addr,
            shared,
            http: reqwest::Client::builder().no_proxy().build().expect("build a reqwest client"),
            task,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.host)
    }

    /// Set a key's value over the control API (empty unsets `upcoming-maintenance`).
    pub async fn set(&self, key: &str, value: &str) {
        let url = format!("{}/fake/value/{key}", self.base_url());
        let resp =
            self.http.put(url).body(value.to_string()).send().await.expect("PUT /fake/value");
        assert!(resp.status().is_success(), "set {key}: {}", resp.status());
    }

    /// Make the next `count` answers for `key` a fault: `503`, `429`, `garbage`, `404`, `403`,
    /// `hang`, `empty`, `reset-etag`.
    pub async fn fault(&self, key: &str, kind: &str, count: usize) {
        let url = format!("{}/fake/fault/{key}?kind={kind}&count={count}", self.base_url());
        let resp = self.http.post(url).send().await.expect("POST /fake/fault");
        assert!(resp.status().is_success(), "fault {key}: {}", resp.status());
    }

    /// How an unset `upcoming-maintenance` answers.
    pub async fn set_upcoming_unset_mode(&self, mode: UnsetMode) {
        let mode = match mode {
            UnsetMode::NoNotifications503 => "503",
            UnsetMode::EmptyObject => "empty",
        };
        let url = format!("{}/fake/upcoming-unset?mode={mode}", self.base_url());
        let resp = self.http.put(url).send().await.expect("PUT /fake/upcoming-unset");
        assert!(resp.status().is_success(), "unset mode: {}", resp.status());
    }

    /// Accepted requests for `key` so far (`"refused"`: requests refused for their headers).
    pub async fn requests(&self, key: &str) -> usize {
        let counts = self.request_counts().await;
        counts.get(key).copied().unwrap_or(0)
    }

    /// Requests refused (403) for a missing `Metadata-Flavor` or a present `X-Forwarded-For`.
    pub async fn refused(&self) -> usize {
        self.requests("refused").await
    }

    /// All counters, as `GET /fake/requests` reports them.
    pub async fn request_counts(&self) -> HashMap<String, usize> {
        let url = format!("{}/fake/requests", self.base_url());
        let resp = self.http.get(url).send().await.expect("GET /fake/requests");
        let body: serde_json::Value = resp.json().await.expect("JSON from /fake/requests");
        body.as_object()
            .map(|o| {
                o.iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64()? as usize))).collect()
            })
            .unwrap_or_default()
    }

    /// Sum of accepted requests over the three keys.
    pub async fn total_requests(&self) -> usize {
        let counts = self.request_counts().await;
        KEYS.iter().map(|k| counts.get(*k).copied().unwrap_or(0)).sum()
    }
}

impl Drop for FakeMetadata {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `instance/preempted` or `preempted` → `preempted`, if it is a served key.
fn key_name(path: &str) -> Option<&'static str> {
    let short = path.trim_matches('/');
    let short = short.strip_prefix("instance/").unwrap_or(short);
    KEYS.iter().copied().find(|k| *k == short)
}

fn etag_of(key: &str, content: &str) -> String {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    content.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// `a=1&b=x%20y` → map; enough percent-decoding for ETags and numbers.
fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(hi), Some(lo)) => {
                    out.push(hi * 16 + lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A response from "the metadata server": always with `Metadata-Flavor: Google`.
fn answer(status: StatusCode, content_type: &str, etag: Option<&str>, body: String) -> Response {
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert("Metadata-Flavor", HeaderValue::from_static("Google"));
    if let Ok(v) = HeaderValue::from_str(content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    if let Some(Ok(v)) = etag.map(HeaderValue::from_str) {
        h.insert(header::ETAG, v);
    }
    resp
}

/// A plain-text answer with no ETag (refusals, faults, unknown keys).
fn plain(status: StatusCode, body: &str) -> Response {
    answer(status, "text/plain", None, body.into())
}

async fn metadata(
    State(shared): State<Arc<Shared>>,
    Path(path): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let flavor_ok = headers.get("Metadata-Flavor").is_some_and(|v| v.as_bytes() == b"Google");
    if headers.contains_key("X-Forwarded-For") || !flavor_ok {
        shared.lock().refused += 1;
        let why = if flavor_ok {
            "Request had an X-Forwarded-For header and was refused.\n"
        } else {
            "Missing Metadata-Flavor:Google header.\n"
        };
        return plain(StatusCode::FORBIDDEN, why);
    }
    let Some(key) = key_name(&path) else {
        return plain(StatusCode::NOT_FOUND, "Not Found\n");
    };

    let q = query(&uri);
    let wait = q.get("wait_for_change").is_some_and(|v| v == "true");
    let arrival_etag = {
        let mut inner = shared.lock();
        let Some(k) = inner.key(key) else {
            return plain(StatusCode::NOT_FOUND, "Not Found\n");
        };
        k.requests += 1;
        k.etag.clone()
    };
    if wait {
        // Hold unless the client's ETag is already stale.
        let last = q.get("last_etag").cloned().unwrap_or_else(|| arrival_etag.clone());
        let hold = q
            .get("timeout_sec")
            .and_then(|t| t.parse::<u64>().ok())
            .map_or(MAX_HOLD, Duration::from_secs);
        let deadline = tokio::time::Instant::now() + hold;
        loop {
            // NB: register for wake-ups before looking, so a change in between is not missed.
            let notified = shared.changed.notified();
            {
                let mut inner = shared.lock();
                let Some(k) = inner.key(key) else { break };
                if k.etag != last || !k.faults.is_empty() {
                    break;
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    }

    let hang = {
        let mut inner = shared.lock();
        match inner.key(key) {
            Some(k) if matches!(k.faults.front(), Some(Fault::Hang)) => {
                k.faults.pop_front();
                true
            }
            _ => false,
        }
    };
    if hang {
        tokio::time::sleep(HANG).await;
        return plain(StatusCode::SERVICE_UNAVAILABLE, "too late\n");
    }
    let mut inner = shared.lock();
    let unset_mode = inner.unset_mode;
    let Some(k) = inner.key(key) else {
        return plain(StatusCode::NOT_FOUND, "Not Found\n");
    };
    let content_type =
        if key == "upcoming-maintenance" { "application/json" } else { "application/text" };
    if let Some(fault) = k.faults.pop_front() {
        return match fault {
            Fault::Unavailable => plain(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable\n"),
            Fault::RateLimited => plain(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n"),
            Fault::NotFound => plain(StatusCode::NOT_FOUND, "Not Found\n"),
            Fault::Forbidden => plain(StatusCode::FORBIDDEN, "Forbidden\n"),
            Fault::Garbage => {
                k.garbage_sent += 1;
                let body = match key {
                    "maintenance-event" => "BANANA".to_string(),
                    "preempted" => "MAYBE".to_string(),
                    _ => r#"{"maintenance_status": "#.to_string(),
                };
                let etag = etag_of(key, &format!("{body}\0{}", k.garbage_sent));
                answer(StatusCode::OK, content_type, Some(&etag), body)
            }
            Fault::Empty => {
                k.garbage_sent += 1;
                let etag = etag_of(key, &format!("\0empty\0{}", k.garbage_sent));
                answer(StatusCode::OK, content_type, Some(&etag), String::new())
            }
            Fault::ResetEtag => {
                k.garbage_sent += 1;
                let etag = etag_of(key, &format!("\0reset\0{}", k.garbage_sent));
                let body = k.value.clone().unwrap_or_else(|| "{ }".into());
                answer(StatusCode::OK, content_type, Some(&etag), body)
            }
            Fault::Hang => unreachable!("handled before the lock is held"),
        };
    }
    match (&k.value, unset_mode) {
        (Some(v), _) => answer(StatusCode::OK, content_type, Some(&k.etag), v.clone()),
        (None, UnsetMode::EmptyObject) => {
            answer(StatusCode::OK, content_type, Some(&k.etag), "{ }".into())
        }
        (None, UnsetMode::NoNotifications503) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            content_type,
            None,
            NO_NOTIFICATIONS_BODY.into(),
        ),
    }
}

async fn set_value(
    State(shared): State<Arc<Shared>>,
    Path(path): Path<String>,
    body: Bytes,
) -> StatusCode {
    let Some(key) = key_name(&path) else {
        return StatusCode::NOT_FOUND;
    };
    let value = String::from_utf8_lossy(&body).into_owned();
    let changed = {
        let mut inner = shared.lock();
        let Some(k) = inner.key(key) else {
            return StatusCode::NOT_FOUND;
        };
        k.value = if key == "upcoming-maintenance" && value.trim().is_empty() {
            None
        } else {
            Some(value)
        };
        inner.refresh_etag(key)
    };
    if changed {
        shared.changed.notify_waiters();
    }
    StatusCode::NO_CONTENT
}

async fn add_fault(
    State(shared): State<Arc<Shared>>,
    Path(path): Path<String>,
    uri: Uri,
) -> (StatusCode, String) {
    let Some(key) = key_name(&path) else {
        return (StatusCode::NOT_FOUND, format!("no key {path}\n"));
    };
    let q = query(&uri);
    let kind = q.get("kind").map(String::as_str).unwrap_or("");
    let Some(fault) = Fault::parse(kind) else {
        return (
            StatusCode::BAD_REQUEST,
            format!("kind must be 503, 429, garbage, 404 or 403, not {kind:?}\n"),
        );
    };
    let count = match q.get("count").map(|c| c.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) => n,
        Some(Err(_)) => return (StatusCode::BAD_REQUEST, "count must be a number\n".into()),
    };
    {
        let mut inner = shared.lock();
        let Some(k) = inner.key(key) else {
            return (StatusCode::NOT_FOUND, format!("no key {path}\n"));
        };
        k.faults.extend(std::iter::repeat_n(fault, count));
    }
    // Deliver the fault to a held long-poll now, as a real outage would.
    shared.changed.notify_waiters();
    (StatusCode::NO_CONTENT, String::new())
}

async fn set_unset_mode(State(shared): State<Arc<Shared>>, uri: Uri) -> (StatusCode, String) {
    let mode = match query(&uri).get("mode").map(String::as_str) {
        Some("503") => UnsetMode::NoNotifications503,
        Some("empty") | Some("{}") | Some("{ }") => UnsetMode::EmptyObject,
        other => {
            return (StatusCode::BAD_REQUEST, format!("mode must be 503 or empty, not {other:?}\n"))
        }
    };
    let changed = {
        let mut inner = shared.lock();
        inner.unset_mode = mode;
        inner.refresh_etag("upcoming-maintenance")
    };
    if changed {
        shared.changed.notify_waiters();
    }
    (StatusCode::NO_CONTENT, String::new())
}

async fn request_counts(State(shared): State<Arc<Shared>>) -> Response {
    let inner = shared.lock();
    let mut out = serde_json::Map::new();
    for key in KEYS {
        let n = inner.keys.get(key).map_or(0, |k| k.requests);
        out.insert(key.to_string(), n.into());
    }
    out.insert("refused".to_string(), inner.refused.into());
    let mut resp = serde_json::Value::Object(out).to_string().into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
