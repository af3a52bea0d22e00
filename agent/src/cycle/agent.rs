//! The agent loop: every `poll_interval`, list the opted-in workers, read the coordinator's
//! clock with every worker's record and marks (one round trip), evaluate each (see
//! `crate::hang::restart`), publish the node's record with the cycle's writes (one more), and
//! keep going whatever fails. A healthy cycle is those two round trips, whatever the number of
//! workers.
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
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::accel::gpu::model::GpuReport;
use crate::accel::gpu::policy as gpu_policy;
use crate::alerts::gate::AlertGate;
use crate::alerts::Notifier;
use crate::config::reload;
use crate::config::Config;
use crate::coord::{Coordinator, Keys, Result, Tally, WorkerRead};
use crate::fleet::heartbeat::{Cycle, SharedRecord};
use crate::hang::context::Context;
use crate::hang::journal::{About, Journal};
use crate::hang::marks::{self, worker_read_keys};
use crate::hang::outage::Outages;
use crate::hang::policy::{NodeContext, Verdict};
use crate::hang::policy_rhythm::Rhythm;
use crate::hang::restart::RestartPath;
use crate::hang::roster::{ByWorker, Roster};
use crate::hang::stand_down::NodeWatch;
use crate::http::health::Health;
use crate::metrics::Metrics;
use crate::runtime::{Container, ContainerRuntime};
use crate::trail::{Code, Trail};
use crate::vocab::node_info::NodeInfo;
use crate::vocab::stand_down::SharedFacts;

pub struct Agent {
    /// The configuration, the node's keys and the adapters, shared with the restart path.
    ctx: Context,
    pub(crate) health: Arc<Health>,
    /// Writes the trail as this process (`journal.trail.instance`: two agents on one node are
    /// told apart).
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
    /// `dry_run` as this agent runs it (a SIGHUP's, once accepted), for the node controller
    /// ([`Agent::dry_run`]).
    dry_run: watch::Sender<bool>,
    /// The GPU report of this cycle.
    gpu: GpuReport,
    /// The node record, re-published by the heartbeat task between cycles.
    pub(crate) record: SharedRecord,
    cycle: Cycle,
    /// What is kept of each watched worker, by worker id: its learned rhythm
    /// (`policy.learned`; its history is the coordinator's, `worker:W:rhythm`, what it saw of the
    /// current incarnation is this process's: an agent restart sees it anew, meanwhile the fixed
    /// rule judges) and, in a gang, its pace (`gang.pace`; in memory only).
    kept: HashMap<String, (Rhythm, crate::hang::policy_pace::Pace)>,
    /// The host's pressure and steal (`gang.pace`'s evidence from the host), read once a cycle.
    host: crate::hang::pressure::HostPressure,
    /// The slow gangs naming a member of this node, for the node controller (`VigilSlow`).
    slow_named: Option<watch::Sender<crate::vocab::node::SlowNamed>>,
    /// The node's previous record's time lost has been taken up (`seed_lost`).
    lost_seeded: bool,
    /// Counts what the cycle asks of the coordinator (it is `ctx.coord`): a worker's part of
    /// the cycle's one read is used only while nothing was asked since (see [`Prefetch`]).
    tally: Arc<Tally>,
}

/// How long the cycle's one read of its node serves the workers evaluated after it. A healthy
/// cycle evaluates every worker within microseconds; a worker after a slow one is read again.
const PREFETCH_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// The cycle's one read of its node (the clock, every worker's record and marks), handed to
/// each worker's evaluation while it is as good as a read of its own: nothing asked of the
/// coordinator since by this cycle (its evaluations, its trail, its alerts' claims: everything
/// through `ctx.coord`), and younger than [`PREFETCH_FRESH_FOR`]. NB: a worker evaluated after
/// one that acted (an incident's marks, a lock, a restart that takes minutes) is read again on
/// its own, so no decision is made on a read older than the last thing the cycle did. Writes of
/// other tasks (a worker's beat through the worker API, the maintenance controller) are not
/// counted: they are what any read may miss by a moment, and before any command the pipeline
/// reads the worker afresh and takes the node lock itself.
struct Prefetch {
    reads: HashMap<String, WorkerRead>,
    requests: u64,
    at: Instant,
}

impl Prefetch {
    /// `worker`'s part of the read, if it is still as good as a read of its own.
    fn take(&mut self, worker: &str, requests: u64) -> Option<WorkerRead> {
        let read = self.reads.remove(worker)?;
        let fresh = requests == self.requests && self.at.elapsed() < PREFETCH_FRESH_FOR;
        fresh.then_some(read)
    }
}

#[cfg(any(test, feature = "bench"))]
impl Agent {
    /// The metrics this agent records into.
    pub fn metrics(&self) -> &Metrics {
        &self.ctx.metrics
    }

    /// Fire `term` to stand restarts down as `run` does at SIGTERM (for callers that drive
    /// `cycle` themselves, like the seeded simulation).
    pub fn with_shutdown(mut self, term: CancellationToken) -> Self {
        self.watch.term = term;
        self
    }

    /// Read the host's pressure and steal from procfs at `root` (`/proc` by default; tests
    /// point it at files of their own, or at none).
    pub fn with_host_procfs(mut self, root: impl Into<std::path::PathBuf>) -> Self {
        self.host = crate::hang::pressure::HostPressure::at(root);
        self
    }
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
        let tally = Arc::new(Tally::new(coord));
        let coord: Arc<dyn Coordinator> = tally.clone();
        metrics.cycle.set_dry_run(cfg.dry_run);
        let instance = format!("{}-{:04x}", std::process::id(), rand::random::<u16>());
        Agent {
            journal: Journal::new(Trail {
                coord: coord.clone(),
                keys: keys.clone(),
                instance: instance.clone(),
                max_len: cfg.redis.trail_max_len,
                metrics: metrics.clone(),
                dry_run: cfg.dry_run,
            }),
            alerts: AlertGate::new(&instance),
            health: Arc::new(Health::default()),
            watch: NodeWatch::default(),
            outages: Outages::new(cfg.poll_interval),
            roster: Roster::default(),
            reload: None,
            dry_run: watch::channel(cfg.dry_run).0,
            gpu: GpuReport::default(),
            record: Default::default(),
            cycle: Cycle::default(),
            kept: HashMap::new(),
            slow_named: None,
            host: Default::default(),
            lost_seeded: false,
            tally,
            ctx: Context { cfg, keys, coord, runtime, notifier, metrics },
        }
    }

    /// The node's key names.
    pub fn keys(&self) -> &Keys {
        &self.ctx.keys
    }

    /// The decision trail this agent writes.
    pub fn trail(&self) -> Trail {
        self.journal.trail.clone()
    }

    /// `dry_run` as this agent runs it: the node controller's taints follow a SIGHUP's change
    /// once the cycle accepted it (an invalid configuration changes nothing).
    pub fn dry_run(&self) -> watch::Receiver<bool> {
        self.dry_run.subscribe()
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
    pub(crate) fn with_node_info(mut self, rx: watch::Receiver<Option<NodeInfo>>) -> Self {
        self.watch.node_info = Some(rx);
        self
    }

    /// Tell the node controller which slow gangs name a member of this node (`gang.pace`).
    pub fn with_slow_named(mut self, tx: watch::Sender<crate::vocab::node::SlowNamed>) -> Self {
        self.slow_named = Some(tx);
        self
    }

    /// Receive new configurations (SIGHUP reloads).
    pub fn with_reload(mut self, rx: watch::Receiver<Config>) -> Self {
        self.reload = Some(rx);
        self
    }

    /// One evaluation cycle over every opted-in worker of this node.
    pub async fn cycle(&mut self) -> CycleReport {
        let started = Instant::now();
        let mut report = CycleReport::default();
        self.health.beat().await;
        if let Some(new) = reload::take(&mut self.reload) {
            self.apply_reload(new).await;
        }
        if let Some(rx) = &self.watch.gpu {
            self.gpu = rx.borrow().clone();
        }
        // NB: the coordinator counts as back only after a whole cycle, writes included: a
        // read-only replica answers reads, and must not look healthy.
        let wrote = match self.evaluate_all(&mut report).await {
            Ok(true) => self.finish_cycle(&report, started).await,
            Ok(false) => self.republish().await,
            Err(e) => Err(e),
        };
        // The cycle's writes went through (the coordinator is up), or failed (a failed cycle).
        match wrote {
            Ok(()) => self.outages.coordinator_ok(&self.ctx),
            Err(e) => {
                self.outages.coordinator_failed(&self.ctx, &e, started).await;
                report.coordinator_error = Some(e.to_string());
            }
        }
        report
    }

    /// A SIGHUP's configuration merged in (see `reload::merge`: some keys keep their running
    /// values), and written once in the trail: the keys that changed, those kept until a restart.
    async fn apply_reload(&mut self, new: Config) {
        let file = new.clone();
        let Some(cfg) = reload::merge(&self.ctx.cfg, new) else { return };
        let detail = reload_detail(&self.ctx.cfg, &cfg, &file);
        self.ctx.metrics.cycle.set_dry_run(cfg.dry_run);
        self.journal.trail.dry_run = cfg.dry_run;
        self.dry_run.send_replace(cfg.dry_run);
        tracing::info!(dry_run = cfg.dry_run, "config reloaded");
        self.ctx.cfg = cfg;
        // NB: as `announce`: without the coordinator, the log lines stand alone.
        let Ok(now) = self.ctx.coord.time().await else { return };
        let about = About::worker("-", Verdict::Healthy);
        if let Err(e) = self.journal.note(now, about, Code::ConfigReloaded, detail).await {
            tracing::warn!(error = %e, "config-reloaded not stored in the trail");
        }
    }

    /// The runtime is down: the node's record goes out all the same, its node-level facts
    /// (maintenance, GPU health, Node info) as of now, its workers, places and gangs as last
    /// shown (this agent's last record, else its predecessor's in the coordinator). NB: that
    /// write is what tells the coordinator is up (without it, a blip left
    /// `vigil_coordinator_up` at 0 until the runtime returned, and VigilCoordinatorDown fired
    /// for a healthy Redis); not the cycle's own workers: a cycle that failed at the coordinator
    /// after listing them left them half-built.
    async fn republish(&mut self) -> Result<()> {
        self.seed_lost(self.cycle.now).await?;
        let mut rec = self.cycle.record(&self.ctx, &self.watch, &self.gpu);
        // NB: since when: this agent's own count (never its last record's: an outage that
        // ended may still be in it until its next publication), or a predecessor's.
        let last = self.record.last().await;
        let kept = if last.is_none() { kept_record(&self.ctx).await? } else { None };
        let was = kept.as_ref().and_then(|k| k.runtime_down);
        rec.runtime_down = Some(self.outages.runtime_down_since(was, self.cycle.now));
        if let Some(shown) = last.or(kept) {
            (rec.workers, rec.places, rec.gangs) = (shown.workers, shown.places, shown.gangs);
        }
        let (ttl, coord) = (self.ctx.cfg.fleet.heartbeat_ttl, self.ctx.coord.as_ref());
        let write = crate::fleet::view::publish(coord, &self.ctx.keys, &rec, ttl);
        self.record.publish(&rec, write).await
    }

    /// Evaluate every worker; `Ok(false)` when the runtime could not list them.
    async fn evaluate_all(&mut self, report: &mut CycleReport) -> Result<bool> {
        self.cycle.deferred.clear();
        self.cycle.gangs.entries.clear();
        self.cycle.gangs.reads.views.clear();
        self.cycle.gangs.tags.clear();
        let containers = match self.ctx.runtime.list_workers().await {
            Ok(c) => c,
            Err(e) => {
                self.outages.runtime_failed(&self.ctx, &e).await;
                report.runtime_error = Some(e.to_string());
                // NB: the coordinator is still asked: its outage is alerted (and fails the
                // cycle closed) whatever the runtime does.
                self.cycle.now = self.ctx.coord.time().await?;
                return Ok(false);
            }
        };
        self.outages.runtime_ok(&self.ctx);
        self.ctx.metrics.cycle.set_workers(containers.len());
        self.cycle.places.clear();
        let groups = self.roster.group(&self.ctx, containers).await;
        let mut prefetch = self.read_node(&groups).await?;
        let now = self.cycle.now;
        let host = if self.ctx.cfg.gang.pace.enabled { self.host.signals(now) } else { Vec::new() };
        let present: HashSet<String> = groups.keys().cloned().collect();
        for (worker, list) in groups {
            if list.len() > 1 {
                let (journal, alerts) = (&mut self.journal, &mut self.alerts);
                self.roster.ambiguous(&self.ctx, journal, alerts, &worker, &list, now).await?;
                continue;
            }
            self.roster.unambiguous(&self.ctx, &worker).await?;
            self.cycle.places.insert(worker.clone(), list[0].display());
            let read = match prefetch.take(&worker, self.tally.requests()) {
                Some(read) => read,
                None => marks::read(self.ctx.coord.as_ref(), &self.ctx.keys, &worker).await?,
            };
            let v = self.evaluate_one(&list[0], read, &host).await?;
            report.verdicts.push((worker, v));
        }
        self.roster.forget_gone(&self.ctx, &present).await?;
        self.forget_the_gone(report, &present).await;
        Ok(true)
    }

    /// The cycle's one read: the clock (the cycle's `now`) and every unambiguous worker's record
    /// and marks, in one round trip whatever the number of workers — a healthy cycle is this
    /// read and the batch that publishes it.
    async fn read_node(&mut self, groups: &ByWorker) -> Result<Prefetch> {
        let single: Vec<&str> =
            groups.iter().filter(|(_, list)| list.len() == 1).map(|(w, _)| w.as_str()).collect();
        let asked: Vec<_> = single.iter().map(|w| worker_read_keys(&self.ctx.keys, w)).collect();
        let read = self.ctx.coord.read_workers(&asked).await?;
        self.cycle.now = read.now;
        let reads = single.iter().map(|w| w.to_string()).zip(read.workers).collect();
        Ok(Prefetch { reads, requests: self.tally.requests(), at: Instant::now() })
    }

    /// Tell the node controller which slow gangs name a member of this node (`VigilSlow`), when
    /// that changed.
    fn show_slow(&self) {
        let Some(tx) = &self.slow_named else { return };
        let on = self.ctx.cfg.gang.pace.enabled;
        let named: crate::vocab::node::SlowNamed =
            self.kept.values().filter(|_| on).filter_map(|(_, p)| p.named.clone()).collect();
        tx.send_if_modified(|now| std::mem::replace(now, named) != *now);
    }

    /// What is kept per worker goes with the workers not judged this cycle (gone, or
    /// ambiguous): their series, their rhythms, and the open alerts of those whose container
    /// is gone (Alertmanager, PagerDuty), which resolve.
    async fn forget_the_gone(&mut self, report: &CycleReport, present: &HashSet<String>) {
        let judged: HashSet<&str> = report.verdicts.iter().map(|(w, _)| w.as_str()).collect();
        self.ctx.metrics.workers.retain(|w| judged.contains(w));
        self.ctx.metrics.pace.retain(|w| judged.contains(w));
        self.kept.retain(|w, _| judged.contains(w.as_str()));
        self.ctx.notifier.retain(self.ctx.keys.node(), present).await;
    }

    /// One worker, with its read (the cycle's, or its own when the cycle's is no longer as good:
    /// see [`Prefetch`]), the node's state for it and what the host's pressure says this cycle.
    async fn evaluate_one(
        &mut self,
        c: &Container,
        read: WorkerRead,
        host: &[String],
    ) -> Result<Verdict> {
        let now = read.now;
        self.cycle.now = now;
        // Each worker may run the restart pipeline (minutes at worst): the loop is alive.
        self.health.beat().await;
        let gpus = c.gpus.as_deref();
        // NB: its own statement: the facts' read lock ends here, before the GPU and TPU reads.
        let in_maintenance = self.watch.read_facts().stands_down(now, &self.ctx.cfg.metadata);
        let node = NodeContext {
            in_maintenance,
            gpu_failed: self.gpu.failures_known()
                && gpu_policy::worker_on_failed_gpu(&self.gpu, gpus),
            tpu_failed: self.watch.tpu_failed(),
            container_paused: c.paused,
            container_exited: !c.running && !c.paused,
            container_started: c.started_ms(),
        };
        let now_mono = crate::accel::clock_ms();
        let evidence = gpu_policy::evidence(&self.gpu, gpus, now_mono, &self.ctx.cfg.gpu);
        let mut slow = crate::accel::gpu::policy_slow::slow_signals(&self.gpu, gpus);
        slow.extend(host.iter().cloned());
        let xids = self.ctx.cfg.gpu.xid_overrides();
        let machine_slow = crate::accel::gpu::policy_slow::machine_slow(&self.gpu, gpus, &xids)
            || self.host.stolen();
        let (rhythm, pace) = self.kept.entry(c.worker.clone()).or_default();
        let mut path = RestartPath {
            ctx: &self.ctx,
            journal: &mut self.journal,
            alerts: &mut self.alerts,
            watch: &self.watch,
            node,
            gpu_evidence: &evidence,
            deferred: &mut self.cycle.deferred,
            gangs: &mut self.cycle.gangs,
            rhythm,
            slow_signals: &slow,
            machine_slow,
            pace,
        };
        path.evaluate(c, read).await
    }

    /// Take up the last day's time lost as the node's previous record kept it, once: until it
    /// is read, this agent's record must not replace it.
    async fn seed_lost(&mut self, now: crate::clock::Millis) -> Result<()> {
        if self.lost_seeded {
            return Ok(());
        }
        if let Some(rec) = kept_record(&self.ctx).await? {
            self.ctx.metrics.lost.seed(&rec.lost_hours, now);
        }
        self.lost_seeded = true;
        Ok(())
    }

    /// The end of a cycle that listed its workers: the slow gangs shown, the pages owed sent,
    /// the alerts' claims settled, and this node's record published for the fleet view with the
    /// cycle's writes (see [`Cycle::publish`]).
    async fn finish_cycle(&mut self, report: &CycleReport, started: Instant) -> Result<()> {
        self.show_slow();
        // The pages whose claim got no answer in an earlier cycle, sent once their claim is won
        // (`AlertGate::owed`).
        let (lease, coord) = (self.ctx.cfg.safety.lock_ttl, self.ctx.coord.as_ref());
        for alert in self.alerts.owed(coord, self.cycle.now, lease).await {
            self.ctx.notifier.send(&alert).await;
        }
        self.alerts.settle(coord).await;
        self.ctx.metrics.cycle.observe(started.elapsed().as_secs_f64());
        self.cycle.verdicts =
            report.verdicts.iter().map(|(w, v)| (w.clone(), v.as_str().into())).collect();
        self.seed_lost(self.cycle.now).await?;
        let rec = self.cycle.record(&self.ctx, &self.watch, &self.gpu);
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
            let wait = self.outages.next_wait(report.coordinator_error.is_some());
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
            instance = %self.journal.trail.instance,
            "vigil agent started"
        );
        let Ok(now) = self.ctx.coord.time().await else { return };
        let _ = self.seed_lost(now).await;
        let (version, dry_run) = (env!("CARGO_PKG_VERSION"), self.ctx.cfg.dry_run);
        let detail = format!("agent {version} started (dry_run={dry_run})");
        let about = About::worker("-", Verdict::Healthy);
        let _ = self.journal.note(now, about, Code::AgentStarted, detail).await;
    }
}

/// The `config-reloaded` detail: the keys whose running values changed (`old` → `merged`), and
/// those the file changed that keep their running values until a restart (`merged` → `file`).
/// NB: key names only, compared as serialized: a secret serializes redacted
/// (`crate::redact::Secret`), so no value of one reaches the trail; a change to a secret's hidden
/// part alone (a password; every secret's key is kept until a restart) is named as such.
fn reload_detail(old: &Config, merged: &Config, file: &Config) -> String {
    let keys = |a: &Config, b: &Config| {
        let mut out = Vec::new();
        if let (Ok(a), Ok(b)) = (serde_json::to_value(a), serde_json::to_value(b)) {
            changed_keys("", &a, &b, &mut out);
        }
        out
    };
    let changed = keys(old, merged);
    let mut kept = keys(merged, file);
    if kept.is_empty() && merged != file {
        kept.push("a secret's hidden part".into());
    }
    let list = |k: &[String]| if k.is_empty() { "none".to_string() } else { k.join(", ") };
    format!("config reloaded: changed {}; kept until a restart: {}", list(&changed), list(&kept))
}

/// The dotted keys under `path` whose values differ between `a` and `b`, into `out`.
fn changed_keys(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value::{Null, Object};
    let (Object(x), Object(y)) = (a, b) else {
        if a != b {
            out.push(path.to_string());
        }
        return;
    };
    let names: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
    for name in names {
        let key = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
        changed_keys(&key, x.get(name).unwrap_or(&Null), y.get(name).unwrap_or(&Null), out);
    }
}

/// The node's record as the coordinator keeps it: this agent's last, or its predecessor's.
async fn kept_record(ctx: &Context) -> Result<Option<crate::fleet::view::NodeRecord>> {
    let fields = ctx.coord.hgetall(&ctx.keys.agent()).await?;
    Ok(crate::fleet::view::NodeRecord::from_fields(&fields))
}
