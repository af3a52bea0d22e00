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
        let why = match tokio::time::timeout(budget, self.runtime.list_workers()).await {
            Ok(Ok(workers)) => {
                // Only a running worker can save anything (the listing holds exited ones too).
                // NB: the worker id goes into a Redis key name: a label value that is no worker
                // id (the roster alerts on it) is never written to.
                let (workers, invalid): (Vec<_>, Vec<_>) = workers
                    .into_iter()
                    .filter(|c| c.running)
                    .partition(|c| valid_worker_id(&c.worker));
                let deadline = started + budget;
                let within = deadline.saturating_duration_since(tokio::time::Instant::now());
                let (gangs, alone) = self.gangs_of(workers, within).await;
                // Every worker is asked at once: a gang's through its round, the others each on
                // its own. NB: all within what is left of the one budget — a slow read of the
                // records above comes out of the workers' time, never on top of it (the node
                // may be gone when the budget ends).
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let (mut results, by_gang) = tokio::join!(
                    join_all(alone.iter().map(|c| self.one(c, reason, left, deadline))),
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

    /// The workers grouped by the gang their pod's labels name (or, where the labels name
    /// none, their record's, scoped to their namespace where they have one), and the workers
    /// of no gang. Records that cannot be read name no gang: a worker whose labels name none
    /// is then asked alone, as before gangs.
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
        // The detail is also the round's line in the summary, whatever its end: `finish` picks
        // the gang's line by method `gang` (`checkpoint::GANG`).
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
                method: checkpoint::GANG,
                outcome,
                waited: started.elapsed(),
                detail: detail.clone(),
            })
            .collect()
    }

    /// Count the round's results, and say the round in one line stamped `now`, for the Node's
    /// annotation and Event: `<time> <reason>: acked=… timed-out=… failed=…`, then each gang's.
    pub(crate) fn finish(&self, reason: &str, results: &[WorkerResult], now: Millis) -> String {
        for r in results {
            self.metrics.checkpoints.record(r.method, r.outcome.as_str(), r.waited.as_secs_f64());
        }
        // A gang's round is said once, however many of its members run here (their detail).
        let gang_rounds = results.iter().filter(|r| r.method == checkpoint::GANG);
        let mut gangs: Vec<&str> = gang_rounds.map(|r| r.detail.as_str()).collect();
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
    WorkerResult { worker, method: "invalid", outcome: Outcome::Failed, waited, detail }
}

#[cfg(test)]
#[cfg(feature = "demo")] // NB: the fake runtime is the demo's (`crate::runtime::sim`).
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use async_trait::async_trait;

    use super::*;
    use crate::clock::SystemClock;
    use crate::config::Config;
    use crate::coord::memory::MemoryCoordinator;
    use crate::coord::{CoordError, Coordinator, Reply, Request};
    use crate::metrics::Metrics;
    use crate::runtime::sim::FakeRuntime;

    /// A coordinator whose first read of several records (which gang is whose) takes `stall`.
    struct Stalling {
        inner: MemoryCoordinator,
        stalled: AtomicBool,
        stall: Duration,
    }

    #[async_trait]
    impl Coordinator for Stalling {
        fn describe(&self) -> String {
            "stalling".into()
        }
        async fn execute(&self, request: Request) -> Result<Reply, CoordError> {
            let many = matches!(request, Request::HgetallMany(_));
            if many && !self.stalled.swap(true, Ordering::SeqCst) {
                tokio::time::sleep(self.stall).await;
            }
            self.inner.execute(request).await
        }
    }

    /// The budget bounds the whole round: a slow read of the workers' records comes out of
    /// their time. (It once came on top: each worker of no gang was given the whole budget
    /// again after the read, so a round asked within 2 s took 3.5 s.)
    #[tokio::test(start_paused = true)]
    async fn a_slow_read_of_the_records_does_not_stretch_the_round() {
        let cfg = Config { node_name: "gpu-1".into(), ..Config::default() };
        let runtime = FakeRuntime::default();
        runtime.add("c1", "trainer-0");
        let coord = Stalling {
            inner: MemoryCoordinator::new(Arc::new(SystemClock)),
            stalled: AtomicBool::new(false),
            stall: Duration::from_millis(1500),
        };
        let metrics = Arc::new(Metrics::new());
        let asks = Checkpointer::new(&cfg, Arc::new(coord), Arc::new(runtime), metrics);
        let started = tokio::time::Instant::now();
        let results = asks.request("test", Duration::from_secs(2)).await;
        let took = started.elapsed();
        assert_eq!(results.len(), 1, "{results:?}");
        assert_eq!(results[0].outcome, Outcome::TimedOut, "never acknowledged: {results:?}");
        assert!(took <= Duration::from_secs(2), "the round took {took:?} of a 2 s budget");
        assert!(
            took >= Duration::from_millis(1900),
            "the worker was given what was left: {took:?}"
        );
    }

    /// Redis down when the node goes away: a worker asked by signal is still signalled (it may
    /// save without its record), and the round says the request could not be written. (Its
    /// clock's read failing once returned before the signal.)
    #[tokio::test]
    async fn with_redis_down_a_signal_still_reaches_the_worker() {
        let mut cfg = Config { node_name: "gpu-1".into(), ..Config::default() };
        cfg.checkpoint.method = crate::config::CheckpointMethod::Signal(None);
        let runtime = FakeRuntime::default();
        runtime.add("c1", "trainer-0");
        let down = crate::coord::memory::Failing {
            inner: MemoryCoordinator::new(Arc::new(SystemClock)),
            fails: Box::new(|_| true),
        };
        let metrics = Arc::new(Metrics::new());
        let asks = Checkpointer::new(&cfg, Arc::new(down), Arc::new(runtime.clone()), metrics);
        let results = asks.request("test", Duration::from_secs(2)).await;
        assert_eq!(runtime.signals(), vec![("c1".to_string(), "SIGUSR1".to_string())]);
        assert_eq!(results.len(), 1, "{results:?}");
        assert_eq!(results[0].outcome, Outcome::Failed, "{results:?}");
        assert!(results[0].detail.starts_with("cannot write the request: "), "{results:?}");
    }
}
