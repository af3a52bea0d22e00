//! The worker API over real HTTP on a loopback port and a real unix socket, with a fake
//! TokenReview and a fake runtime listing: who gets 200, 401, 403 and 503.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{
    pending_checkpoint, router, Answer, Warned, WorkerApiState, MAX_STATUS_BODY, MAX_TOKEN,
};
use crate::clock::SystemClock;
use crate::config::WorkerAuth;
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{Coordinator, Keys};
use crate::http::listen::{bind_unix, serve_router, UnixPeers};
use crate::http::procfs::{CgroupUnknown, Procfs};
use crate::metrics::Metrics;
use crate::runtime::container::{Container, PodIdentity, PodRef};
use crate::worker_api::directory::WorkerDirectory;
use crate::worker_api::token_review::{ReviewUnavailable, Reviewed, Standing, TokenReviewer};

/// Tokens the fake API server knows: token → answer; any other token is refused; `down` makes
/// every review fail.
/// With `remembers`, a pod's answer is known after its first review, as `CachedReviews` does.
#[derive(Default)]
struct FakeReviews {
    known: Vec<(String, Reviewed)>,
    down: Mutex<bool>,
    asked: std::sync::atomic::AtomicU32,
    remembers: bool,
    reviewed: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl TokenReviewer for FakeReviews {
    fn standing(&self, token: &str) -> Standing {
        let reviewed = self.reviewed.lock().unwrap().iter().any(|t| t == token);
        let answer = self.known.iter().find(|(t, _)| t == token);
        match answer.filter(|_| self.remembers && reviewed) {
            Some((_, r)) => Standing::Known(r.clone()),
            None => Standing::Stranger,
        }
    }

    async fn review(&self, token: &str) -> Result<Reviewed, ReviewUnavailable> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.reviewed.lock().unwrap().push(token.to_string());
        if *self.down.lock().unwrap() {
            return Err(ReviewUnavailable("connection refused".into()));
        }
        Ok(self
            .known
            .iter()
            .find(|(t, _)| t == token)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| Reviewed::Refused("token refused: invalid bearer token".into())))
    }
}

/// The runtime's listing, and the init pid of each container (by id) where the test says.
struct Listing(Vec<Container>, Vec<(String, i32)>);

impl Listing {
    fn of(containers: Vec<Container>) -> Listing {
        Listing(containers, Vec::new())
    }
}

#[async_trait::async_trait]
impl WorkerDirectory for Listing {
    async fn workers(&self) -> Result<Vec<Container>, crate::runtime::RuntimeError> {
        Ok(self.0.clone())
    }

    async fn init_pid(&self, container: &str) -> Result<Option<i32>, crate::runtime::RuntimeError> {
        Ok(self.1.iter().find(|(c, _)| c == container).map(|(_, p)| *p))
    }
}

fn pod_worker(worker: &str, pod: &str, uid: &str) -> Container {
    Container {
        id: format!("{:0>64}", uid.len()),
        name: pod.into(),
        worker: worker.into(),
        running: true,
        pod: Some(PodRef {
            pod: PodIdentity { namespace: "ml".into(), name: pod.into(), uid: uid.into() },
            sandbox: "sb".into(),
            container: "main".into(),
            attempt: 0,
            job: false,
        }),
        ..Container::default()
    }
}

fn pod_of(name: &str, uid: &str) -> Reviewed {
    pod_in("ml", name, uid)
}

fn pod_in(namespace: &str, name: &str, uid: &str) -> Reviewed {
    let pod = PodIdentity { namespace: namespace.into(), name: name.into(), uid: uid.into() };
    Reviewed::Pod { pod, node: Some("node-a".into()) }
}

struct Api {
    url: String,
    coord: Arc<dyn Coordinator>,
    metrics: Arc<Metrics>,
    reviews: Arc<FakeReviews>,
    _stop: tokio_util::sync::DropGuard,
}

async fn start(auth: WorkerAuth, listed: Vec<Container>, reviews: FakeReviews) -> Api {
    let coord: Arc<dyn Coordinator> = Arc::new(MemoryCoordinator::new(Arc::new(SystemClock)));
    let metrics = Arc::new(Metrics::new());
    let reviews = Arc::new(reviews);
    let state = WorkerApiState {
        coord: coord.clone(),
        keys: Keys::new("vigil", "node-a"),
        metrics: metrics.clone(),
        directory: Arc::new(Listing::of(listed)),
        tcp_auth: auth,
        reviewer: Some(reviews.clone()),
        procfs: Procfs::default(),
        max_grace: Duration::from_secs(3600),
        reviews: WorkerApiState::review_budget(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(serve_router(listener, router(state), stop.clone(), super::LIMITS));
    Api { url, coord, metrics, reviews, _stop: stop.drop_guard() }
}

async fn put(api: &Api, worker: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .put(format!("{}/v1/workers/{worker}/status", api.url))
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn a_pod_token_writes_its_own_worker_and_nothing_else() {
    let listed = vec![
        pod_worker("trainer-0", "trainer-0", "uid-0"),
        pod_worker("trainer-1", "trainer-1", "uid-1"),
    ];
    let reviews = FakeReviews {
        known: vec![
            ("tok-0".into(), pod_of("trainer-0", "uid-0")),
            ("tok-secret".into(), Reviewed::NotAPod("not bound to a pod".into())),
        ],
        ..FakeReviews::default()
    };
    let api = start(WorkerAuth::Kubernetes, listed, reviews).await;
    let beat = r#"{"state":"processing","progress":"12"}"#;

    let (code, text) = put(&api, "trainer-0", Some("tok-0"), beat).await;
    assert_eq!(code, 200, "{text}");
    let record =
        api.coord.hgetall(&Keys::new("vigil", "node-a").status("trainer-0")).await.unwrap();
    assert_eq!(record.get("progress").map(String::as_str), Some("12"));
    assert!(record.contains_key("heartbeat"));

    // The issue's two lines: no token at all.
    let (code, text) = put(&api, "trainer-0", None, r#"{"state":"error"}"#).await;
    assert_eq!(code, 401, "{text}");
    assert!(text.contains("Bearer"), "{text}");
    let (code, _) = put(&api, "trainer-0", None, r#"{"checkpoint_ack":"x"}"#).await;
    assert_eq!(code, 401);
    // A token the API server does not know; a token bound to no pod; another pod's worker.
    assert_eq!(put(&api, "trainer-0", Some("forged"), beat).await.0, 401);
    assert_eq!(put(&api, "trainer-0", Some("tok-secret"), beat).await.0, 403);
    let (code, text) = put(&api, "trainer-1", Some("tok-0"), r#"{"state":"error"}"#).await;
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("ml/trainer-1/main"), "{text}");
    let other = api.coord.hgetall(&Keys::new("vigil", "node-a").status("trainer-1")).await.unwrap();
    assert!(other.is_empty(), "nothing written for the refused writes: {other:?}");
    // A refused caller's body is never parsed: a junk body still gets 401, not 400.
    assert_eq!(put(&api, "trainer-0", None, "junk").await.0, 401);

    // The API server down: closed, with a reason, and never a pass.
    *api.reviews.down.lock().unwrap() = true;
    let (code, text) = put(&api, "trainer-0", Some("tok-0"), beat).await;
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("connection refused"), "{text}");

    let metrics = api.metrics.encode();
    for outcome in ["accepted", "unauthenticated", "forbidden", "unavailable"] {
        assert!(
            metrics.contains(&format!(
                "vigil_worker_api_writes_total{{listener=\"tcp\",outcome=\"{outcome}\"}}"
            )),
            "{outcome}: {metrics}"
        );
    }
}

/// Issue 26, finding 2: junk tokens cost neither a review nor memory. A token over the bound is
/// refused unreviewed; a head over the listener's bound is answered 431 by hyper, unbuffered.
#[tokio::test]
async fn oversized_tokens_and_heads_are_refused_before_any_review() {
    let listed = vec![pod_worker("trainer-0", "trainer-0", "uid-0")];
    let api = start(WorkerAuth::Kubernetes, listed, FakeReviews::default()).await;
    let beat = r#"{"state":"processing"}"#;
    let (code, text) = put(&api, "trainer-0", Some(&"j".repeat(MAX_TOKEN + 1)), beat).await;
    assert_eq!(code, 401, "{text}");
    assert!(text.contains(&MAX_TOKEN.to_string()), "{text}");
    let (code, _) = put(&api, "trainer-0", Some(&"j".repeat(300 * 1024)), beat).await;
    assert_eq!(code, 431);
    let asked = || api.reviews.asked.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(asked(), 0, "no review for an oversized token");
    // A junk token within the bound is reviewed and refused (and not remembered:
    // `CachedReviews` keeps pods' answers only).
    assert_eq!(put(&api, "trainer-0", Some("junk"), beat).await.0, 401);
    assert_eq!(asked(), 1);
}

/// Issue 41: junk tokens under the size bound, each distinct, cost at most the address's burst
/// of TokenReviews; the rest are answered 429 unreviewed, with Retry-After. A real worker's
/// token, once reviewed, is known and never held back (nor did its review spend the budget).
#[tokio::test]
async fn junk_tokens_cost_a_bounded_number_of_reviews_and_real_workers_none() {
    let listed = vec![pod_worker("trainer-0", "trainer-0", "uid-0")];
    let reviews = FakeReviews {
        known: vec![("tok-0".into(), pod_of("trainer-0", "uid-0"))],
        remembers: true,
        ..FakeReviews::default()
    };
    let api = start(WorkerAuth::Kubernetes, listed, reviews).await;
    let beat = r#"{"state":"processing"}"#;
    let asked = || api.reviews.asked.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(put(&api, "trainer-0", Some("tok-0"), beat).await.0, 200);
    assert_eq!(asked(), 1);
    let mut codes = Vec::new();
    let began = tokio::time::Instant::now();
    for i in 0..50 {
        codes.push(put(&api, "trainer-0", Some(&format!("junk-{i}")), beat).await);
    }
    // NB: the bucket refills in real time (one every 2 s), and a loaded machine can take
    // seconds over the 50 requests: each refill the burst took may add a review.
    let rate = crate::worker_api::review_budget::PER_PEER;
    let refills = (began.elapsed().as_secs_f64() * rate.per_second).ceil() as u32;
    let burst = rate.burst as u32;
    assert!(
        asked() <= 1 + burst + refills,
        "{} reviews for 50 junk tokens in {:?}",
        asked(),
        began.elapsed()
    );
    let throttled: Vec<&(u16, String)> = codes.iter().filter(|(c, _)| *c == 429).collect();
    assert!(throttled.len() >= 50 - (burst + refills) as usize, "{codes:?}");
    assert!(throttled[0].1.contains("not reviewed"), "{}", throttled[0].1);
    assert!(codes.iter().all(|(c, _)| *c == 401 || *c == 429), "{codes:?}");
    // NB: the bucket refills one every 2 s: a slow machine may see one more 401 first.
    let mut throttled_again = None;
    for i in 0..5 {
        let r = reqwest::Client::new()
            .put(format!("{}/v1/workers/trainer-0/status", api.url))
            .bearer_auth(format!("junk-again-{i}"))
            .body(beat)
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 429 {
            throttled_again = Some(r);
            break;
        }
    }
    let r = throttled_again.expect("junk is throttled");
    assert!(r.headers().contains_key("retry-after"));
    // The real worker goes on, answered from what is known.
    let before = asked();
    for _ in 0..5 {
        assert_eq!(put(&api, "trainer-0", Some("tok-0"), beat).await.0, 200);
    }
    assert_eq!(asked(), before);
    let text = api.metrics.encode();
    assert!(text.contains("outcome=\"throttled\""), "{text}");
}

/// Issue 41: the answer names the gang the agent knows the worker by — a pod's labels win over
/// the record, and a record's gang is of its own namespace — and says why when it differs.
#[tokio::test]
async fn the_answer_names_the_gang_the_agent_uses_and_why() {
    let mut jobset = pod_worker("trainer-0", "trainer-0", "uid-0");
    jobset.gang = Some(crate::runtime::container::PodGang {
        id: "ml/jobset/train/0".into(),
        size: None,
        source: "jobset",
        attempt: None,
        jobset_uid: None,
    });
    let imp = Container {
        pod: jobset
            .pod
            .clone()
            .map(|p| PodRef { pod: PodIdentity { namespace: "research".into(), ..p.pod }, ..p }),
        gang: None,
        worker: "imp".into(),
        id: "f".repeat(64),
        ..jobset.clone()
    };
    let reviews = FakeReviews {
        known: vec![
            ("tok-0".into(), pod_of("trainer-0", "uid-0")),
            ("tok-imp".into(), pod_in("research", "trainer-0", "uid-0")),
        ],
        ..FakeReviews::default()
    };
    let api = start(WorkerAuth::Kubernetes, vec![jobset, imp], reviews).await;
    let answer = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
    let body = r#"{"state":"processing","gang":"ml/jobset/train/0","gang_size":"3"}"#;
    let (code, text) = put(&api, "imp", Some("tok-imp"), body).await;
    assert_eq!(code, 200, "{text}");
    let a = answer(&text);
    assert_eq!(a["gang"], "research/ml/jobset/train/0", "{a}");
    assert!(a["warnings"][0].as_str().unwrap().contains("own namespace"), "{a}");
    // A JobSet pod cannot move itself into another gang, nor resize its own.
    let body = r#"{"state":"processing","gang":"other","gang_size":"64"}"#;
    let (code, text) = put(&api, "trainer-0", Some("tok-0"), body).await;
    assert_eq!(code, 200, "{text}");
    let a = answer(&text);
    assert_eq!(a["gang"], "ml/jobset/train/0", "{a}");
    assert_eq!(a["warnings"].as_array().unwrap().len(), 2, "{a}");
    // A value that scoped to its namespace would be no gang id is refused, naming the rule.
    let long = format!(r#"{{"gang":"{}"}}"#, "x".repeat(250));
    let (code, text) = put(&api, "imp", Some("tok-imp"), &long).await;
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("253"), "{text}");
}

#[tokio::test]
async fn loopback_without_auth_accepts_and_bodies_are_still_checked() {
    let api = start(WorkerAuth::None, vec![], FakeReviews::default()).await;
    assert_eq!(put(&api, "w", None, r#"{"state":"processing"}"#).await.0, 200);
    assert_eq!(put(&api, "w", None, r#"{"stat":1}"#).await.0, 400);
    assert_eq!(put(&api, "a:b", None, r#"{"state":"x"}"#).await.0, 400);
    // Issue 27: a grace past policy.max_grace is cut, and the answer says so.
    let (code, text) = put(&api, "w", None, r#"{"state":"compile","grace":"7200"}"#).await;
    assert_eq!(code, 200, "{text}");
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    let warning = answer["warnings"][0].as_str().unwrap_or_default();
    assert!(warning.contains("max_grace") && warning.contains("1h"), "{answer}");
    let (_, text) = put(&api, "w", None, r#"{"state":"compile","grace":"1200"}"#).await;
    assert!(!text.contains("warnings"), "{text}");
    // A rank's grace (stored as `grace@<rank>`) is cut the same way, and said the same way.
    let ranked = r#"{"state":"compile","grace":"7200","rank":"1","ranks":"2"}"#;
    let (code, text) = put(&api, "r", None, ranked).await;
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("max_grace"), "{text}");
    let big = format!("{{\"state\":\"{}\"}}", "x".repeat(10 * 1024 * 1024));
    let (code, text) = put(&api, "w", None, &big).await;
    assert_eq!(code, 413);
    assert!(text.contains(&MAX_STATUS_BODY.to_string()));
}

/// A record of `fields`, as the status hash reads back.
fn record(fields: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The agent counts a request acknowledged by the container's `checkpoint_ack` too
/// (`acknowledges`): a rank's answer that still carried it would have that rank save again.
#[test]
fn a_request_the_container_acknowledged_is_pending_for_no_rank() {
    let request = ("checkpoint_request", "r");
    for acked in [
        record(&[request, ("checkpoint_ack", "r")]),
        record(&[request, ("checkpoint_ack", "r"), ("ranks", "2")]),
        record(&[request, ("checkpoint_ack@1", "r"), ("ranks", "2")]),
    ] {
        assert!(pending_checkpoint(&acked, Some(1)).is_empty(), "{acked:?}");
    }
    // Not acknowledged: by no one, by another rank only, or by the container for an older id.
    for pending in [
        record(&[request]),
        record(&[request, ("checkpoint_ack@0", "r"), ("ranks", "2")]),
        record(&[request, ("checkpoint_ack", "older"), ("ranks", "2")]),
    ] {
        let answer = pending_checkpoint(&pending, Some(1));
        let id = answer.get("checkpoint_request").and_then(|v| v.as_str());
        assert_eq!(id, Some("r"), "{pending:?}");
    }
}

/// A refusal the agent's own side caused (its coordinator, runtime, API server access, procfs)
/// names its cause and is warned about at once, then once a minute per cause; a worker's own bad
/// request names none (DEBUG only).
#[test]
fn agent_side_refusals_are_warned_once_a_minute_per_cause() {
    use axum::http::StatusCode;
    let (t0, s) = (tokio::time::Instant::now(), Duration::from_secs);
    let mut warned = Warned(Vec::new());
    assert!(warned.due("coordinator", t0));
    assert!(!warned.due("coordinator", t0 + s(59)), "said within the minute");
    assert!(warned.due("runtime", t0 + s(59)), "another cause is said at once");
    assert!(warned.due("coordinator", t0 + s(60)));
    assert!(!warned.due("coordinator", t0 + s(119)));
    assert!(!warned.due("runtime", t0 + s(118)));

    assert_eq!(Answer::unavailable("token-review", "connection refused").4, Some("token-review"));
    assert_eq!(Answer::unplaced(&CgroupUnknown::Invisible(0)).4, Some("procfs"), "no hostPID");
    let own = [
        Answer::unplaced(&CgroupUnknown::Exited(42)),
        Answer::unauthenticated("no token"),
        Answer::forbidden("another pod's worker"),
        Answer::invalid(StatusCode::BAD_REQUEST, "bad body"),
        Answer::too_large(),
    ];
    for answer in own {
        assert_eq!(answer.4, None, "{}: {}", answer.0, answer.2);
    }
}

#[path = "socket_tests.rs"]
mod socket;
