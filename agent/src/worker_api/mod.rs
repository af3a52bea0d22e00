//! The worker write API (`PUT /v1/workers/{id}/status`): a worker publishes its own status record
//! through the agent, on its own listener (`[worker_api]`), never on the metrics port.
//!
//! Every write is authenticated, then authorised to the one worker it names
//! (`crate::worker_api::policy`): on TCP a projected ServiceAccount token (reviewed by the API
//! server) or, on loopback only and when configured, nothing; on the unix socket the peer's
//! container. Answers: 401 (no or bad proof), 403 (proven, but not that worker), 503 (the API
//! server or the runtime cannot say: fail closed), 400/413/408 for a bad body.

pub(crate) mod body;
pub(crate) mod directory;
pub(crate) mod peer;
pub(crate) mod policy;
pub(crate) mod review_budget;
pub(crate) mod token_review;

pub(crate) use body::{status_fields, StatusWrite};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use axum::{Extension, Router};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::config::WorkerAuth;
use crate::coord::{write_status, Coordinator, Keys};
use crate::hang::model::{gang_of, parse_grace, rank_field, valid_worker_id};
use crate::hang::policy_membership::{self, Membership};
use crate::http::listen::{serve_router, Limits, Listen, Peer};
use crate::http::procfs::{CgroupUnknown, Procfs};
use crate::http::server::HEADER_READ_TIMEOUT;
use crate::maintenance::request::acknowledges;
use crate::metrics::Metrics;
use crate::runtime::container::Container;
use crate::worker_api::directory::WorkerDirectory;
use crate::worker_api::peer::{container_of, within};
use crate::worker_api::policy::{authorize, token_node, Caller};
use crate::worker_api::review_budget::{ReviewBudget, Throttled, PER_NODE, PER_PEER};
use crate::worker_api::token_review::{Reviewed, Standing, TokenReviewer};

/// A status body is a few short strings; anything bigger is a mistake.
pub(crate) const MAX_STATUS_BODY: usize = 64 * 1024;

/// An oversized body is read and thrown away up to this much, so the client gets its 413
/// instead of a connection reset (closing with unread data makes the kernel send RST, which
/// discards the answer); beyond it the connection is closed.
const MAX_DRAIN: usize = 16 * 1024 * 1024;

/// Longest the agent waits for a status body once the head has arrived.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a write waits on the runtime's listing of this node's workers.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// A projected ServiceAccount token is a JWT of one to two kilobytes; anything much longer is
/// junk, refused (401) before it is reviewed, cached or costs the runtime a listing.
pub(crate) const MAX_TOKEN: usize = 8 * 1024;

/// What one client may hold of the worker API (issue 26: a flood of junk tokens of 300 kB each
/// grew the agent by 160 MiB). A head is a request line and a few headers, the token included:
/// past 32 KiB hyper answers 431 without buffering more. A node's workers beat every few seconds
/// over short connections: 128 at once is far above any node's ranks, and bounds what a flood
/// holds to 128 heads and bodies (a few MiB). A peer (an address: host-network pods share the
/// node's; on the socket, a container) holds at most 64, and past either bound the connection
/// idle the longest gives way (issue 41: idle junk never keeps a worker's beat out). A
/// connection lives at most a minute.
const LIMITS: Limits = Limits {
    header_timeout: HEADER_READ_TIMEOUT,
    max_head: 32 * 1024,
    max_connections: 128,
    per_peer: 64,
    max_age: Duration::from_secs(60),
};

#[derive(Clone)]
pub(crate) struct WorkerApiState {
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) keys: Keys,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) directory: Arc<dyn WorkerDirectory>,
    /// How a TCP write is authenticated.
    pub(crate) tcp_auth: WorkerAuth,
    /// The API server's reviews of tokens (`tcp_auth = kubernetes`).
    pub(crate) reviewer: Option<Arc<dyn TokenReviewer>>,
    /// Where a unix-socket peer's container's init process is looked up.
    pub(crate) procfs: Procfs,
    /// `policy.max_grace`: a longer grace is cut to it, and the answer says so.
    pub(crate) max_grace: Duration,
    /// The reviews a source not known yet may cause, per address and for the node.
    pub(crate) reviews: Arc<std::sync::Mutex<ReviewBudget>>,
}

pub(crate) fn router(state: WorkerApiState) -> Router {
    Router::new()
        .route("/v1/workers/{id}/status", put(status).post(status).get(status))
        .with_state(state)
}

/// Serve the worker API on `listener` until `stop` fires.
pub(crate) async fn serve<L: Listen>(listener: L, state: WorkerApiState, stop: CancellationToken) {
    serve_router(listener, router(state), stop, LIMITS).await;
}

/// An answer, the outcome label it is counted under, when to try again (`Retry-After`), and what
/// of the agent's own failed when the refusal is not the caller's doing (logged at WARN).
struct Answer(StatusCode, &'static str, String, Option<u64>, Option<&'static str>);

/// A step of a request: what it gives, or the [`Answer`] that refuses the request.
type Result<T, E = Answer> = std::result::Result<T, E>;

impl Answer {
    fn ok(label: &'static str, text: String) -> Answer {
        Answer(StatusCode::OK, label, text, None, None)
    }
    fn unauthenticated(why: impl Into<String>) -> Answer {
        Answer(StatusCode::UNAUTHORIZED, "unauthenticated", why.into(), None, None)
    }
    /// A unix peer whose container cannot be told (401).
    fn unplaced(e: &CgroupUnknown) -> Answer {
        let why = format!("cannot tell which container is connected: {e}");
        // NB: a peer that exited before it was read did it to itself; the rest (no hostPID, a
        // procfs not the host's) are the agent's own failing.
        let ours = (!matches!(e, CgroupUnknown::Exited(_))).then_some("procfs");
        Answer(StatusCode::UNAUTHORIZED, "unauthenticated", why, None, ours)
    }
    fn forbidden(why: impl Into<String>) -> Answer {
        Answer(StatusCode::FORBIDDEN, "forbidden", why.into(), None, None)
    }
    /// The agent's `cause` (`coordinator`, `runtime`, `token-review`, `procfs`) cannot say.
    fn unavailable(cause: &'static str, why: impl Into<String>) -> Answer {
        Answer(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why.into(), Some(5), Some(cause))
    }
    fn invalid(code: StatusCode, why: impl Into<String>) -> Answer {
        Answer(code, "invalid", why.into(), None, None)
    }
    fn too_large() -> Answer {
        let why = format!("status body is limited to {MAX_STATUS_BODY} bytes");
        Answer::invalid(StatusCode::PAYLOAD_TOO_LARGE, why)
    }
    fn throttled(t: Throttled) -> Answer {
        let secs = t.retry_after.as_secs_f64().ceil().max(1.0) as u64;
        let whose = t.whose;
        let why = format!("too many tokens the API server refused came from {whose} lately: not reviewed; send a valid token again in {secs} s");
        Answer(StatusCode::TOO_MANY_REQUESTS, "throttled", why, Some(secs), None)
    }

    fn into_response(self) -> Response {
        let Answer(code, _, text, retry, _) = self;
        let body = format!("{}\n", text.trim_end());
        match (code, retry) {
            (StatusCode::UNAUTHORIZED, _) => {
                (code, [(header::WWW_AUTHENTICATE, "Bearer realm=\"vigil\"")], body).into_response()
            }
            (_, Some(secs)) => {
                (code, [(header::RETRY_AFTER, secs.to_string())], body).into_response()
            }
            _ => (code, body).into_response(),
        }
    }
}

/// When each agent-side cause of a refusal ([`Answer`]'s fifth field) was last said at WARN.
/// NB: per process, not per server: it paces a log, and the agent runs one worker API.
static WARNED: std::sync::Mutex<Warned> = std::sync::Mutex::new(Warned(Vec::new()));

/// Paces the warnings of refusals the agent's own side caused: a node whose every worker is
/// refused (its coordinator down, no hostPID, no RBAC for TokenReviews) says why once a minute
/// per cause, not once per beat.
struct Warned(Vec<(&'static str, tokio::time::Instant)>);

impl Warned {
    const EVERY: Duration = Duration::from_secs(60);

    /// Whether a refusal for `cause` at `now` is to be warned about: the first, and then one a
    /// minute; noted as said when it is.
    fn due(&mut self, cause: &'static str, now: tokio::time::Instant) -> bool {
        match self.0.iter_mut().find(|(c, _)| *c == cause) {
            Some((_, at)) if now.saturating_duration_since(*at) < Self::EVERY => false,
            Some((_, at)) => {
                *at = now;
                true
            }
            None => {
                self.0.push((cause, now));
                true
            }
        }
    }
}

/// A write (`PUT`, or `POST`), or `GET`: the worker's own record (a worker on the API transport
/// learns of a checkpoint request here, or from the answer to its beat), under the same proof as
/// a write. Counted, logged and sent, answer or refusal.
async fn status(
    State(s): State<WorkerApiState>,
    Extension(peer): Extension<Peer>,
    Path(id): Path<String>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = match method {
        Method::PUT | Method::POST => s.answer_write(&peer, &id, &headers, body).await,
        _ => s.answer_read(&peer, &id, &headers).await,
    };
    let answer = answer.unwrap_or_else(|refused| refused);
    let listener = match peer {
        Peer::Tcp(_) => "tcp",
        Peer::Unix { .. } => "unix",
    };
    s.metrics.worker_api.write(listener, answer.1);
    let (code, now) = (answer.0.as_u16(), tokio::time::Instant::now());
    let warned = || WARNED.lock().unwrap_or_else(|p| p.into_inner());
    match (answer.4.filter(|&cause| warned().due(cause, now)), answer.0) {
        (Some(cause), _) => tracing::warn!(
            worker = %id,
            code,
            cause,
            "worker API: refused for the agent's own failing (said once a minute per cause, every refusal counted in vigil_worker_api_writes_total): {}",
            answer.2
        ),
        (None, StatusCode::FORBIDDEN) => {
            tracing::warn!(worker = %id, "worker API: refused: {}", answer.2)
        }
        (None, StatusCode::OK) => {}
        // A worker's own bad request, or an agent-side cause said within the minute.
        (None, _) => tracing::debug!(worker = %id, code, "worker API: {}", answer.2),
    }
    answer.into_response()
}

impl WorkerApiState {
    /// The review budget of a new server: [`review_budget::PER_PEER`] and
    /// [`review_budget::PER_NODE`].
    pub(crate) fn review_budget() -> Arc<std::sync::Mutex<ReviewBudget>> {
        Arc::new(std::sync::Mutex::new(ReviewBudget::new(PER_PEER, PER_NODE)))
    }

    /// Authenticate, authorise, then read and write: nobody unproven gets to send a body. The
    /// answer carries the heartbeat and any checkpoint request still unacknowledged.
    async fn answer_write(
        &self,
        peer: &Peer,
        id: &str,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<Answer> {
        // A declared length past what would ever be drained is refused before any read: nobody
        // gets to hold a connection for `BODY_READ_TIMEOUT` by announcing gigabytes.
        let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
        if declared.and_then(|v| v.parse::<u64>().ok()).is_some_and(|n| n > MAX_DRAIN as u64) {
            return Err(Answer::too_large());
        }
        let carrier = self.admit(peer, id, headers).await?;
        let body = read_status_body(body).await?;
        let write = status_fields(&body).map_err(|(code, why)| Answer::invalid(code, why))?;
        let membership = carrier.map(|c| written_membership(&c, &write)).unwrap_or_default();
        if let Some(why) = membership.unusable {
            return Err(Answer::invalid(StatusCode::BAD_REQUEST, why));
        }
        let heartbeat = rank_field("heartbeat", write.rank);
        let now = write_status(&*self.coord, &self.keys, id, &write.fields, &heartbeat).await;
        let now = now.map_err(|e| Answer::unavailable("coordinator", e.to_string()))?;
        // NB: best effort: the beat is stored; a failed read only leaves the request for the next.
        let record = self.coord.hgetall(&self.keys.status(id)).await.unwrap_or_default();
        let mut answer = pending_checkpoint(&record, write.rank);
        answer.insert("heartbeat_ms".into(), Value::from(now));
        let grace = grace_warning(&write.fields, &rank_field("grace", write.rank), self.max_grace);
        if let Some(g) = &membership.gang {
            answer.insert("gang".into(), Value::from(g.id.clone()));
        }
        let warnings: Vec<String> = grace.into_iter().chain(membership.notes).collect();
        if !warnings.is_empty() {
            answer.insert("warnings".into(), serde_json::json!(warnings));
        }
        Ok(Answer::ok("accepted", Value::Object(answer).to_string()))
    }

    async fn answer_read(&self, peer: &Peer, id: &str, headers: &HeaderMap) -> Result<Answer> {
        self.admit(peer, id, headers).await?;
        let record = self.coord.hgetall(&self.keys.status(id)).await;
        let record = record.map_err(|e| Answer::unavailable("coordinator", e.to_string()))?;
        let fields = record.into_iter().map(|(k, v)| (k, v.into()));
        Ok(Answer::ok("read", Value::Object(fields.collect()).to_string()))
    }

    /// A valid worker id, and a caller proven to be that worker (or trusted loopback).
    async fn admit(&self, peer: &Peer, id: &str, headers: &HeaderMap) -> Result<Option<Container>> {
        if !valid_worker_id(id) {
            let why = "worker id must be 1-128 characters of [A-Za-z0-9._-]";
            return Err(Answer::invalid(StatusCode::BAD_REQUEST, why));
        }
        let caller = self.authenticate(peer, headers).await?;
        if caller == Caller::Loopback {
            return Ok(None);
        }
        token_node(&caller, self.keys.node()).map_err(|r| Answer::forbidden(r.0))?;
        let listed = ask_runtime(self.directory.workers()).await?;
        let carrier = authorize(&caller, id, self.keys.node(), &listed)
            .map_err(|r| Answer::forbidden(r.0))?;
        if let (Caller::Container { cgroup, .. }, Some(c)) = (&caller, carrier) {
            self.prove_container(cgroup, c).await?;
        }
        Ok(carrier.cloned())
    }

    /// A unix-socket peer whose cgroup is named after `c` is in `c` only when its cgroups are
    /// those of the runtime's init process for `c`, or below them
    /// (`crate::worker_api::peer::within`).
    async fn prove_container(&self, cgroup: &str, c: &Container) -> Result<()> {
        let name = c.display();
        let pid = ask_runtime(self.directory.init_pid(&c.id)).await?.ok_or_else(|| {
            let why = format!("the container runtime names no process for {name}: cannot prove the caller is in it");
            Answer::unavailable("runtime", why)
        })?;
        let init = self.procfs.cgroup_of_pid(pid).map_err(|e| {
            Answer::unavailable("procfs", format!("the init process of {name}: {e}"))
        })?;
        if within(cgroup, &init, &c.id) {
            return Ok(());
        }
        let first = cgroup.lines().next().unwrap_or_default();
        let why = format!("the caller's cgroup is named after {name} but is not where the runtime runs it: {first}");
        Err(Answer::forbidden(why))
    }

    /// Who sent the write, as proven by its listener's means.
    async fn authenticate(&self, peer: &Peer, headers: &HeaderMap) -> Result<Caller> {
        match peer {
            Peer::Unix { pid, cgroup: Ok(cgroup) } => Ok(match container_of(cgroup) {
                Some(id) => Caller::Container { id, cgroup: cgroup.clone() },
                None => Caller::HostProcess { pid: *pid },
            }),
            Peer::Unix { cgroup: Err(e), .. } => Err(Answer::unplaced(e)),
            Peer::Tcp(addr) => match self.tcp_auth {
                // NB: config validation refuses `none` off loopback; this holds if it ever
                // did not.
                WorkerAuth::None if addr.ip().is_loopback() => Ok(Caller::Loopback),
                WorkerAuth::None => Err(Answer::unauthenticated(
                    "unauthenticated writes are served on loopback only",
                )),
                WorkerAuth::Kubernetes => self.review(addr.ip(), headers).await,
            },
        }
    }

    async fn review(&self, from: std::net::IpAddr, headers: &HeaderMap) -> Result<Caller> {
        let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let token = bearer.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
        let why = "send the worker's projected ServiceAccount token: Authorization: Bearer <token>";
        let token = token.filter(|t| !t.is_empty()).ok_or_else(|| Answer::unauthenticated(why))?;
        if token.len() > MAX_TOKEN {
            let len = token.len();
            let why = format!("the bearer token is {len} bytes; a projected ServiceAccount token is at most {MAX_TOKEN}");
            return Err(Answer::unauthenticated(why));
        }
        let reviewer = self.reviewer.as_ref().ok_or_else(|| {
            let why = "the Kubernetes API is not available to review tokens";
            Answer::unavailable("token-review", why)
        })?;
        // NB: a token the reviewer does not know is charged to its sender's address and to the
        // node before the API server is asked ([`ReviewBudget`]); a vouched one (a real
        // worker's re-review once its answer left the cache) never is, so junk never holds it
        // back.
        let (reviewed, charged) = match reviewer.standing(token) {
            Standing::Known(known) => (Ok(known), None),
            Standing::Vouched => (reviewer.review(token).await, None),
            Standing::Stranger => {
                let charge = self
                    .budget()
                    .charge(from, tokio::time::Instant::now())
                    .map_err(Answer::throttled)?;
                (reviewer.review(token).await, Some(charge))
            }
        };
        let caller = match reviewed {
            Ok(Reviewed::Pod { pod, node }) => Caller::Pod { pod, node },
            Ok(Reviewed::Refused(why)) => return Err(Answer::unauthenticated(why)),
            Ok(Reviewed::NotAPod(why)) => return Err(Answer::forbidden(why)),
            Err(e) => return Err(Answer::unavailable("token-review", e.to_string())),
        };
        // Given back for a pod of this node only: a pod's token minted elsewhere is no worker
        // here.
        if let Some(charge) = charged {
            if token_node(&caller, self.keys.node()).is_ok() {
                let mut budget = self.budget();
                budget.refund(from, charge);
                // NB: proven only by a token that names this node (one without a node claim
                // could be any pod's, anywhere), so an address proves itself once per pod here.
                if matches!(&caller, Caller::Pod { node: Some(n), .. } if n == self.keys.node()) {
                    budget.prove(from, tokio::time::Instant::now());
                }
            }
        }
        Ok(caller)
    }

    fn budget(&self) -> std::sync::MutexGuard<'_, ReviewBudget> {
        self.reviews.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The gang the agent will take this write's worker to be a member of (the tenancy rule,
/// `crate::hang::policy_membership`), when the write names a gang or its pod's labels do.
fn written_membership(c: &Container, write: &StatusWrite) -> Membership {
    // NB: read as the agent reads the record (`gang_of`), from this write's fields.
    let fields: HashMap<String, String> = write.fields.iter().cloned().collect();
    policy_membership::of_container(c, gang_of(&fields).as_ref())
}

/// What the worker should hear about its grace (the field `key`: `grace`, or a rank's
/// `grace@<rank>`): one longer than `policy.max_grace` is cut to it (silently, the worker would
/// believe it has two hours and be restarted after one).
fn grace_warning(fields: &[(String, String)], key: &str, max_grace: Duration) -> Option<String> {
    let (_, g) = fields.iter().find(|(k, _)| k == key)?;
    let asked = parse_grace(g)?;
    (asked > crate::clock::ms(max_grace)).then(|| {
        let max = humantime::format_duration(max_grace);
        let asked_text = crate::clock::brief(Duration::from_millis(asked as u64));
        format!("grace {asked_text} is longer than this agent's policy.max_grace ({max}): the worker may stay silent for {max} only")
    })
}

/// The checkpoint request in a record, when it is not acknowledged yet (by this rank, for a
/// rank's write, or as the agent counts it acknowledged).
fn pending_checkpoint(record: &HashMap<String, String>, rank: Option<u32>) -> Map<String, Value> {
    // The agent's own rule (`acknowledges`: the container's `checkpoint_ack`, or every rank's)
    // ends the request for every rank: once it counts it acknowledged, a rank told to save again
    // would save for nothing. A rank's own ack ends it for that rank alone.
    let acked = |request: &String| {
        record.get(&rank_field("checkpoint_ack", rank)) == Some(request)
            || acknowledges(record, request)
    };
    if record.get("checkpoint_request").is_none_or(|r| r.is_empty() || acked(r)) {
        return Map::new();
    }
    ["checkpoint_request", "checkpoint_reason", "checkpoint_requested_at", "checkpoint_drill"]
        .into_iter()
        .filter_map(|key| {
            let v = record.get(key).filter(|v| !v.is_empty())?;
            Some((key.to_string(), Value::String(v.clone())))
        })
        .collect()
}

/// One call to the runtime, bounded by [`LIST_TIMEOUT`]; no answer is a 503.
async fn ask_runtime<T>(
    call: impl std::future::Future<Output = Result<T, crate::runtime::RuntimeError>>,
) -> Result<T> {
    tokio::time::timeout(LIST_TIMEOUT, call)
        .await
        .map_err(|_| {
            Answer::unavailable("runtime", "the container runtime did not answer in time")
        })?
        .map_err(|e| Answer::unavailable("runtime", format!("the container runtime: {e}")))
}

/// Reads a status body of at most [`MAX_STATUS_BODY`] bytes, answering 413 (after draining, see
/// [`MAX_DRAIN`]) when it is bigger and 408 when the client stalls.
async fn read_status_body(mut body: Body) -> Result<Bytes> {
    use http_body_util::BodyExt;
    let read = async move {
        let mut kept = Vec::new();
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| Answer::invalid(StatusCode::BAD_REQUEST, format!("body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            seen += data.len();
            if seen <= MAX_STATUS_BODY {
                kept.extend_from_slice(&data);
            } else if seen > MAX_DRAIN {
                break;
            }
        }
        (seen <= MAX_STATUS_BODY).then(|| Bytes::from(kept)).ok_or_else(Answer::too_large)
    };
    tokio::time::timeout(BODY_READ_TIMEOUT, read).await.unwrap_or_else(|_| {
        let why = format!("body not received within {BODY_READ_TIMEOUT:?}");
        Err(Answer::invalid(StatusCode::REQUEST_TIMEOUT, why))
    })
}

#[cfg(test)]
mod tests;
