//! Checkpoint rounds: list the workers, ask each to checkpoint by its method, wait for the
//! acknowledgements within the budget, and turn the results into metrics, trail lines and the
//! summary the Node shows. The node controller (`crate::node::controller`) decides when a round runs.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{rfc3339, Millis};
use crate::config::Config;
use crate::coord::{Coordinator, Keys};
use crate::hang::model::valid_worker_id;
use crate::maintenance::request::{self as checkpoint, Checkpointer, Outcome, WorkerResult};
use crate::metrics::Metrics;
use crate::runtime::ContainerRuntime;
use crate::trail::Code;

/// What a finished round leaves for the trail and the Node.
pub(crate) struct RoundRecord {
    /// One trail line per worker: (worker, code, detail).
    pub(crate) lines: Vec<(String, Code, String)>,
    /// `<time> <reason>: acked=… timed-out=… failed=…`, for the Node's annotation and Event.
    pub(crate) summary: String,
    pub(crate) all_acked: bool,
}

pub(crate) struct CheckpointRounds {
    checkpointer: Checkpointer,
    runtime: Arc<dyn ContainerRuntime>,
    metrics: Arc<Metrics>,
}

impl CheckpointRounds {
    pub fn new(
        cfg: &Config,
        coord: Arc<dyn Coordinator>,
        runtime: Arc<dyn ContainerRuntime>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let c = &cfg.checkpoint;
        let checkpointer = Checkpointer {
            coord,
            runtime: runtime.clone(),
            keys: Keys::new(&cfg.redis.key_prefix, &cfg.node_name),
            default_method: checkpoint::Method::resolve(&c.method, c.signal),
            default_signal: c.signal,
            poll: Duration::from_millis(200),
            http: reqwest::Client::new(),
        };
        CheckpointRounds {
            checkpointer,
            runtime,
            metrics,
        }
    }

    /// Deliver the requests and wait for the acknowledgements, all within `budget` (listing the
    /// workers included). A listing that fails is one `failed` result, not "nothing to do".
    pub(crate) async fn request(&self, reason: &str, budget: Duration) -> Vec<WorkerResult> {
        let started = tokio::time::Instant::now();
        let listed = tokio::time::timeout(budget, self.runtime.list_workers()).await;
        let why = match listed {
            Ok(Ok(workers)) => {
                // Only a running worker can save anything (the listing holds exited ones too).
                // NB: the worker id goes into a Redis key name: a label value that is no worker
                // id (the roster alerts on it) is never written to.
                let (workers, invalid): (Vec<_>, Vec<_>) = workers
                    .into_iter()
                    .filter(|c| c.running)
                    .partition(|c| valid_worker_id(&c.worker));
                let left = budget.saturating_sub(started.elapsed());
                let mut results = self.checkpointer.run(&workers, reason, left).await;
                results.extend(invalid.into_iter().map(|c| WorkerResult {
                    worker: c.worker.chars().take(64).collect(),
                    method: "invalid",
                    outcome: Outcome::Failed,
                    waited: Duration::ZERO,
                    detail: format!(
                        "{} carries the opt-in label with a value that is not a worker id: not asked",
                        c.display()
                    ),
                }));
                return results;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer".to_string(),
        };
        self.metrics.backends.runtime_error();
        tracing::error!(error = %why, "cannot list workers to checkpoint");
        vec![WorkerResult {
            worker: "*".into(),
            method: "invalid",
            outcome: Outcome::Failed,
            waited: started.elapsed(),
            detail: format!("cannot list the workers: {why}"),
        }]
    }

    /// Count the round's results and say what to record, stamped `now`.
    pub(crate) fn finish(
        &self,
        reason: &str,
        results: &[WorkerResult],
        now: Millis,
    ) -> RoundRecord {
        let mut lines = Vec::with_capacity(results.len());
        for r in results {
            let (method, outcome) = (r.method, r.outcome.as_str());
            let waited = r.waited.as_secs_f64();
            self.metrics.checkpoints.record(method, outcome, waited);
            let code = match r.outcome {
                Outcome::Acked => Code::CheckpointAcked,
                Outcome::TimedOut => Code::CheckpointTimedOut,
                Outcome::Failed => Code::CheckpointFailed,
            };
            let detail = format!(
                "{reason}: {} via {} after {:.1}s",
                r.detail,
                r.method,
                r.waited.as_secs_f64()
            );
            lines.push((r.worker.clone(), code, detail));
        }
        RoundRecord {
            lines,
            summary: format!(
                "{} {reason}: {}",
                rfc3339(now),
                checkpoint::summary(results)
            ),
            all_acked: results.iter().all(|r| r.outcome == Outcome::Acked),
        }
    }
}
