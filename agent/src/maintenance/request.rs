//! Checkpoint requests: ask every opted-in worker to save its state before the node goes away
//! (termination notice, preemption, the agent's own SIGTERM), and wait for its acknowledgement.
//!
//! The protocol, for every method: the agent writes `checkpoint_request=<id>`,
//! `checkpoint_reason` and `checkpoint_requested_at` into the worker's status record and clears
//! `checkpoint_ack`; then it delivers the request by the worker's method (a signal through Docker,
//! an HTTP POST, or nothing more for `record`, where the worker watches its own record). The worker
//! saves its state and sets `checkpoint_ack` to the request id in its status record.
//!
//! NB: only an ack of *this* round's id counts. Any other value — an ack for an earlier round
//! still in flight when this one was written, a constant like `ok` — is not an acknowledgement
//! of this request, whose save may not have happened.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::{brief, Millis};
use crate::config::{CheckpointMethod, Config, Signal};
use crate::coord::{Coordinator, Keys};
use crate::metrics::Metrics;
use crate::redact::{Secret, Urls};
use crate::runtime::{Container, ContainerRuntime};

/// How a worker is asked to checkpoint, with the default signal resolved. Its
/// `IntoStaticStr` is the metric label.
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub(crate) enum Method {
    /// The request in the status record is all: the worker polls its own record.
    Record,
    /// A signal to the container's main process, e.g. `SIGUSR1`.
    Signal(Signal),
    /// An HTTP POST to this URL, with a JSON body `{request, reason, worker, deadline_ms}`
    /// (`deadline_ms`: the milliseconds left from the POST, not a timestamp). Shown redacted: it
    /// may carry a token.
    Http(Secret<Urls>),
}

impl Method {
    /// The configured (or labelled) method; a bare `signal` takes `default_signal`.
    pub(crate) fn resolve(m: &CheckpointMethod, default_signal: Signal) -> Method {
        match m {
            CheckpointMethod::Record => Method::Record,
            CheckpointMethod::Signal(s) => Method::Signal(s.unwrap_or(default_signal)),
            CheckpointMethod::Http(url) => Method::Http(url.clone()),
        }
    }

    /// A container's checkpoint label: the same syntax as `checkpoint.method`.
    pub(crate) fn parse(label: &str, default_signal: Signal) -> Result<Method, String> {
        Ok(Method::resolve(&label.parse()?, default_signal))
    }
}

/// Why a checkpoint request did not reach a worker by its method.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeliveryError {
    /// The container's checkpoint label is no method (`checkpoint.method`'s syntax).
    #[error("checkpoint label: {0}")]
    Label(String),
    /// The runtime refused the signal.
    #[error("signal {signal}: {source}")]
    Signal { signal: &'static str, source: crate::runtime::RuntimeError },
    /// The POST failed, or was answered with an error status. `url` is shown redacted.
    #[error("POST {url}: {why}")]
    Post { url: String, why: String },
}

/// How one worker's checkpoint ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub enum Outcome {
    Acked,
    TimedOut,
    Failed,
}

as_str!(pub Outcome);

/// One worker's result.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerResult {
    pub worker: String,
    /// How it was asked: its method (`record`, `signal`, `http`), `gang` for a member of a gang
    /// (`detail` is then its gang round's line, `crate::maintenance::policy_round::describe`,
    /// shared by the gang's members here), `invalid` or `none` when it was not.
    pub method: &'static str,
    pub outcome: Outcome,
    pub(crate) waited: Duration,
    pub detail: String,
}

/// The [`WorkerResult::method`] of a gang's member: asked through its gang's round.
pub(crate) const GANG: &str = "gang";

/// A one-line summary for the Node annotation and the trail: `acked=2 timed-out=1 failed=0`.
pub fn summary(results: &[WorkerResult]) -> String {
    use Outcome::{Acked, Failed, TimedOut};
    let count = |o| results.iter().filter(|r| r.outcome == o).count();
    let [acked, timed_out, failed] = [Acked, TimedOut, Failed].map(count);
    format!("acked={acked} timed-out={timed_out} failed={failed}")
}

/// The request's fields in the worker's record, asked at `now` (the coordinator's clock).
fn request_fields(id: &str, reason: &str, now: Millis) -> [(String, String); 5] {
    [
        ("checkpoint_request".to_string(), id.to_string()),
        ("checkpoint_reason".to_string(), reason.to_string()),
        ("checkpoint_requested_at".to_string(), now.to_string()),
        ("checkpoint_ack".to_string(), String::new()),
        // A drill's mark must not outlive it: this request is a notice's.
        ("checkpoint_drill".to_string(), String::new()),
    ]
}

/// Does `record` acknowledge the request `id`? Only the id itself does: in `checkpoint_ack`
/// (the container's one process, or one speaking for all its ranks), or — for a container of
/// several ranks (`ranks = N`) — in every rank's own `checkpoint_ack@r`.
pub(crate) fn acknowledges(record: &std::collections::HashMap<String, String>, id: &str) -> bool {
    use crate::hang::model::{rank_field, ranks};
    let acked = |field: &str| record.get(field).is_some_and(|a| a == id);
    let every_rank = |n: u32| (0..n).all(|r| acked(&rank_field("checkpoint_ack", Some(r))));
    !id.is_empty() && (acked("checkpoint_ack") || ranks(record).is_some_and(every_rank))
}

/// How often the status records are re-read while waiting for the acknowledgements.
pub(crate) const POLL: Duration = Duration::from_millis(200);

/// A fresh request id: 12 hex digits.
pub(crate) fn new_id() -> String {
    format!("{:012x}", rand::random::<u64>() >> 16)
}

/// What a checkpoint round needs: the workers' runtime and records, how a worker is asked when
/// its label does not say, and where the round's results are counted. One worker's request is
/// here; the round is `crate::maintenance::checkpoint`'s, a gang's round `gang_round`'s.
pub(crate) struct Checkpointer {
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) runtime: Arc<dyn ContainerRuntime>,
    pub(crate) keys: Keys,
    pub(crate) default_method: Method,
    pub(crate) default_signal: Signal,
    pub(crate) http: reqwest::Client,
    /// When a gang's member left its view (`crate::hang::policy_gang::present`).
    pub(crate) timing: crate::hang::policy_gang::Timing,
    /// Where the round's results are counted.
    pub(crate) metrics: Arc<Metrics>,
}

impl Checkpointer {
    pub fn new(
        cfg: &Config,
        coord: Arc<dyn Coordinator>,
        runtime: Arc<dyn ContainerRuntime>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let c = &cfg.checkpoint;
        Checkpointer {
            coord,
            runtime,
            keys: Keys::new(&cfg.redis.key_prefix, &cfg.node_name),
            default_method: Method::resolve(&c.method, c.signal),
            default_signal: c.signal,
            http: reqwest::Client::new(),
            timing: crate::hang::policy_gang::Timing::of(cfg),
            metrics,
        }
    }

    pub(crate) fn method_for(&self, c: &Container) -> Result<Method, DeliveryError> {
        let Some(label) = &c.checkpoint else { return Ok(self.default_method.clone()) };
        Method::parse(label.expose(), self.default_signal).map_err(DeliveryError::Label)
    }

    /// Ask one worker by its method, and wait for its acknowledgement until `deadline`.
    pub(crate) async fn one(
        &self,
        c: &Container,
        reason: &str,
        budget: Duration,
        deadline: Instant,
    ) -> WorkerResult {
        let started = Instant::now();
        let result = |method: &'static str, outcome, detail: String| WorkerResult {
            worker: c.worker.clone(),
            method,
            outcome,
            waited: started.elapsed(),
            detail,
        };
        let method = match self.method_for(c) {
            Ok(m) => m,
            Err(e) => return result("invalid", Outcome::Failed, e.to_string()),
        };
        let label = <&str>::from(&method);
        let within = brief(budget);
        let timed_out = || (Outcome::TimedOut, format!("no acknowledgement within {within}"));
        // NB: every step of a worker's round (Redis, Docker, HTTP) is bounded by the deadline,
        // not only the wait for the acknowledgement.
        let asked = async {
            let id = new_id();
            let key = self.keys.status(&c.worker);
            let written = match self.coord.time().await {
                Ok(now) => self.coord.hset(&key, &request_fields(&id, reason, now), None).await,
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                // Without the record (Redis down: its clock or the write failed) there is
                // nothing to acknowledge into, but a signal or a POST may still let the worker
                // save: deliver anyway, then report the failure.
                let _ = self.deliver(&method, c, &id, reason, budget).await;
                return (Outcome::Failed, format!("cannot write the request: {e}"));
            }
            if let Err(e) = self.deliver(&method, c, &id, reason, budget).await {
                return (Outcome::Failed, e.to_string());
            }
            if self.acknowledged(&key, &id, &c.worker, deadline).await {
                return (Outcome::Acked, format!("request {id} acknowledged"));
            }
            timed_out()
        };
        let answer = tokio::time::timeout_at(deadline, asked).await;
        let (outcome, detail) = answer.unwrap_or_else(|_| timed_out());
        result(label, outcome, detail)
    }

    /// Wait for the request's acknowledgement in the worker's record, until `deadline`: whether
    /// it came.
    async fn acknowledged(&self, key: &str, id: &str, worker: &str, deadline: Instant) -> bool {
        loop {
            match self.coord.hgetall(key).await {
                Ok(rec) if acknowledges(&rec, id) => return true,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, worker = %worker, "cannot read the acknowledgement yet")
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            // The last wait is shortened to the deadline, so the budget is used in full.
            tokio::time::sleep(POLL.min(deadline - now)).await;
        }
    }

    pub(crate) async fn deliver(
        &self,
        method: &Method,
        c: &Container,
        id: &str,
        reason: &str,
        budget: Duration,
    ) -> Result<(), DeliveryError> {
        match method {
            Method::Record => Ok(()),
            Method::Signal(sig) => {
                let killed = self.runtime.kill(&c.id, sig.as_str()).await;
                killed.map_err(|source| DeliveryError::Signal { signal: sig.as_str(), source })
            }
            Method::Http(url) => {
                let body = serde_json::json!({
                    "request": id,
                    "reason": reason,
                    "worker": c.worker,
                    "deadline_ms": budget.as_millis() as u64,
                });
                // NB: `url` shows redacted; the error is said without it (it names the URL).
                let post = self.http.post(url.expose()).timeout(budget.min(Duration::from_secs(5)));
                let why = match post.json(&body).send().await {
                    Ok(r) if r.status().is_success() => return Ok(()),
                    Ok(r) => format!("HTTP {}", r.status()),
                    Err(e) => crate::http::http_error(e),
                };
                Err(DeliveryError::Post { url: url.to_string(), why })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 27: a container of several ranks has saved when every rank acknowledged this id
    /// (or one process did for all); one rank's ack, or another id, is not enough.
    #[test]
    fn every_rank_must_acknowledge_the_request_s_id() {
        let rec = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert!(acknowledges(&rec(&[("checkpoint_ack", "r1")]), "r1"));
        assert!(!acknowledges(&rec(&[("checkpoint_ack", "ok")]), "r1"));
        assert!(!acknowledges(&rec(&[("checkpoint_ack", "")]), ""));
        let two = [("ranks", "2"), ("checkpoint_ack@0", "r1")];
        assert!(!acknowledges(&rec(&two), "r1"));
        let both = [("ranks", "2"), ("checkpoint_ack@0", "r1"), ("checkpoint_ack@1", "r1")];
        assert!(acknowledges(&rec(&both), "r1"));
        let stale = [("ranks", "2"), ("checkpoint_ack@0", "r1"), ("checkpoint_ack@1", "r0")];
        assert!(!acknowledges(&rec(&stale), "r1"));
        assert!(acknowledges(&rec(&[("ranks", "2"), ("checkpoint_ack", "r1")]), "r1"));
    }

    #[test]
    fn methods_parse_with_defaults_and_overrides() {
        let usr1 = Signal::Usr1;
        assert_eq!(Method::parse("record", usr1), Ok(Method::Record));
        assert!(Method::parse("redis", usr1).unwrap_err().contains("record"));
        assert_eq!(Method::parse("signal", usr1), Ok(Method::Signal(usr1)));
        assert_eq!(Method::parse("signal:SIGUSR2", usr1), Ok(Method::Signal(Signal::Usr2)));
        assert_eq!(
            Method::parse("http://127.0.0.1:8080/ckpt", usr1),
            Ok(Method::Http("http://127.0.0.1:8080/ckpt".into()))
        );
        assert!(Method::parse("signal:SIGKILL", usr1).is_err());
        assert!(Method::parse("carrier-pigeon", usr1).is_err());
    }

    #[test]
    fn summary_counts_outcomes() {
        let r = |o| WorkerResult {
            worker: "w".into(),
            method: "record",
            outcome: o,
            waited: Duration::ZERO,
            detail: String::new(),
        };
        assert_eq!(
            summary(&[r(Outcome::Acked), r(Outcome::Acked), r(Outcome::TimedOut)]),
            "acked=2 timed-out=1 failed=0"
        );
    }
}
