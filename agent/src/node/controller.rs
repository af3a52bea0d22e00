//! The node controller: follows the metadata watcher, the Node source and the GPU and TPU
//! monitors and turns what they say into what the cluster sees, with one job per part:
//!
//! - the maintenance phase (here): the metadata server's and GKE's node labels' states merged
//!   (`crate::node::policy_info::merge`, the worse of the two), the facts the restart path reads
//!   to stand down, metrics, the trail, and when to checkpoint
//!   (`crate::maintenance::policy::checkpoint_for`);
//! - the Node (`crate::node::publisher`): labels, annotations, taints and Events;
//! - checkpoint rounds (`crate::maintenance::checkpoint`), also on the agent's own SIGTERM;
//! - GPU and TPU publishing, one path (`crate::accel::tracker::HealthTracker`, node/health.rs);
//! - the opt-in opportunistic maintenance claim (`crate::maintenance::opportunistic`).

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::accel::gpu::model::GpuReport;
use crate::accel::tpu::model::TpuReport;
use crate::accel::tracker::HealthTracker;
use crate::alerts::Notifier;
use crate::clock::{parse_rfc3339, Clock, Millis, SystemClock};
use crate::config::Config;
use crate::coord::Coordinator;
use crate::kube::device_taints::KubeDeviceTaints;
use crate::kube::node::{EventType, NodeApi};
use crate::kube::node_source::NodeReader;
use crate::maintenance::opportunistic::{ClaimStep, Opportunistic};
use crate::maintenance::policy::{checkpoint_for, derive, event_for, interruption_starts};
use crate::maintenance::policy_idle::gpu_witness;
use crate::maintenance::request::{Checkpointer, WorkerResult};
use crate::metrics::{Metrics, NodeInfoLabels};
use crate::node::info::NodeInfoRx;
use crate::node::policy_info::{labels_state, merge};
use crate::node::publisher::NodePublisher;
use crate::runtime::ContainerRuntime;
use crate::trail::{Code, Trail};
use crate::vocab::maintenance::{Interruption, MaintenanceState, Phase, RawMetadata, Source};
use crate::vocab::node_info::{place, NodeInfo};
use crate::vocab::stand_down::interrupting;

mod first_reads;
mod health;
mod lost;
mod rounds;
mod slow;

pub use first_reads::facts_at_start;
use first_reads::FirstReads;
use tokio::time::Instant;

// The facts the restart path reads, maintenance's (re-exported: the controller writes them).
pub use crate::vocab::stand_down::{NodeFacts, SharedFacts};

/// A checkpoint round's reason and per-worker results.
type RoundResult = (&'static str, Vec<WorkerResult>);
/// The checkpoint rounds in flight.
type Rounds = tokio::task::JoinSet<RoundResult>;

/// When SIGTERM (or SIGINT) came, stamped once by the signal handler before it fires `term`:
/// the grace period runs from the signal. Unset: now (a test's `term`).
pub type TermAt = Arc<std::sync::OnceLock<tokio::time::Instant>>;

pub struct Controller {
    cfg: Config,
    metrics: Arc<Metrics>,
    facts: SharedFacts,
    /// Where the controller's decisions are written, with the phase as the verdict.
    trail: Trail,
    /// The coordinator, whose clock stamps the controller's notes and losses.
    coord: Arc<dyn Coordinator>,
    node: NodePublisher,
    rounds: Arc<Checkpointer>,
    /// When the last checkpoint round ended (a SIGTERM right after one does not repeat it).
    last_round_ended: Option<tokio::time::Instant>,
    claim: Opportunistic,
    gpu: HealthTracker<GpuReport>,
    /// When the last GPU report arrived (the idle check reads an old one as no answer).
    gpu_seen: Option<tokio::time::Instant>,
    /// The last GPU failure clearing (by sequence number) put in the trail.
    gpu_cleared_seen: u64,
    /// The last XID episode announced (an Event), by number.
    gpu_begun_seen: u64,
    tpu: HealthTracker<TpuReport>,
    /// The TPU monitor's reports, when one runs (see [`Controller::with_tpu`]).
    tpu_rx: Option<watch::Receiver<TpuReport>>,
    /// The slow gangs naming a member of this node, from the cycle (`gang.pace`).
    slow_rx: Option<watch::Receiver<crate::vocab::node::SlowNamed>>,
    /// `dry_run` as the cycle runs it (a SIGHUP changes it: see [`Controller::with_dry_run`]).
    dry_run_rx: Option<watch::Receiver<bool>>,
    /// When SIGTERM came, as the signal handler stamped it ([`Controller::with_term_at`]).
    term_at: TermAt,
    /// The state the node acts on: the two sources' merged.
    state: MaintenanceState,
    /// The metadata server's state alone (the Node labels' is the last read Node's: see
    /// [`Controller::merged`]).
    metadata_state: MaintenanceState,
    /// The Node source's channel (none: the Node is not read).
    node_info: Option<NodeInfoRx>,
    /// The Node as last read (its labels are the label source), and a reader for a fresh look
    /// at SIGTERM (none: not read).
    last_info: Option<NodeInfo>,
    node_reader: Option<Arc<dyn NodeReader>>,
    /// The node's description as last noted in the trail (pool, provisioning, accelerator,
    /// topology), so an unchanged read notes nothing.
    noted_info: Option<String>,
    /// An ongoing episode is checkpointed once.
    checkpointed_episode: bool,
    /// The time being lost now (`lost`).
    losses: lost::Losses,
    notifier: Option<Notifier>,
}

impl Controller {
    /// A controller writing to `trail` (share the agent's, so both show one instance).
    pub fn new(
        cfg: Config,
        coord: Arc<dyn Coordinator>,
        runtime: Arc<dyn ContainerRuntime>,
        metrics: Arc<Metrics>,
        trail: Trail,
    ) -> Controller {
        let rounds = Checkpointer::new(&cfg, coord.clone(), runtime.clone(), metrics.clone());
        Controller {
            node: NodePublisher::new(&cfg, None, metrics.clone()),
            rounds: Arc::new(rounds),
            last_round_ended: None,
            claim: Opportunistic::new(&cfg, coord.clone(), runtime, metrics.clone()),
            trail,
            coord,
            gpu: HealthTracker::default(),
            gpu_seen: None,
            gpu_cleared_seen: 0,
            gpu_begun_seen: 0,
            tpu: HealthTracker::default(),
            tpu_rx: None,
            slow_rx: None,
            dry_run_rx: None,
            term_at: TermAt::default(),
            facts: SharedFacts::default(),
            state: MaintenanceState::default(),
            metadata_state: MaintenanceState::default(),
            node_info: None,
            last_info: None,
            node_reader: None,
            noted_info: None,
            checkpointed_episode: false,
            losses: lost::Losses::default(),
            notifier: None,
            metrics,
            cfg,
        }
    }

    /// Follow the cycle's `dry_run` (`crate::cycle::agent::Agent::dry_run`): a SIGHUP to
    /// observe mode takes the slow taint off and makes the device taints `None` at once, as
    /// the restarts stop (and back).
    pub fn with_dry_run(mut self, rx: watch::Receiver<bool>) -> Self {
        self.dry_run_rx = Some(rx);
        self
    }

    /// The signal handler's stamp of SIGTERM: the round's deadline runs from the signal, as the
    /// agent's drain's does, not from when this loop noticed it (an API call may hold it for
    /// seconds; the drain would then end first, and nothing be recorded).
    pub fn with_term_at(mut self, at: TermAt) -> Self {
        self.term_at = at;
        self
    }

    /// `dry_run` as the cycle now runs it, for the Node's taints and the trail.
    fn follow_dry_run(&mut self) {
        let Some(rx) = self.dry_run_rx.as_mut() else { return };
        if rx.has_changed().unwrap_or(false) {
            let dry_run = *rx.borrow_and_update();
            self.cfg.dry_run = dry_run;
            self.node.set_dry_run(dry_run);
            self.trail.dry_run = dry_run;
        }
    }

    /// Publish to this Node through `api` (without it the Node is left alone).
    pub fn with_node_api(mut self, api: Arc<dyn NodeApi>) -> Self {
        self.node = NodePublisher::new(&self.cfg, Some(api), self.metrics.clone());
        self
    }

    /// Taint a failed GPU's DRA device through `api` (`gpu.device_taints`) instead of the Node.
    pub fn with_device_taints(mut self, api: Arc<KubeDeviceTaints>) -> Self {
        self.node.device_taints = Some(api);
        self
    }

    /// Let the opportunistic idle check read this node's pods through the Kubernetes API and
    /// the kubelet's PodResources API (without them, on Kubernetes, it counts the node busy).
    pub fn with_pod_witnesses(
        mut self,
        pods: Option<Arc<dyn crate::kube::pods::PodApi>>,
        devices: Option<Arc<crate::kube::podresources::PodResourcesClient>>,
    ) -> Self {
        self.claim.pod_api = pods;
        self.claim.kubelet = devices;
        self
    }

    /// Share the facts the restart path reads (see `Agent::with_facts`).
    pub fn with_facts(mut self, facts: SharedFacts) -> Self {
        self.facts = facts;
        self
    }

    /// Follow the TPU monitor's reports (`crate::accel::tpu::monitor`) in [`Controller::run`].
    pub fn with_tpu(mut self, rx: watch::Receiver<TpuReport>) -> Self {
        self.tpu_rx = Some(rx);
        self
    }

    /// Follow the cycle's slow gangs (`gang.pace`): the Node's `VigilSlow` condition, and with
    /// `gang.pace.taint` its taint, while one names a member of this node.
    pub fn with_slow_named(mut self, rx: watch::Receiver<crate::vocab::node::SlowNamed>) -> Self {
        self.slow_rx = Some(rx);
        self
    }

    /// Follow the Node source (`crate::node::info`): GKE's maintenance labels and taint
    /// join the metadata server's notices, and the pool comes from the Node's label.
    pub fn with_node_info(mut self, rx: NodeInfoRx, reader: Option<Arc<dyn NodeReader>>) -> Self {
        self.node_reader = reader;
        self.node_info = Some(rx);
        self
    }

    /// Alerts for node-level GPU and TPU failures go here.
    pub fn with_notifier(mut self, notifier: Notifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// The coordinator's clock; the node's when the coordinator is down.
    async fn now(&self) -> Millis {
        self.coord.time().await.unwrap_or_else(|_| SystemClock.now())
    }

    /// A decision about `worker` into the trail, with the phase as the verdict.
    async fn note_about(&self, worker: &str, code: Code, detail: String) {
        let (at, phase) = (self.now().await, self.state.phase.as_str());
        if let Err(e) = self.trail.record(at, worker, phase, code, detail, None).await {
            tracing::warn!(error = %e, decision = code.as_str(), "decision not stored in the trail");
        }
    }

    /// A decision about the node into the trail.
    async fn note(&self, code: Code, detail: String) {
        self.note_about("-", code, detail).await;
    }

    fn set_phase_metric(&self, phase: Phase) {
        for &p in <Phase as strum::VariantArray>::VARIANTS {
            self.metrics.maintenance.phase(p.as_str(), p == phase);
        }
    }

    /// Act on a new state of the metadata source (merged with the Node labels' as the run loop
    /// merges them), and wait for the checkpoint round it starts (if any) to be recorded. The
    /// run loop does not wait: see [`Controller::transition`].
    pub async fn apply(&mut self, next: MaintenanceState) {
        let mut rounds = Rounds::new();
        self.metadata_state = next;
        self.transition(self.merged(), &mut rounds).await;
        while let Some(done) = rounds.join_next().await {
            self.round_done(done).await;
        }
    }

    /// The state the node acts on: the metadata server's and the last read Node labels' merged
    /// (the worse of the two: the labels never clear what the metadata server says).
    fn merged(&self) -> MaintenanceState {
        merge(&self.metadata_state, &self.last_info.as_ref().map(labels_state).unwrap_or_default())
    }

    /// A new read of the Node: the pool for the claim, the node-info metric, a trail note when
    /// the node's description changed, and the Node kept as last read (GKE's maintenance signals
    /// are the label source's state, not yet acted on: see [`Controller::merged`]).
    async fn take_node_info(&mut self, info: &NodeInfo) {
        let p = place(&self.cfg.fleet, Some(info));
        self.claim.pool = p.pool.clone();
        self.metrics.node_info.set_info(NodeInfoLabels {
            pool: p.pool.clone(),
            provisioning: info.provisioning.as_ref().map_or("", |v| v.metric_label()),
            accelerator: info.accelerator().unwrap_or_default().to_string(),
            tpu_topology: info.tpu_topology.as_ref().map(|t| t.text.clone()).unwrap_or_default(),
        });
        let described = describe(&self.cfg, &p, info);
        if self.noted_info.as_deref() != Some(described.as_str()) {
            self.note(Code::NodeInfo, described.clone()).await;
            self.noted_info = Some(described);
        }
        self.last_info = Some(info.clone());
    }

    /// Act on a new maintenance state. A checkpoint round it calls for is started in `rounds`
    /// and recorded by whoever owns them when it ends.
    ///
    /// NB: the round runs on its own, never awaited here: the workers may take the whole budget
    /// (50 s for a host maintenance) to acknowledge, and a second notice meanwhile (a preemption
    /// two seconds later, 30 s to live) must reach the Node and the workers at once.
    async fn transition(&mut self, next: MaintenanceState, rounds: &mut Rounds) {
        if next == self.state {
            return;
        }
        let prev = std::mem::replace(&mut self.state, next.clone());
        self.record_transition(&prev, &next).await;
        // The pool claim ends with the episode it was taken for.
        if next.phase == Phase::None {
            let step = self.claim.release("maintenance done; pool claim released").await;
            self.claim_changed(step).await;
        }
        let round =
            checkpoint_for(prev.phase, &next, self.checkpointed_episode, &self.cfg.checkpoint);
        // NB: the checkpoint requests go out first, alongside the Node update: on Spot the whole
        // budget is 30 s, and a slow API server must not eat into it.
        if let Some((reason, budget)) = round {
            self.checkpointed_episode = true;
            let r = self.rounds.clone();
            rounds.spawn(async move { (reason, r.request(reason, budget).await) });
        }
        self.node.view.maintenance = next.clone();
        let detail = transition_detail(&prev, &next);
        self.note(Code::Maintenance, detail.clone()).await;
        self.node.publish().await;
        if prev.phase != next.phase {
            let (reason, kind) = event_for(next.phase);
            self.node.event(reason, &format!("maintenance {detail}"), kind).await;
        }
    }

    /// The facts the restart path reads, the phase metric, and the interruption that starts
    /// (counted, and its time counted as lost from now on: see `lost.rs`) or ends.
    async fn record_transition(&mut self, prev: &MaintenanceState, next: &MaintenanceState) {
        let now = self.now().await;
        let ends = interrupting(prev.phase) && !interrupting(next.phase);
        {
            let mut f = self.facts.write().unwrap_or_else(|p| p.into_inner());
            f.maintenance = next.clone();
            if ends {
                f.interruption_ended = Some(now);
            }
        }
        self.set_phase_metric(next.phase);
        for source in [Source::Metadata, Source::NodeLabels] {
            self.metrics.node_info.source(source.as_str(), next.sources.contains(&source));
        }
        self.metrics.maintenance.window_start(next.window_start.as_deref().and_then(parse_rfc3339));
        if matches!(next.phase, Phase::None | Phase::Pending) {
            self.checkpointed_episode = false;
        }
        if interruption_starts(prev.phase, next.phase) {
            let kind = next.interruption.unwrap_or(Interruption::HostMaintenance);
            for reason in &next.reasons {
                self.metrics.maintenance.interruption(kind.as_str(), reason);
            }
            self.begin_interruption(kind, now);
        } else if ends {
            self.end_interruption(now, "it ended").await;
        }
    }

    /// One tick: the Node again if the last write failed (it must converge to the desired
    /// state, not wait for the next change), the DRA device taints are due their periodic look,
    /// or the slow gangs naming this node changed; then opportunistic maintenance.
    pub async fn tick(&mut self) {
        self.follow_dry_run();
        let slow = self.take_slow().await;
        if self.node.stale || self.node.device_taints_due() || slow {
            self.node.publish().await;
        }
        self.opportunistic().await;
    }

    /// One tick of opportunistic maintenance.
    pub async fn opportunistic(&mut self) {
        let age = self.gpu_seen.map(|t| t.elapsed());
        let gpus = gpu_witness(&self.cfg.gpu, self.gpu.report(), age);
        let step = self.claim.tick(&self.state, gpus).await;
        if let Some(detail) = self.claim.note.take() {
            self.note(Code::IdleCheck, detail).await;
        }
        self.claim_changed(step).await;
    }

    /// Show what the claim's step changed: the label, the trail, an Event.
    async fn claim_changed(&mut self, step: ClaimStep) {
        let (claimed, detail) = match step {
            ClaimStep::Unchanged => return,
            ClaimStep::Claimed(detail) => (true, detail),
            ClaimStep::Released(detail) => (false, detail),
        };
        self.node.view.perform_maintenance = Some(claimed);
        self.note(Code::PerformMaintenance, detail).await;
        self.node.publish().await;
        if claimed {
            let message = "node idle; perform-maintenance requested";
            self.node.event("VigilPerformMaintenance", message, EventType::Normal).await;
        }
    }

    /// Follow the metadata watcher (and the Node source, when given) until `term` (SIGTERM:
    /// checkpoint, then return) or `stop`.
    pub async fn run(
        mut self,
        mut rx: watch::Receiver<RawMetadata>,
        mut gpu_rx: watch::Receiver<GpuReport>,
        term: CancellationToken,
        stop: CancellationToken,
    ) {
        let mut rounds = Rounds::new();
        let mut tpu_rx = self.tpu_rx.take();
        let mut node_rx = self.node_info.take();
        let wait = self.cfg.metadata.first_read_wait;
        let mut reads = FirstReads::of(&self.facts, wait, Instant::now());
        self.start(&mut rx, &mut gpu_rx, tpu_rx.as_mut(), node_rx.as_mut(), &mut rounds).await;
        let mut tick = tokio::time::interval(self.cfg.poll_interval);
        let (mut rx, mut gpu_rx) = (Some(rx), Some(gpu_rx));
        loop {
            // What of the node is read so far: restarts wait for the rest (`first_reads`). NB: a
            // closed metadata channel counts as read (`rx` is `None` then).
            reads.observe(&self.facts, rx.as_ref(), node_rx.as_ref(), Instant::now());
            self.follow_dry_run();
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = term.cancelled() => {
                    // NB: `stop` fires `term` too (its child): everything stopping at once (the
                    // restart loop died) is no SIGTERM, and asks no checkpoint.
                    if !stop.is_cancelled() {
                        // The checkpoint, then the interruption under way ends.
                        self.on_sigterm(&mut rounds).await;
                        let now = self.now().await;
                        self.end_interruption(now, "the agent stops: the node is going away").await;
                    }
                    break;
                }
                Some(done) = rounds.join_next(), if !rounds.is_empty() => {
                    self.round_done(done).await;
                }
                // `None`: closed, the watcher is off (not on GCE); keep serving SIGTERM checkpoints.
                raw = next(&mut rx) => if let Some(raw) = raw {
                    self.metadata_state = derive(&raw);
                    self.transition(self.merged(), &mut rounds).await;
                },
                Some(Some(info)) = next(&mut node_rx) => {
                    self.take_node_info(&info).await;
                    self.transition(self.merged(), &mut rounds).await;
                }
                report = next(&mut gpu_rx) => if let Some(r) = report { self.apply_gpu(r).await },
                report = next(&mut tpu_rx) => if let Some(r) = report { self.apply_tpu(r).await },
                _ = tick.tick() => self.tick().await,
            }
        }
    }

    /// Bring the Node in line at start-up (clears what a previous run may have left).
    async fn start(
        &mut self,
        rx: &mut watch::Receiver<RawMetadata>,
        gpu_rx: &mut watch::Receiver<GpuReport>,
        tpu_rx: Option<&mut watch::Receiver<TpuReport>>,
        node_rx: Option<&mut NodeInfoRx>,
        rounds: &mut Rounds,
    ) {
        // NB: seeded with the monitor's start, not with what the channel holds: a verdict the
        // monitor published before this controller looked (a failure in its first sample) is a
        // change like any other, shown at once and applied (the trail, an Event, a page) once
        // the rest of the Node is in line.
        let gpu = gpu_rx.borrow_and_update().clone();
        self.gpu.seed(GpuReport::default(), &self.metrics);
        self.node.view.gpu = gpu.clone();
        // A report only once the monitor has published one (see `NodeView::tpu`).
        if let Some(tpu_rx) = tpu_rx.filter(|r| r.has_changed().unwrap_or(false)) {
            let tpu = tpu_rx.borrow_and_update().clone();
            self.tpu.seed(tpu.clone(), &self.metrics);
            self.node.view.tpu = Some(tpu);
        }
        self.set_phase_metric(Phase::None);
        if let Some(info) = node_rx.and_then(|r| r.borrow_and_update().clone()) {
            self.take_node_info(&info).await;
        }
        self.metadata_state = derive(&rx.borrow_and_update());
        let first = self.merged();
        if first == self.state {
            self.node.publish().await;
        } else {
            self.transition(first, rounds).await;
        }
        self.apply_gpu(gpu).await;
    }
}

/// The next value of `rx`: pending forever without one; `None` once it closed (and `rx` is then
/// `None`, pending from there on).
async fn next<T: Clone>(rx: &mut Option<watch::Receiver<T>>) -> Option<T> {
    let Some(r) = rx else { return std::future::pending().await };
    if r.changed().await.is_err() {
        *rx = None;
        return None;
    }
    Some(r.borrow_and_update().clone())
}

/// The node as the trail notes it: `pool P (fleet.pool|Node label), slice S, provisioning …,
/// accelerator …, TPU topology …`.
fn describe(cfg: &Config, p: &crate::vocab::node_info::Place, info: &NodeInfo) -> String {
    let or_dash = |s: &str| Some(s).filter(|s| !s.is_empty()).unwrap_or("-").to_string();
    let pool_from = if !cfg.fleet.pool.is_empty() {
        " (fleet.pool)"
    } else if p.pool.is_empty() {
        ""
    } else {
        " (Node label)"
    };
    let (pool, slice) = (or_dash(&p.pool), or_dash(&p.slice));
    let provisioning = info.provisioning.as_ref().map_or("-", |v| v.as_str());
    let accelerator = info.accelerator().unwrap_or("-");
    let topology = info.tpu_topology.as_ref().map_or("-", |t| t.text.as_str());
    format!("pool {pool}{pool_from}, slice {slice}, provisioning {provisioning}, accelerator {accelerator}, TPU topology {topology}")
}

/// `prev → next (reasons: …; sources: …; window … – …; can_reschedule=…)` for the trail and
/// the Event.
fn transition_detail(prev: &MaintenanceState, next: &MaintenanceState) -> String {
    let (from, to) = (prev.phase.as_str(), next.phase.as_str());
    let can_reschedule = next.can_reschedule;
    let reasons = if next.reasons.is_empty() { "none".to_string() } else { next.reasons.join(",") };
    let sources = if next.sources.is_empty() { "none".to_string() } else { next.sources_str() };
    let start = next.window_start.as_deref().unwrap_or("-");
    let end = next.window_end.as_deref().unwrap_or("-");
    format!("{from} → {to} (reasons: {reasons}; sources: {sources}; window {start} – {end}; can_reschedule={can_reschedule})")
}
