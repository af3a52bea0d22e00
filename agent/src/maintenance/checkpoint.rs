//! Checkpoint rounds: list the workers, ask each to checkpoint by its method, wait for the
//! acknowledgements within the budget, and turn the results into metrics, trail lines and the
//! summary the Node shows. The node controller (`crate::node::controller`) decides when a round runs.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;

use crate::clock::{rfc3339, Millis};
use crate::hang::model::{gang_of, valid_worker_id, Gang};
use crate::hang::policy_membership;
use crate::maintenance::policy_round::{acknowledged, describe};
use crate::maintenance::request::{self as checkpoint, Checkpointer, Outcome, WorkerResult};
use crate::runtime::Container;
use crate::trail::Code;

/// The gangs of this node's workers, by id: each gang and its workers here.
type Gangs = BTreeMap<String, (Gang, Vec<Container>)>;

impl Checkpointer {
    /// Deliver the requests and wait for the acknowledgements, all within `budget` (listing the
    /// workers included). A listing that fails is one `failed` result, not "nothing to do".
    /// A member of a gang is asked through its gang's round (`crate::maintenance::gang_round`),
    /// every member on every node at once; the others one by one, as before gangs.
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
                let deadline = started + budget;
                let (gangs, alone) = self.gangs_of(workers, left).await;
                // The workers of no gang are asked each on its own (not through a gang), all at
                // once, each given `left` from here.
                let alone_deadline = tokio::time::Instant::now() + left;
                let (mut results, by_gang) = tokio::join!(
                    join_all(alone.iter().map(|c| self.one(c, reason, left, alone_deadline))),
                    join_all(gangs.values().map(|g| self.gang_results(g, reason, left, deadline)))
                );
                results.extend(by_gang.into_iter().flatten());
                results.extend(invalid.into_iter().map(|c| {
                    let detail = format!(
                        "{} carries the opt-in label with a value that is not a worker id: not asked",
                        c.display()
                    );
                    not_asked(c.worker.chars().take(64).collect(), Duration::ZERO, detail)
                }));
                return results;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer".to_string(),
        };
        self.metrics.backends.runtime_error();
        tracing::error!(error = %why, "cannot list workers to checkpoint");
        vec![not_asked("*".into(), started.elapsed(), format!("cannot list the workers: {why}"))]
    }

    /// The workers grouped by the gang their record names (or, without one, their pod's
    /// labels), and the workers of no gang. Records that cannot be read leave their workers
    /// alone: asked one by one, as before gangs.
    async fn gangs_of(&self, workers: Vec<Container>, within: Duration) -> (Gangs, Vec<Container>) {
        let keys: Vec<String> = workers.iter().map(|c| self.keys.status(&c.worker)).collect();
        let read = tokio::time::timeout(within, self.coord.hgetall_many(&keys)).await;
        let records = read.ok().and_then(Result::ok).unwrap_or_default();
        let mut gangs = Gangs::new();
        let mut alone = Vec::new();
        for (i, c) in workers.into_iter().enumerate() {
            // NB: the tenancy rule (`crate::hang::policy_membership`): a record can neither
            // move its pod out of its labels' gang nor name another namespace's.
            let from_record = records.get(i).and_then(gang_of);
            match policy_membership::of_container(&c, from_record.as_ref()).gang {
                Some(g) => gangs.entry(g.id.clone()).or_insert_with(|| (g, Vec::new())).1.push(c),
                None => alone.push(c),
            }
        }
        (gangs, alone)
    }

    /// One gang's round, as one result per member on this node (the gang's outcome for each).
    async fn gang_results(
        &self,
        (g, local): &(Gang, Vec<Container>),
        reason: &str,
        budget: Duration,
        deadline: tokio::time::Instant,
    ) -> Vec<WorkerResult> {
        let started = tokio::time::Instant::now();
        let round = self.gang_round(g, local, reason, budget, deadline);
        // The detail is also the round's line in the summary (`gang`), whatever its end.
        let (outcome, detail) = match tokio::time::timeout_at(deadline, round).await {
            Ok(Ok(r)) if acknowledged(&r) => (Outcome::Acked, describe(&r)),
            Ok(Ok(r)) => (Outcome::TimedOut, describe(&r)),
            Ok(Err(e)) => {
                (Outcome::Failed, format!("gang {}: cannot open its checkpoint round: {e}", g.id))
            }
            Err(_) => {
                let within = crate::clock::brief(budget);
                (Outcome::TimedOut, format!("gang {}: its round did not end within {within}", g.id))
            }
        };
        local
            .iter()
            .map(|c| WorkerResult {
                worker: c.worker.clone(),
                method: "gang",
                outcome,
                waited: started.elapsed(),
                detail: detail.clone(),
                gang: Some(detail.clone()),
            })
            .collect()
    }

    /// Count the round's results, and say the round in one line stamped `now`, for the Node's
    /// annotation and Event: `<time> <reason>: acked=… timed-out=… failed=…`, then each gang's.
    pub(crate) fn finish(&self, reason: &str, results: &[WorkerResult], now: Millis) -> String {
        for r in results {
            self.metrics.checkpoints.record(r.method, r.outcome.as_str(), r.waited.as_secs_f64());
        }
        // A gang's round is said once, however many of its members run here.
        let mut gangs: Vec<&str> = results.iter().filter_map(|r| r.gang.as_deref()).collect();
        gangs.dedup();
        let mut summary = format!("{} {reason}: {}", rfc3339(now), checkpoint::summary(results));
        summary.extend(gangs.iter().map(|g| format!("; {g}")));
        summary
    }
}

/// A worker's line in the trail: its outcome's code, and what happened.
pub(crate) fn trail_line(reason: &str, r: &WorkerResult) -> (Code, String) {
    let code = match r.outcome {
        Outcome::Acked => Code::CheckpointAcked,
        Outcome::TimedOut => Code::CheckpointTimedOut,
        Outcome::Failed => Code::CheckpointFailed,
    };
    let secs = r.waited.as_secs_f64();
    (code, format!("{reason}: {} via {} after {secs:.1}s", r.detail, r.method))
}

/// The result of a worker that was not asked (its label is no worker id, or the workers cannot
/// be listed).
fn not_asked(worker: String, waited: Duration, detail: String) -> WorkerResult {
    WorkerResult { worker, method: "invalid", outcome: Outcome::Failed, waited, detail, gang: None }
}
