//! The agent loop: every `poll_interval`, read the coordinator's clock, list the opted-in workers,
//! evaluate each (see `crate::hang::restart`), and keep going whatever fails.
//!
//! Fail closed: without the coordinator there is no lock and no breaker, so there is no restart —
//! the cycle stops at the first coordinator error, says so once, counts it, and retries with
//! backoff. State lives in the coordinator, so nothing is lost when it returns.
//!
//! The cycle reads here top to bottom; each step it delegates lives in a module named for it:
//! `roster` (which container speaks for which worker), `restart` (one worker's evaluation),
//! `heartbeat` (the node's record and the cycle's one batch), `outage` (the coordinator's and
//! the runtime's outages, alerted once), `reload` (a SIGHUP configuration merged in).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::accel::gpu::model::GpuReport;
use crate::accel::gpu::policy as gpu_policy;
use crate::alerts::gate::AlertGate;
use crate::alerts::Notifier;
use crate::config::reload;
use crate::config::Config;
use crate::coord::{CoordError, Coordinator, Keys};
use crate::fleet::heartbeat::{Cycle, SharedRecord};
use crate::hang::context::Context;
use crate::hang::journal::{About, Journal};
use crate::hang::marks;
use crate::hang::outage::Outages;
use crate::hang::policy::{NodeContext, Verdict};
use crate::hang::policy_rhythm::Rhythm;
use crate::hang::restart::RestartPath;
use crate::hang::roster::Roster;
use crate::hang::stand_down::NodeWatch;
use crate::http::health::Health;
use crate::metrics::Metrics;
use crate::node::controller::SharedFacts;
use crate::node::info::NodeInfoRx;
use crate::runtime::{Container, ContainerRuntime};
use crate::trail::{Code, Trail};

pub struct Agent {
    /// The configuration, the node's keys and the adapters, shared with the restart path.
    ctx: Context,
    pub(crate) health: Arc<Health>,
    /// Identifies this process in the trail (two agents on one node are told apart).
    pub(crate) instance: String,
    journal: Journal,
    alerts: AlertGate,
    /// Shutdown, maintenance and GPU state of the node, fed by other tasks.
    watch: NodeWatch,
    /// The coordinator's and the runtime's outages, alerted once each.
    outages: Outages,
    /// Invalid and ambiguous worker ids, alerted once each.
    roster: Roster,
    /// New configurations from SIGHUP.
    reload: Option<watch::Receiver<Config>>,
    /// The GPU report of this cycle.
    gpu: GpuReport,
    /// The node record, re-published by the heartbeat task between cycles.
    record: SharedRecord,
    cycle: Cycle,
    /// Each watched worker's learned rhythm (`policy.learned`), by worker id; in memory only:
    /// an agent restart learns again, meanwhile the fixed rule judges.
    rhythms: HashMap<String, Rhythm>,
    /// The node's previous record's time lost has been taken up (`seed_lost`).
    lost_seeded: bool,
}

/// The result of one cycle, for tests and the loop's pacing.
#[derive(Debug, Default, PartialEq)]
pub struct CycleReport {
    pub verdicts: Vec<(String, Verdict)>,
    pub coordinator_error: Option<String>,
    pub runtime_error: Option<String>,
}

impl Agent {
    pub fn new(
        cfg: Config,
        coord: Arc<dyn Coordinator>,
        runtime: Arc<dyn ContainerRuntime>,
        notifier: Notifier,
        metrics: Arc<Metrics>,
    ) -> Agent {
        let keys = Keys::new(&cfg.redis.key_prefix, &cfg.node_name);
        metrics.cycle.set_dry_run(cfg.dry_run);
        let instance = format!("{}-{:04x}", std::process::id(), rand::random::<u16>());
        let trail = Trail {
            coord: coord.clone(),
            keys: keys.clone(),
            instance: instance.clone(),
            max_len: cfg.redis.trail_max_len,
            metrics: metrics.clone(),
            dry_run: cfg.dry_run,
        };
        Agent {
            journal: Journal::new(trail),
            alerts: AlertGate::new(&instance),
            health: Arc::new(Health::default()),
            instance,
            watch: NodeWatch::default(),
            outages: Outages::new(cfg.poll_interval),
            roster: Roster::default(),
            reload: None,
            gpu: GpuReport::default(),
            record: Default::default(),
            cycle: Cycle::default(),
            rhythms: HashMap::new(),
            lost_seeded: false,
            ctx: Context {
                cfg,
                keys,
                coord,
                runtime,
                notifier,
                metrics,
            },
        }
    }

    /// The node's key names.
    pub fn keys(&self) -> &Keys {
        &self.ctx.keys
    }

    /// The metrics this agent records into.
    pub fn metrics(&self) -> &Metrics {
        &self.ctx.metrics
    }

    /// The decision trail this agent writes.
    pub fn trail(&self) -> Trail {
        self.journal.trail.clone()
    }

    /// Fire `term` to stand restarts down as `run` does at SIGTERM (for callers that drive
    /// `cycle` themselves, like the seeded simulation).
    pub fn with_shutdown(mut self, term: CancellationToken) -> Self {
        self.watch.term = term;
        self
    }

    /// The record the heartbeat task re-publishes.
    pub(crate) fn heartbeat_record(&self) -> SharedRecord {
        self.record.clone()
    }

    /// Share the maintenance controller's view of the node.
    pub fn with_facts(mut self, facts: SharedFacts) -> Self {
        self.watch.facts = facts;
        self
    }

    /// Follow the GPU monitor: a worker on a failed GPU is never restarted.
    pub fn with_gpu(mut self, rx: watch::Receiver<GpuReport>) -> Self {
        self.watch.gpu = Some(rx);
        self
    }

    /// Follow the TPU monitor: no worker of a node whose TPU failed is restarted.
    pub fn with_tpu(mut self, rx: watch::Receiver<crate::accel::tpu::model::TpuReport>) -> Self {
        self.watch.tpu = Some(rx);
        self
    }

    /// Follow the Node source (`crate::node::info`): the record carries the pool, slice,
    /// provisioning model, accelerator and TPU topology it reads.
    pub(crate) fn with_node_info(mut self, rx: NodeInfoRx) -> Self {
        self.watch.node_info = Some(rx);
        self
    }

    /// Receive new configurations (SIGHUP reloads).
    pub(crate) fn with_reload(mut self, rx: watch::Receiver<Config>) -> Self {
        self.reload = Some(rx);
        self
    }

    /// Apply a reloaded configuration (see [`reload::merge`]: some keys keep their running
    /// values).
    pub(crate) fn apply_reload(&mut self, new: Config) {
        let Some(cfg) = reload::merge(&self.ctx.cfg, new) else {
            return;
        };
        self.ctx.metrics.cycle.set_dry_run(cfg.dry_run);
        self.journal.trail.dry_run = cfg.dry_run;
        tracing::info!(dry_run = cfg.dry_run, "config reloaded");
        self.ctx.cfg = cfg;
    }

    /// One evaluation cycle over every opted-in worker of this node.
    pub async fn cycle(&mut self) -> CycleReport {
        let started = tokio::time::Instant::now();
        let mut report = CycleReport::default();
        self.health.beat().await;
        if let Some(new) = reload::take(&mut self.reload) {
            self.apply_reload(new);
        }
        if let Some(rx) = &self.watch.gpu {
            self.gpu = rx.borrow().clone();
        }
        match self.evaluate_all(&mut report).await {
            Ok(true) => self.alerts.settle(self.ctx.coord.as_ref()).await,
            Ok(false) => return report,
            Err(e) => {
                self.outages.coordinator_failed(&self.ctx, &e).await;
                report.coordinator_error = Some(e.to_string());
                return report;
            }
        }
        self.ctx
            .metrics
            .cycle
            .observe(started.elapsed().as_secs_f64());
        self.cycle.verdicts = report
            .verdicts
            .iter()
            .map(|(w, v)| (w.clone(), v.as_str().to_string()))
            .collect();
        // NB: the coordinator counts as back only after a whole cycle, writes included: a
        // read-only replica answers reads, and must not look healthy.
        match self.publish().await {
            Ok(()) => self.outages.coordinator_ok(&self.ctx),
            Err(e) => {
                self.outages.coordinator_failed(&self.ctx, &e).await;
                report.coordinator_error = Some(e.to_string());
            }
        }
        report
    }

    /// Evaluate every worker; `Ok(false)` when the runtime could not list them.
    async fn evaluate_all(&mut self, report: &mut CycleReport) -> Result<bool, CoordError> {
        self.cycle.deferred.clear();
        self.cycle.gangs.entries.clear();
        self.cycle.gangs.views.clear();
        self.cycle.gangs.tags.clear();
        let now = self.ctx.coord.time().await?;
        self.cycle.now = now;
        let containers = match self.ctx.runtime.list_workers().await {
            Ok(c) => c,
            Err(e) => {
                self.outages.runtime_failed(&self.ctx, &e).await;
                report.runtime_error = Some(e.to_string());
                return Ok(false);
            }
        };
        self.outages.runtime_ok(&self.ctx);
        self.ctx.metrics.cycle.set_workers(containers.len());
        self.cycle.places.clear();
        let mut present: HashSet<String> = HashSet::new();
        for (worker, list) in self.roster.group(&self.ctx, containers).await {
            present.insert(worker.clone());
            if list.len() > 1 {
                let (journal, alerts) = (&mut self.journal, &mut self.alerts);
                self.roster
                    .ambiguous(&self.ctx, journal, alerts, &worker, &list, now)
                    .await?;
                continue;
            }
            self.roster.unambiguous(&self.ctx, &worker).await?;
            self.cycle.places.insert(worker.clone(), list[0].display());
            let v = self.evaluate_one(&list[0]).await?;
            report.verdicts.push((worker, v));
        }
        // The per-worker series: only the workers with a verdict now (gone, or ambiguous: none).
        let judged: HashSet<&str> = report.verdicts.iter().map(|(w, _)| w.as_str()).collect();
        self.ctx.metrics.workers.retain(|w| judged.contains(w));
        self.rhythms.retain(|w, _| judged.contains(w.as_str()));
        // Open alerts (Alertmanager, PagerDuty) of a worker whose container is gone resolve.
        self.ctx
            .notifier
            .retain(self.ctx.keys.node(), &present)
            .await;
        Ok(true)
    }

    /// One worker, with its own fresh clock and the node's state for it.
    async fn evaluate_one(&mut self, c: &Container) -> Result<Verdict, CoordError> {
        // NB: a fresh clock per worker (a restart of the previous worker can take minutes, and
        // a stale `now` would stamp timers in the past), read with the record and the marks:
        // one round trip per worker.
        let read = marks::read(self.ctx.coord.as_ref(), &self.ctx.keys, &c.worker).await?;
        let now = read.now;
        self.cycle.now = now;
        // Each worker may run the restart pipeline (minutes at worst): the loop is alive.
        self.health.beat().await;
        let gpus = c.gpus.as_deref();
        let node = NodeContext {
            in_maintenance: self.watch.stands_down_at(now, &self.ctx.cfg.metadata),
            gpu_failed: self.gpu.failures_known()
                && gpu_policy::worker_on_failed_gpu(&self.gpu, gpus),
            tpu_failed: self.watch.tpu_failed(),
            container_paused: c.paused,
            container_exited: !c.running && !c.paused,
            container_started: c.started_ms(),
        };
        let now_mono = crate::accel::clock_ms();
        let evidence = gpu_policy::evidence(&self.gpu, gpus, now_mono, &self.ctx.cfg.gpu);
        let mut path = RestartPath {
            ctx: &self.ctx,
            journal: &mut self.journal,
            alerts: &mut self.alerts,
            watch: &self.watch,
            node,
            gpu_evidence: &evidence,
            deferred: &mut self.cycle.deferred,
            gangs: &mut self.cycle.gangs,
            rhythm: self.rhythms.entry(c.worker.clone()).or_default(),
        };
        path.evaluate(c, read).await
    }

    /// Take up the last day's time lost as the node's previous record kept it, once: until it
    /// is read, this agent's record must not replace it.
    async fn seed_lost(&mut self, now: crate::clock::Millis) -> Result<(), CoordError> {
        if self.lost_seeded {
            return Ok(());
        }
        let kept = self.ctx.coord.hgetall(&self.ctx.keys.agent()).await?;
        if let Some(rec) = crate::fleet::view::NodeRecord::from_fields(&kept) {
            self.ctx.metrics.lost.seed(&rec.lost_hours, now);
        }
        self.lost_seeded = true;
        Ok(())
    }

    /// Publish this node's record for the fleet view with the cycle's writes (see
    /// [`Cycle::publish`]).
    async fn publish(&mut self) -> Result<(), CoordError> {
        self.seed_lost(self.cycle.now).await?;
        let maintenance = {
            let f = self.watch.facts.read().unwrap_or_else(|p| p.into_inner());
            f.maintenance.clone()
        };
        let info = self
            .watch
            .node_info
            .as_ref()
            .and_then(|rx| rx.borrow().clone());
        let rec = self
            .cycle
            .record(&self.ctx, &maintenance, &self.gpu, info.as_ref());
        self.cycle.publish(&self.ctx, rec, &self.record).await
    }

    /// Run until `shutdown` fires. Each cycle is paced by `poll_interval`; after a coordinator
    /// error the next try comes sooner, with exponential backoff capped at the interval.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        self.watch.term = shutdown.clone();
        self.announce().await;
        loop {
            let report = self.cycle().await;
            self.health.beat().await;
            let failed = report.coordinator_error.is_some();
            let wait = self.outages.next_wait(failed, self.ctx.cfg.poll_interval);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        tracing::info!("vigil agent stopped");
    }

    /// Say the agent started: in the log, and in the trail when the coordinator answers.
    async fn announce(&mut self) {
        if self.ctx.coord.single_node() {
            tracing::warn!("no REDIS_URL: using the embedded coordinator; safe for ONE agent on ONE node only (no fleet budget across nodes, no HA pair)");
        }
        tracing::info!(
            node = %self.ctx.keys.node(),
            coordinator = %self.ctx.coord.describe(),
            runtime = %self.ctx.runtime.describe(),
            dry_run = self.ctx.cfg.dry_run,
            instance = %self.instance,
            "vigil agent started"
        );
        let Ok(now) = self.ctx.coord.time().await else {
            return;
        };
        let _ = self.seed_lost(now).await;
        let detail = format!(
            "agent {} started (dry_run={})",
            env!("CARGO_PKG_VERSION"),
            self.ctx.cfg.dry_run
        );
        let about = About::worker("-", Verdict::Healthy);
        let _ = self
            .journal
            .note(now, about, Code::AgentStarted, detail)
            .await;
    }
}
