//! The agent loop: every `poll_interval`, read the coordinator's clock, list the opted-in workers,
//! evaluate each (see `crate::engine::restart`), and keep going whatever fails.
//!
//! Fail closed: without the coordinator there is no lock and no breaker, so there is no restart —
//! the cycle stops at the first coordinator error, says so once, counts it, and retries with
//! backoff. State lives in the coordinator, so nothing is lost when it returns.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::actions::alert::{Alert, AlertKind, Notifier};
use crate::backoff::Backoff;
use crate::clock::Millis;
use crate::config::Config;
use crate::coord::marks::{self, MARK_TTL};
use crate::coord::{CoordError, Coordinator, Keys, Op};
use crate::engine::alert_gate::AlertGate;
use crate::engine::context::Context;
use crate::engine::journal::{About, Journal};
use crate::engine::node::SharedFacts;
use crate::engine::restart::RestartPath;
use crate::engine::stand_down::NodeWatch;
use crate::model::gpu::GpuReport;
use crate::model::worker::valid_worker_id;
use crate::observe::fleet::{self, NodeRecord};
use crate::observe::health::Health;
use crate::observe::metrics::Metrics;
use crate::observe::trail::{Code, Trail};
use crate::policy::gpu as gpu_policy;
use crate::policy::restart::{NodeContext, Verdict};
use crate::runtime::{Container, ContainerRuntime};

/// The containers that speak for a worker: the running (or paused) ones; when none is, the one
/// that exited last (reported, never started). An old exited container next to its running
/// replacement is history, not a second claim on the worker id.
fn current_of(list: Vec<Container>) -> Vec<Container> {
    let (live, exited): (Vec<_>, Vec<_>) = list.into_iter().partition(|c| c.running || c.paused);
    if !live.is_empty() {
        return live;
    }
    exited
        .into_iter()
        .max_by(|a, b| a.started_at.cmp(&b.started_at))
        .into_iter()
        .collect()
}

/// A coordinator that comes back must stay up this long before a new outage alerts again.
const REALERT_AFTER: Duration = Duration::from_secs(300);

pub struct Agent {
    /// The configuration, the node's keys and the adapters, shared with the restart path.
    ctx: Context,
    pub health: Arc<Health>,
    /// Identifies this process in the trail (two agents on one node are told apart).
    pub instance: String,
    journal: Journal,
    alerts: AlertGate,
    /// Shutdown, maintenance and GPU state of the node, fed by other tasks.
    watch: NodeWatch,
    coord_down: bool,
    /// When the coordinator last came back (for the coordinator-down alert's hysteresis).
    up_since: Option<tokio::time::Instant>,
    runtime_down: bool,
    ambiguous: HashSet<String>,
    /// Containers already alerted for a label that is not a valid worker id.
    invalid: HashSet<String>,
    /// Pause before the next cycle after a coordinator error.
    backoff: Backoff,
    /// New configurations from SIGHUP.
    reload: Option<watch::Receiver<Config>>,
    /// The GPU report of this cycle.
    gpu: GpuReport,
    /// The node record, re-published by the heartbeat task between cycles.
    record: crate::engine::heartbeat::SharedRecord,
    cycle: Cycle,
}

/// What one cycle gathers for the node's record and batch.
#[derive(Default)]
struct Cycle {
    /// Verdicts of the last cycle, for the heartbeat record.
    verdicts: BTreeMap<String, String>,
    /// Where each worker of the last cycle runs, for the heartbeat record.
    places: BTreeMap<String, String>,
    /// Progress marks to write with this cycle's batch: (key, value).
    deferred: Vec<(String, String)>,
    /// The coordinator's clock as last read in this cycle (stamps the node record).
    now: Millis,
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
            coord_down: false,
            up_since: None,
            runtime_down: false,
            ambiguous: HashSet::new(),
            invalid: HashSet::new(),
            backoff: Backoff::new(Duration::from_millis(250), cfg.poll_interval),
            reload: None,
            gpu: GpuReport::default(),
            record: Default::default(),
            cycle: Cycle::default(),
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
    pub(crate) fn heartbeat_record(&self) -> crate::engine::heartbeat::SharedRecord {
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

    /// Receive new configurations (SIGHUP reloads).
    pub(crate) fn with_reload(mut self, rx: watch::Receiver<Config>) -> Self {
        self.reload = Some(rx);
        self
    }

    /// Apply a reloaded configuration. Keys that need new connections or a new listener keep
    /// their running values, and the log says which.
    pub(crate) fn apply_reload(&mut self, new: Config) {
        let mut merged = new;
        let old = &self.ctx.cfg;
        let mut kept = Vec::new();
        macro_rules! keep {
            ($($field:ident).+, $name:literal) => {
                if merged.$($field).+ != old.$($field).+ {
                    merged.$($field).+ = old.$($field).+.clone();
                    kept.push($name);
                }
            };
        }
        keep!(node_name, "node_name");
        keep!(redis, "redis.*");
        keep!(docker.host, "docker.host");
        keep!(runtime.kind, "runtime.kind");
        keep!(runtime.cri_socket, "runtime.cri_socket");
        keep!(runtime.worker_label, "runtime.worker_label");
        keep!(
            runtime.allow_pod_replacement,
            "runtime.allow_pod_replacement"
        );
        keep!(runtime.pod_resources_socket, "runtime.pod_resources_socket");
        keep!(server, "server.*");
        keep!(alerts, "alerts.*");
        keep!(log, "log.*");
        keep!(metadata, "metadata.*");
        keep!(kubernetes, "kubernetes.*");
        keep!(fleet, "fleet.*");
        keep!(checkpoint, "checkpoint.*");
        keep!(opportunistic, "opportunistic.*");
        keep!(gpu, "gpu.*");
        // The health check's age limit and the controller's tick were sized from it.
        keep!(poll_interval, "poll_interval");
        // The runtime client's own timeout was sized from it at start-up.
        keep!(runtime.restart_timeout, "runtime.restart_timeout");
        if let Err(e) = merged.validate() {
            tracing::error!(error = %e, "config reload refused: the running values of the keys above make the new file invalid; keeping the running config");
            return;
        }
        if !kept.is_empty() {
            tracing::warn!(keys = %kept.join(", "), "config reloaded, but these keys need a restart of the agent to change; their running values are kept");
        }
        self.ctx.metrics.cycle.set_dry_run(merged.dry_run);
        self.journal.trail.dry_run = merged.dry_run;
        tracing::info!(dry_run = merged.dry_run, "config reloaded");
        self.ctx.cfg = merged;
    }

    /// One evaluation cycle over every opted-in worker of this node.
    pub async fn cycle(&mut self) -> CycleReport {
        let started = tokio::time::Instant::now();
        let mut report = CycleReport::default();
        self.health.beat().await;
        self.take_reload();
        if let Some(rx) = &self.watch.gpu {
            self.gpu = rx.borrow().clone();
        }
        match self.evaluate_all(&mut report).await {
            Ok(true) => {}
            Ok(false) => return report,
            Err(e) => {
                self.coordinator_failed(&e).await;
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
        match self.heartbeat().await {
            Ok(()) => self.coordinator_ok(),
            Err(e) => {
                self.coordinator_failed(&e).await;
                report.coordinator_error = Some(e.to_string());
            }
        }
        report
    }

    /// A configuration from SIGHUP, if one arrived.
    fn take_reload(&mut self) {
        let reloaded = self.reload.as_mut().and_then(|rx| {
            rx.has_changed()
                .unwrap_or(false)
                .then(|| rx.borrow_and_update().clone())
        });
        if let Some(new) = reloaded {
            self.apply_reload(new);
        }
    }

    /// Evaluate every worker; `Ok(false)` when the runtime could not list them.
    async fn evaluate_all(&mut self, report: &mut CycleReport) -> Result<bool, CoordError> {
        self.cycle.deferred.clear();
        let now = self.ctx.coord.time().await?;
        self.cycle.now = now;
        let Some(containers) = self.list_workers(report).await else {
            return Ok(false);
        };
        self.ctx.metrics.cycle.set_workers(containers.len());
        self.cycle.places.clear();
        let containers = self.only_valid_ids(containers).await;
        let mut by_worker: BTreeMap<String, Vec<Container>> = BTreeMap::new();
        for c in containers {
            by_worker.entry(c.worker.clone()).or_default().push(c);
        }
        for (worker, list) in by_worker {
            let list = current_of(list);
            if list.len() > 1 {
                self.ambiguous_worker(&worker, &list, now).await?;
                continue;
            }
            self.unambiguous(&worker).await?;
            self.cycle.places.insert(worker.clone(), list[0].display());
            let v = self.evaluate_one(&list[0]).await?;
            report.verdicts.push((worker, v));
        }
        Ok(true)
    }

    /// The opted-in containers; `None` (alerted once per outage) when the runtime is down.
    async fn list_workers(&mut self, report: &mut CycleReport) -> Option<Vec<Container>> {
        match self.ctx.runtime.list_workers().await {
            Ok(c) => {
                if self.runtime_down {
                    tracing::info!(runtime = %self.ctx.runtime.describe(), "container runtime reachable again");
                }
                self.runtime_down = false;
                self.ctx.metrics.backends.set_runtime_up(true);
                Some(c)
            }
            Err(e) => {
                self.ctx.metrics.backends.runtime_error();
                self.ctx.metrics.backends.set_runtime_up(false);
                if !self.runtime_down {
                    self.runtime_down = true;
                    let a = Alert::new(
                        AlertKind::RuntimeDown,
                        self.ctx.keys.node(),
                        format!("{e}; workers cannot be listed or restarted until it returns"),
                    );
                    self.ctx.notifier.send(&a).await;
                }
                report.runtime_error = Some(e.to_string());
                None
            }
        }
    }

    /// Containers whose opt-in label breaks the worker-id rule are never workers: their id would
    /// be read into Redis key names. One alert per container.
    async fn only_valid_ids(&mut self, containers: Vec<Container>) -> Vec<Container> {
        let (valid, invalid): (Vec<_>, Vec<_>) = containers
            .into_iter()
            .partition(|c| valid_worker_id(&c.worker));
        self.invalid
            .retain(|id| invalid.iter().any(|c| &c.id == id));
        for c in invalid {
            if !self.invalid.insert(c.id.clone()) {
                continue;
            }
            let shown: String = c.worker.chars().take(64).collect();
            let a = Alert::new(
                AlertKind::InvalidWorkerId,
                self.ctx.keys.node(),
                format!(
                    "{} carries the opt-in label with {shown:?}, which is not a worker id (1-128 characters of A-Z a-z 0-9 . _ -): it is not watched and never restarted until the label is fixed",
                    c.display()
                ),
            );
            self.ctx.notifier.send(&a).await;
        }
        valid
    }

    /// Several containers claim one worker id: alert once, never guess which one the record
    /// belongs to.
    async fn ambiguous_worker(
        &mut self,
        worker: &str,
        list: &[Container],
        now: Millis,
    ) -> Result<(), CoordError> {
        if !self.ambiguous.insert(worker.to_string()) {
            return Ok(());
        }
        // NB: de-duplicated per node, not per agent: two agents on one node (a rolling update)
        // send one alert and write one trail entry.
        let key = self
            .ctx
            .keys
            .alert_dedup(&format!("ambiguous-{worker}"), "ambiguous");
        let coord = self.ctx.coord.as_ref();
        if !self.alerts.claim(coord, &key, now, MARK_TTL).await? {
            return Ok(());
        }
        let names: Vec<_> = list.iter().map(|c| c.display()).collect();
        let mut a = Alert::new(
            AlertKind::Ambiguous,
            self.ctx.keys.node(),
            format!(
                "{} containers claim worker id `{worker}` ({}); none will be restarted until one label is fixed",
                list.len(),
                names.join(", ")
            ),
        );
        a.worker = Some(worker.to_string());
        self.ctx.notifier.send(&a).await;
        let about = About::worker(worker, Verdict::Healthy).once();
        let detail = "several containers share this worker id".to_string();
        self.journal
            .note(now, about, Code::SkipAmbiguous, detail)
            .await
    }

    /// A worker that is no longer ambiguous: the next time it is, it is a new episode.
    async fn unambiguous(&mut self, worker: &str) -> Result<(), CoordError> {
        if self.ambiguous.remove(worker) {
            let key = self
                .ctx
                .keys
                .alert_dedup(&format!("ambiguous-{worker}"), "ambiguous");
            self.ctx.coord.del(&[key]).await?;
        }
        Ok(())
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
            in_maintenance: self.stands_down_at(now),
            gpu_failed: self.gpu.monitoring && gpu_policy::worker_on_failed_gpu(&self.gpu, gpus),
            container_paused: c.paused,
            container_exited: !c.running && !c.paused,
        };
        let now_mono = crate::engine::gpu::clock_ms();
        let evidence = gpu_policy::evidence(&self.gpu, gpus, now_mono, &self.ctx.cfg.gpu);
        let mut path = RestartPath {
            ctx: &self.ctx,
            journal: &mut self.journal,
            alerts: &mut self.alerts,
            watch: &self.watch,
            node,
            gpu_evidence: &evidence,
            deferred: &mut self.cycle.deferred,
        };
        path.evaluate(c, read).await
    }

    /// Whether maintenance stands restarts down at `now` (coordinator clock).
    fn stands_down_at(&self, now: Millis) -> bool {
        self.watch.stands_down_at(now, &self.ctx.cfg.metadata)
    }

    /// Publish this node's record for the fleet view (best-effort: a failure is only logged,
    /// the next cycle writes it again).
    async fn heartbeat(&mut self) -> Result<(), CoordError> {
        let now = self.cycle.now;
        let maintenance = {
            let f = self.watch.facts.read().unwrap_or_else(|p| p.into_inner());
            f.maintenance.phase.as_str()
        };
        let rec = NodeRecord {
            node: self.ctx.cfg.node_name.clone(),
            pool: self.ctx.cfg.fleet.pool.clone(),
            slice: self.ctx.cfg.fleet.slice.clone(),
            maintenance: maintenance.to_string(),
            gpu: if self.gpu.monitoring {
                self.gpu.node.as_str().into()
            } else {
                "unknown".into()
            },
            workers: self.cycle.verdicts.clone(),
            places: self.cycle.places.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            dry_run: self.ctx.cfg.dry_run,
            updated_at: now,
        };
        // One round trip for the node: the record, the fleet index, the progress marks of the
        // cycle, and the breaker and budget counters the gauges show.
        let s = &self.ctx.cfg.safety;
        let day = crate::policy::caps::breaker_day(now);
        let mut ops = fleet::publish_ops(&self.ctx.keys, &rec, self.ctx.cfg.fleet.heartbeat_ttl);
        ops.extend(self.cycle.deferred.drain(..).map(|(key, value)| Op::Set {
            key,
            value,
            ttl: MARK_TTL,
        }));
        ops.push(Op::Counter {
            key: self.ctx.keys.breaker(&day),
        });
        if s.fleet_budget > 0 {
            let window = crate::policy::caps::fleet_window(now, s.fleet_window);
            ops.push(Op::Counter {
                key: self.ctx.keys.fleet_budget(window),
            });
        }
        let counters = match self.ctx.coord.batch(&ops).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat not published");
                return Err(e);
            }
        };
        if let Ok(mut shared) = self.record.lock() {
            *shared = Some((rec, tokio::time::Instant::now()));
        }
        if let Some(used) = counters.first() {
            let open = crate::policy::caps::breaker_open(*used, s);
            self.ctx.metrics.budgets.set_breaker(*used, open);
        }
        if let Some(used) = counters.get(1) {
            self.ctx.metrics.budgets.set_fleet_budget_used(*used);
        }
        Ok(())
    }

    fn coordinator_ok(&mut self) {
        if self.coord_down {
            tracing::info!(coordinator = %self.ctx.coord.describe(), "coordinator reachable again; restarts resume with the timers it kept");
            self.up_since = Some(tokio::time::Instant::now());
        }
        self.coord_down = false;
        self.backoff.reset();
        self.ctx.metrics.backends.set_coordinator_up(true);
    }

    async fn coordinator_failed(&mut self, e: &CoordError) {
        self.ctx.metrics.backends.coordinator_error();
        self.ctx.metrics.backends.set_coordinator_up(false);
        // NB: hysteresis: an outage that flaps (up for a cycle, down again) is one outage, one
        // alert; a new alert needs the coordinator up for `REALERT_AFTER` first.
        let flapping = self.up_since.is_some_and(|t| t.elapsed() < REALERT_AFTER);
        if !self.coord_down {
            self.coord_down = true;
            if flapping {
                tracing::warn!(error = %e, "coordinator unavailable again (flapping): failing closed; no new alert");
                return;
            }
            tracing::error!(error = %e, "coordinator unavailable: failing closed, no restart until it returns");
            // The de-duplication key lives in the coordinator that is down: alert from memory,
            // once per outage.
            let a = Alert::new(
                AlertKind::CoordinatorDown,
                self.ctx.keys.node(),
                e.to_string(),
            );
            self.ctx.notifier.send(&a).await;
        }
    }

    /// Run until `shutdown` fires. Each cycle is paced by `poll_interval`; after a coordinator
    /// error the next try comes sooner, with exponential backoff capped at the interval.
    pub async fn run(mut self, shutdown: CancellationToken) {
        self.watch.term = shutdown.clone();
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
        if let Ok(now) = self.ctx.coord.time().await {
            let detail = format!(
                "agent {} started (dry_run={})",
                env!("CARGO_PKG_VERSION"),
                self.ctx.cfg.dry_run
            );
            let _ = self
                .journal
                .note(
                    now,
                    About::worker("-", Verdict::Healthy),
                    Code::AgentStarted,
                    detail,
                )
                .await;
        }
        loop {
            let report = self.cycle().await;
            self.health.beat().await;
            let wait = if report.coordinator_error.is_some() {
                self.backoff.next_delay()
            } else {
                self.ctx.cfg.poll_interval
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        tracing::info!("vigil agent stopped");
    }
}
