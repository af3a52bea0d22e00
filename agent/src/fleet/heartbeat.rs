//! The heartbeat: this node's record for the fleet view. Each cycle publishes it with the
//! cycle's other writes in one round trip ([`Cycle::publish`]); between cycles, the heartbeat
//! task re-publishes it when no cycle has for a while, so a long cycle (a restart can take
//! minutes) never lets the record expire. A node whose cycles run costs nothing there: the
//! cycle publishes, once.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::accel::gpu::model::GpuReport;
use crate::clock::{parse_rfc3339, ticked, Millis};
use crate::coord::caps::Caps;
use crate::coord::{CoordError, Coordinator, Keys, Op};
use crate::fleet::view::{self as fleet, publish, NodeRecord, Upkeep};
use crate::hang::context::Context;
use crate::hang::model_gang::GangCycle;
use crate::hang::policy_gang::Timing;
use crate::hang::stand_down::NodeWatch;
use crate::vocab::node_info::{place, NodeInfo};

/// The record the agent last published, and when, shared with [`heartbeat_loop`]. Every write
/// of the record holds its lock from the write to the note of it: the heartbeat's re-publication
/// of a record a cycle has since replaced, landing after the cycle's, showed the old record (a
/// runtime outage that had ended, verdicts since changed) until the next cycle.
#[derive(Clone, Default)]
pub(crate) struct SharedRecord(Arc<tokio::sync::Mutex<Published>>);

/// The record last published, and when (`None` before the first publication).
type Published = Option<(NodeRecord, tokio::time::Instant)>;

impl SharedRecord {
    /// The record last published, if any.
    pub(crate) async fn last(&self) -> Option<NodeRecord> {
        self.0.lock().await.as_ref().map(|(rec, _)| rec.clone())
    }

    /// Run `write` (a publication of `rec`, alone or in a cycle's batch) and, when it succeeds,
    /// keep `rec` as the record published now; no re-publication runs in between.
    pub(crate) async fn publish<T, E>(
        &self,
        rec: &NodeRecord,
        write: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let mut last = self.0.lock().await;
        let out = write.await?;
        *last = Some((rec.clone(), tokio::time::Instant::now()));
        Ok(out)
    }
}

/// What one cycle gathers for the node's record and batch.
#[derive(Default)]
pub(crate) struct Cycle {
    /// Verdicts of the last cycle, for the heartbeat record.
    pub(crate) verdicts: BTreeMap<String, String>,
    /// Where each worker of the last cycle runs, for the heartbeat record.
    pub(crate) places: BTreeMap<String, String>,
    /// Marks to write with this cycle's batch (progress, rhythm; an incarnation's TTL).
    pub(crate) deferred: Vec<Op>,
    /// The coordinator's clock as last read in this cycle (stamps the node record).
    pub(crate) now: Millis,
    /// The gang entries to write with the batch, the gang views read this cycle, the breaker.
    pub(crate) gangs: GangCycle,
    /// The node's place as last written to the slice map, and when; when the fleet index was
    /// last pruned (see [`Cycle::upkeep`]).
    place_written: Option<(String, Millis)>,
    pruned_at: Option<Millis>,
}

/// How often a cycle re-writes the node's unchanged place in the slice map (a map without a
/// TTL: the write heals one lost to a failover) and prunes the fleet index (a node silent for a
/// day leaves it within this much more).
pub(crate) const UPKEEP_EVERY: Millis = 10 * 60 * 1000;

impl Cycle {
    /// This node's record as of the cycle: its verdicts and places, the node's maintenance
    /// phase (and which sources report it) as `watch` has it, GPU health, and what its Node says
    /// of it (nothing before the first read): pool and slice (`fleet.pool`/`fleet.slice` win),
    /// provisioning model, accelerator and TPU topology.
    pub(crate) fn record(&self, ctx: &Context, watch: &NodeWatch, gpu: &GpuReport) -> NodeRecord {
        let maintenance = watch.read_facts().maintenance.clone();
        let info = watch.node_info.as_ref().and_then(|rx| rx.borrow().clone());
        let (cfg, info) = (&ctx.cfg, info.as_ref());
        let place = place(&cfg.fleet, info);
        let provisioning = info.and_then(|i| i.provisioning.as_ref()).map_or("", |p| p.as_str());
        let topology = info.and_then(|i| i.tpu_topology.as_ref()).map_or("", |t| t.text.as_str());
        NodeRecord {
            node: cfg.node_name.clone(),
            pool: place.pool,
            slice: place.slice,
            provisioning: provisioning.to_string(),
            accelerator: info.and_then(NodeInfo::accelerator).unwrap_or_default().to_string(),
            tpu_topology: topology.to_string(),
            maintenance: maintenance.phase.as_str().to_string(),
            maintenance_source: maintenance.sources_str(),
            maintenance_window: maintenance.window_start.as_deref().and_then(parse_rfc3339),
            gpu: if gpu.monitoring() { gpu.node.as_str().into() } else { "unknown".into() },
            runtime_down: None,
            workers: self.verdicts.clone(),
            places: self.places.clone(),
            gangs: self.gangs.tags.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            dry_run: cfg.dry_run,
            updated_at: self.now,
            lost: ctx.metrics.lost.last_day(self.now),
            lost_hours: ctx.metrics.lost.hours(),
        }
    }

    /// Publish `rec` for the fleet view, with the cycle's progress marks, and read the breaker
    /// and budget counters the gauges show: one round trip for the node. The record is then
    /// `shared` with the heartbeat task. A failure is logged and returned (the next cycle
    /// writes it all again).
    pub(crate) async fn publish(
        &mut self,
        ctx: &Context,
        rec: NodeRecord,
        shared: &SharedRecord,
    ) -> Result<(), CoordError> {
        let (s, keys, now) = (&ctx.cfg.safety, &ctx.keys, self.now);
        let place = fleet::place_value(&rec);
        let upkeep = self.upkeep(&place, now);
        let mut ops = fleet::publish_ops(keys, &rec, ctx.cfg.fleet.heartbeat_ttl, upkeep);
        ops.append(&mut self.deferred);
        // The members' entries in their gangs' views: one hash write per gang shard, whatever
        // the number of this node's members in it, with a TTL that outlives a silent agent's
        // entries long enough to report them.
        let mut by_key: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for (key, field, value) in self.gangs.entries.drain(..) {
            by_key.entry(key).or_default().push((field, value));
        }
        let ttl = Some(Timing::of(&ctx.cfg).view_ttl());
        ops.extend(by_key.into_iter().map(|(key, fields)| Op::Hset { key, fields, ttl }));
        let caps = Caps::node(ctx.coord.as_ref(), keys, s);
        ops.extend(caps.counter_ops(now));
        let counters = shared
            .publish(&rec, ctx.coord.batch(&ops))
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "heartbeat not published"))?;
        if upkeep.place {
            self.place_written = Some((place, now));
        }
        if upkeep.prune {
            self.pruned_at = Some(now);
        }
        let budgets = &ctx.metrics.budgets;
        budgets.set_limits(caps.per_day(), s.fleet_budget);
        let ((used, open), (spent, exhausted)) = caps.read(&counters);
        budgets.set_breaker(used, open);
        self.gangs.breaker_left = caps.per_day().map(|cap| u64::from(cap).saturating_sub(used));
        budgets.set_fleet_budget(spent, exhausted);
        Ok(())
    }

    /// What this cycle's publication writes besides the record: the node's place when it
    /// changed (or was last written [`UPKEEP_EVERY`] ago, or never by this agent), the index's
    /// pruning every [`UPKEEP_EVERY`]. NB: a healthy cycle needs neither; they were two of its
    /// commands on every node every cycle.
    fn upkeep(&self, place: &str, now: Millis) -> Upkeep {
        // A clock that went back (a failover to another server) counts as time passed too.
        let due = |at: Millis| now.abs_diff(at) >= UPKEEP_EVERY.unsigned_abs();
        let write = self.place_written.as_ref().is_none_or(|(was, at)| was != place || due(*at));
        Upkeep { place: write, prune: self.pruned_at.is_none_or(due) }
    }
}

/// Re-publish the last record, stamped with the coordinator's clock, whenever it is `every`
/// old, until `stop`: the agent loop may be busy with a restart for minutes, the node is not
/// down.
pub(crate) async fn heartbeat_loop(
    coord: Arc<dyn Coordinator>,
    keys: Keys,
    record: SharedRecord,
    every: Duration,
    ttl: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    while ticked(&mut tick, &stop).await {
        // NB: only a record no cycle published for `every` is re-published (a healthy node's
        // heartbeat costs nothing); the clock is read outside the lock, then the record is
        // taken again under it, held to the write: a cycle's publication waits for this one's
        // write, never lands before it, and one that landed meanwhile is not written over.
        let stale = |last: &Published| last.as_ref().is_some_and(|(_, at)| at.elapsed() >= every);
        if !stale(&*record.0.lock().await) {
            continue;
        }
        let Ok(now) = coord.time().await else { continue };
        let mut last = record.0.lock().await;
        if !stale(&last) {
            continue;
        }
        let Some((mut rec, _)) = last.clone() else { continue };
        rec.updated_at = now;
        match publish(coord.as_ref(), &keys, &rec, ttl).await {
            Ok(()) => *last = Some((rec, tokio::time::Instant::now())),
            Err(e) => tracing::debug!(error = %e, "heartbeat not published"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::coord::memory::MemoryCoordinator;
    use crate::coord::{Reply, Request};
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::Notify;

    /// A coordinator whose first clock read waits to be released (after saying it began): the
    /// heartbeat caught between taking the record and writing it.
    struct Held {
        inner: MemoryCoordinator,
        first: AtomicBool,
        entered: Notify,
        release: Notify,
    }

    #[async_trait::async_trait]
    impl Coordinator for Held {
        fn describe(&self) -> String {
            "held".into()
        }
        async fn execute(&self, request: Request) -> Result<Reply, CoordError> {
            if matches!(request, Request::Time) && self.first.swap(false, Ordering::SeqCst) {
                self.entered.notify_one();
                self.release.notified().await;
            }
            self.inner.execute(request).await
        }
    }

    fn record(verdict: &str) -> NodeRecord {
        let rec = NodeRecord::from_fields(&[("node".to_string(), "n1".to_string())].into());
        let mut rec = rec.expect("a record with a node");
        rec.workers.insert("w".into(), verdict.into());
        rec
    }

    /// The heartbeat took the record ("healthy") and a cycle then published a newer one
    /// ("hung"): the heartbeat's write must not land after the cycle's.
    #[tokio::test]
    async fn the_heartbeat_never_writes_an_older_record_over_a_cycle_s() {
        let held = Arc::new(Held {
            inner: MemoryCoordinator::new(Arc::new(SystemClock)),
            first: AtomicBool::new(true),
            entered: Notify::new(),
            release: Notify::new(),
        });
        let coord: Arc<dyn Coordinator> = held.clone();
        let (keys, ttl) = (Keys::new("p", "n1"), Duration::from_secs(60));
        let shared = SharedRecord::default();
        let old = record("healthy");
        let noted = shared.publish(&old, async { Ok::<_, CoordError>(()) });
        noted.await.unwrap();
        let stop = CancellationToken::new();
        let every = Duration::from_millis(20);
        let beat =
            heartbeat_loop(coord.clone(), keys.clone(), shared.clone(), every, ttl, stop.clone());
        let beat = tokio::spawn(beat);
        held.entered.notified().await;
        let (c, k, s) = (coord.clone(), keys.clone(), shared.clone());
        let cycle = tokio::spawn(async move {
            let new = record("hung");
            s.publish(&new, publish(c.as_ref(), &k, &new, ttl)).await
        });
        for _ in 0..20 {
            tokio::task::yield_now().await; // the cycle's write, were it not held back
        }
        held.release.notify_one();
        cycle.await.unwrap().unwrap();
        stop.cancel();
        beat.await.unwrap();
        let stored = coord.hgetall(&keys.agent()).await.unwrap();
        let stored = NodeRecord::from_fields(&stored).unwrap();
        assert_eq!(
            stored.workers["w"], "hung",
            "the cycle's record, not the heartbeat's older one"
        );
        assert_eq!(shared.last().await.unwrap().workers["w"], "hung");
    }

    #[test]
    fn the_place_and_the_pruning_are_written_when_due_not_every_cycle() {
        let mut c = Cycle::default();
        assert_eq!(c.upkeep("[\"a\",\"\"]", 0), Upkeep::ALL, "first publication");
        c.place_written = Some(("[\"a\",\"\"]".into(), 0));
        c.pruned_at = Some(0);
        assert_eq!(c.upkeep("[\"a\",\"\"]", 5_000), Upkeep::NONE);
        let moved = c.upkeep("[\"b\",\"\"]", 5_000);
        assert_eq!((moved.place, moved.prune), (true, false), "a new place");
        assert_eq!(c.upkeep("[\"a\",\"\"]", UPKEEP_EVERY), Upkeep::ALL);
        assert_eq!(c.upkeep("[\"a\",\"\"]", -UPKEEP_EVERY), Upkeep::ALL, "clock back");
    }
}
