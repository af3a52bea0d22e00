//! The wiring of `vigil run`: logging, signals, the production adapters, the engines and the
//! server, and the drain at SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accel::tpu::model::TpuReport;
use crate::alerts::alertmanager::AlertmanagerSink;
use crate::alerts::{AlertSink, Fanout, Notifier, WebhookSink};
use crate::clock::SystemClock;
use crate::config::{Config, LogFormat, ProcessEnv, Switch, WorkerAuth};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::redis::RedisCoordinator;
use crate::coord::Coordinator;
use crate::cycle::agent::Agent;
use crate::http::health::Warnings;
use crate::http::listen::{bind_unix, UnixPeers};
use crate::http::procfs::Procfs;
use crate::http::server::{self, ServerState};
use crate::kube::node::{KubeNodeApi, NodeApi};
use crate::kube::node_source::{KubeNodeReader, NodeReader};
use crate::kube::pods::{KubePods, PodApi};
use crate::maintenance::metadata::{watch_with, MetadataClient, WatchConfig};
use crate::metrics::Metrics;
use crate::node::controller::{Controller, TermAt};
use crate::node::info::{self as node_info, NodeInfoRx};
use crate::runtime::ContainerRuntime;
use crate::vocab::maintenance::RawMetadata;
use crate::worker_api::token_review::{CachedReviews, KubeTokenReview};
use crate::worker_api::{self, WorkerApiState};

mod gpu;
mod memory;
mod signals;

use memory::release_start_up_code;
use signals::{install_signals, Signals};

/// How often the agent re-reads its drills (one HGETALL): a drill run from anywhere shows in
/// the metrics within a minute.
const DRILL_EXPORT_EVERY: Duration = Duration::from_secs(60);

fn init_logging(cfg: &Config) {
    use tracing_subscriber::fmt;
    let (filter, set_aside) = cfg.log.filter(&ProcessEnv);
    // NB: colour only for a person at a terminal; a log file or a journal gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    let _ = if cfg.log.format == LogFormat::Json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    // The first log line; on stderr alone where the filter in use drops warnings (`error`).
    if let Some(why) = set_aside {
        if tracing::enabled!(tracing::Level::WARN) {
            tracing::warn!("{why}");
        } else {
            eprintln!("vigil: warning: {why}");
        }
    }
}

/// Why `vigil run` could not start, or did not drain in time, worded for the operator (the CLI
/// exits 1 with it). Its own type, so the wiring does not import the CLI that calls it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct RunError(pub(crate) String);

/// What `vigil run` wires, handed to each part it starts: the config, the production adapters,
/// and the tracker and stop token of the tasks it spawns.
struct Wiring {
    cfg: Config,
    /// The Kubernetes API for pods, when it is on (see `pod_api`).
    pods: Option<Arc<dyn PodApi>>,
    coord: Arc<dyn Coordinator>,
    runtime: Arc<dyn ContainerRuntime>,
    metrics: Arc<Metrics>,
    sink: Option<Arc<dyn AlertSink>>,
    tracker: TaskTracker,
    stop: CancellationToken,
}

/// The Kubernetes API for pods, when it is on (a CRI restart reads the pod's restartPolicy; the
/// opportunistic idle check lists this node's pods).
async fn pod_api(cfg: &Config) -> Option<Arc<dyn PodApi>> {
    let lost = "Kubernetes API unavailable: pods' restartPolicy cannot be read, and opportunistic maintenance counts this node busy";
    Some(connected(cfg, KubePods::connect(&cfg.kubernetes.api_url), lost).await?)
}

/// The Kubernetes client `connect` makes, when the API is on (`connect` is not polled when it is
/// off); `None`, the error logged with `lost` (what goes without it), when it cannot be made.
async fn connected<T, E: std::fmt::Display>(
    cfg: &Config,
    connect: impl std::future::Future<Output = Result<T, E>>,
    lost: &str,
) -> Option<Arc<T>> {
    if !cfg.kubernetes_on() {
        return None;
    }
    connect.await.inspect_err(|e| tracing::error!(error = %e, "{lost}")).ok().map(Arc::new)
}

async fn node_api(cfg: &Config) -> Option<Arc<dyn NodeApi>> {
    if !cfg.kubernetes_on() {
        let enabled = cfg.kubernetes.enabled;
        tracing::info!("not in a Kubernetes cluster (kubernetes.enabled = {enabled}): Node labels and Events off");
        return None;
    }
    let lost = "Kubernetes API unavailable: the Node will not show maintenance state";
    Some(connected(cfg, KubeNodeApi::connect(&cfg.kubernetes.api_url), lost).await?)
}

/// Install the signal handlers (SIGHUP re-reads `path`; the `--dry-run` flag, `dry_run`, holds
/// across reloads), wire the production adapters and run until SIGTERM/SIGINT, then drain: the
/// checkpoint round, then every task, all before `checkpoint.grace` runs out.
///
/// An error when a handler cannot be installed or the drain ran out of time, so the process
/// exits non-zero.
pub(crate) async fn run(cfg: Config, path: Option<PathBuf>, dry_run: bool) -> Result<(), RunError> {
    init_logging(&cfg);
    let Signals { stop, term, reload, term_at } = install_signals(path, &cfg, dry_run)?;
    // Whatever way this function returns, every task it started stops.
    let _stop_all = stop.clone().drop_guard();
    let w = Wiring::new(cfg, stop).await?;
    // NB: restarts wait for the controller's first reads of the node (`first_reads`).
    let facts = crate::node::controller::facts_at_start(w.cfg.metadata.first_read_wait);
    let notifier = Notifier::new(w.sink.clone(), w.metrics.clone());
    let mut agent =
        Agent::new(w.cfg.clone(), w.coord.clone(), w.runtime.clone(), notifier, w.metrics.clone())
            .with_facts(facts.clone())
            .with_reload(reload);
    let warnings = agent.health.warnings.clone();
    let meta_rx = w.metadata_watcher(warnings.clone());
    let (gpu_rx, dra) = w.gpu_health(warnings).await;
    agent = agent.with_gpu(gpu_rx.clone());
    // NB: the one Node source; every part that needs the Node's facts gets a clone of `node_rx`.
    let (node_rx, node_reader) = w.node_source().await;
    agent = agent.with_node_info(node_rx.clone());
    let tpu_rx = w.tpu_monitor(node_rx.clone());
    agent = agent.with_tpu(tpu_rx.clone());
    let (slow_tx, slow_rx) = watch::channel(Default::default());
    agent = agent.with_slow_named(slow_tx);
    let mut controller = Controller::new(
        w.cfg.clone(),
        w.coord.clone(),
        w.runtime.clone(),
        w.metrics.clone(),
        agent.trail(),
    )
    .with_facts(facts)
    .with_pod_witnesses(w.pods.clone(), crate::runtime::devices(&w.cfg))
    .with_tpu(tpu_rx)
    .with_slow_named(slow_rx)
    .with_dry_run(agent.dry_run())
    .with_term_at(term_at.clone())
    .with_node_info(node_rx, node_reader)
    .with_notifier(Notifier::new(w.sink.clone(), w.metrics.clone()));
    if let Some(api) = node_api(&w.cfg).await {
        controller = controller.with_node_api(api);
        if let Some(taints) = dra {
            controller = controller.with_device_taints(taints);
        }
    }
    let controller_done =
        w.tracker.spawn(controller.run(meta_rx, gpu_rx, term.clone(), w.stop.clone()));
    w.start_servers(&agent).await?;
    w.background_loops(&agent);
    // The restart loop stops at SIGTERM; the controller then checkpoints the workers.
    let cycle = w.tracker.spawn(agent.run(term.clone()));
    signals::until_term_or_end(cycle, &term).await?;
    w.drain(controller_done, &term_at).await
}

/// Hands the TPU monitor the chips the Node advertises (allocatable `google.com/tpu`, as the
/// Node source last read it) whenever that changes; `None` until the Node is read, or without
/// the Kubernetes API (the monitor then judges on device files and errors alone).
async fn follow_tpu_chips(
    mut node_rx: NodeInfoRx,
    expected: watch::Sender<Option<u32>>,
    stop: CancellationToken,
) {
    loop {
        let chips = node_rx.borrow_and_update().as_ref().and_then(|n| n.tpu_chips_per_host);
        let chips = chips.and_then(|c| u32::try_from(c).ok());
        expected.send_if_modified(|cur| std::mem::replace(cur, chips) != chips);
        tokio::select! {
            changed = node_rx.changed() => if changed.is_err() { return },
            () = stop.cancelled() => return,
        }
    }
}

impl Wiring {
    /// The production adapters for `cfg`, after the start-up code's release is timed (`memory`).
    async fn new(cfg: Config, stop: CancellationToken) -> Result<Wiring, RunError> {
        let tracker = TaskTracker::new();
        tracker.spawn(release_start_up_code(stop.clone()));
        let pods = pod_api(&cfg).await;
        let coord: Arc<dyn Coordinator> = if cfg.embedded() {
            Arc::new(MemoryCoordinator::new(Arc::new(SystemClock)))
        } else {
            let redis = RedisCoordinator::from_config(&cfg.redis);
            Arc::new(redis.map_err(|e| RunError(e.to_string()))?)
        };
        let (runtime, why) = crate::runtime::connect(&cfg, pods.clone());
        tracing::info!(runtime = %runtime.describe(), "{why}");
        let a = &cfg.alerts;
        let mut sinks: Vec<Arc<dyn AlertSink>> = Vec::new();
        if !a.webhook_url.is_empty() {
            sinks.push(Arc::new(
                WebhookSink::new(a.webhook_url.expose(), &a.page_mention, a.timeout, a.attempts)
                    .with_format(a.format, a.routing_key.expose())
                    .with_headers(a.headers.iter().map(|(n, v)| (n.as_str(), v.expose()))),
            ));
        }
        if !a.alertmanager_url.is_empty() {
            let (url, repost) = (a.alertmanager_url.expose(), a.alertmanager_repost);
            sinks.push(Arc::new(AlertmanagerSink::new(url, a.timeout, a.attempts, repost)));
        }
        let sink: Option<Arc<dyn AlertSink>> = match sinks.len() {
            0 => None,
            1 => sinks.pop(),
            _ => Some(Arc::new(Fanout(sinks))),
        };
        let metrics = Arc::new(Metrics::new());
        Ok(Wiring { cfg, pods, coord, runtime, metrics, sink, tracker, stop })
    }

    /// Start the Node source when the Kubernetes API is on: this machine's Node read every
    /// `kubernetes.read_interval`, published on the returned channel (`None` until the first read;
    /// see `crate::node::info`), and the reader (for a fresh look at SIGTERM). Off, the
    /// channel stays `None` and closes.
    async fn node_source(&self) -> (NodeInfoRx, Option<Arc<dyn NodeReader>>) {
        let (tx, rx) = node_info::channel();
        let lost = "Kubernetes API unavailable: the Node's labels (pool, provisioning, GKE maintenance) will not be read";
        let connect = KubeNodeReader::connect(&self.cfg.kubernetes.api_url);
        let Some(reader) = connected(&self.cfg, connect, lost).await else { return (rx, None) };
        let (node, every) = (self.cfg.node_name.clone(), self.cfg.kubernetes.read_interval);
        let (metrics, stop) = (self.metrics.clone(), self.stop.clone());
        self.tracker.spawn(node_info::follow(reader.clone(), node, every, tx, metrics, stop));
        (rx, Some(reader))
    }

    /// Start the metadata watcher (unless `metadata.enabled = off`); the receiver closes when
    /// there is none.
    fn metadata_watcher(&self, warnings: Warnings) -> watch::Receiver<RawMetadata> {
        let (tx, rx) = watch::channel(RawMetadata::default());
        let meta = &self.cfg.metadata;
        if meta.enabled == Switch::Off {
            return rx;
        }
        let client = MetadataClient::for_host(&meta.host, Duration::from_secs(5))
            .inspect_err(|e| tracing::error!(error = %e, "metadata watcher off"));
        let Ok(client) = client else { return rx };
        // `on` means the operator knows this is GCE: more quick tries at start-up (the network
        // may come up late), and an unreachable server is never read as "not on GCE".
        let defaults = WatchConfig::default();
        let defaults = if meta.enabled == Switch::On { defaults.enabled_on() } else { defaults };
        let watch_cfg =
            WatchConfig { timeout_sec: meta.timeout_sec, warnings: Some(warnings), ..defaults };
        let (metrics, stop) = (self.metrics.clone(), self.stop.clone());
        self.tracker.spawn(watch_with(client, tx, metrics, stop, watch_cfg));
        rx
    }

    /// The TPU monitor (`crate::accel::tpu::monitor`), following the Node source for the chips the
    /// Node advertises.
    fn tpu_monitor(&self, node_rx: NodeInfoRx) -> watch::Receiver<TpuReport> {
        let (tx, rx) = watch::channel(TpuReport::default());
        let (expected_tx, expected_rx) = watch::channel(None);
        crate::accel::tpu::monitor::start(&self.cfg.tpu, expected_rx, tx, self.stop.child_token());
        self.tracker.spawn(follow_tpu_chips(node_rx, expected_tx, self.stop.clone()));
        rx
    }

    /// The loops beside the cycle: the node record's own heartbeat and the drills' export.
    fn background_loops(&self, agent: &Agent) {
        // A separate heartbeat, so a long cycle (a restart can take minutes) never lets the node
        // record expire and the fleet view call a working node down.
        self.tracker.spawn(crate::fleet::heartbeat::heartbeat_loop(
            self.coord.clone(),
            agent.keys().clone(),
            agent.record.clone(),
            self.cfg.poll_interval,
            self.cfg.fleet.heartbeat_ttl,
            self.stop.clone(),
        ));
        // The drills whose target's first node this is, as metrics (`vigil drill checkpoint`).
        self.tracker.spawn(crate::maintenance::drill::export_loop(
            self.coord.clone(),
            agent.keys().clone(),
            self.metrics.clone(),
            DRILL_EXPORT_EVERY,
            self.stop.clone(),
        ));
    }

    /// The read-only metrics and probes server (`server.listen`) and the worker API
    /// (`[worker_api]`), each on its own listener.
    async fn start_servers(&self, agent: &Agent) -> Result<(), RunError> {
        let cfg = &self.cfg;
        if let Some(addr) = cfg.server.listen {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| RunError(format!("server.listen {addr}: cannot bind: {e}")))?;
            let timing = crate::hang::policy_gang::Timing::of(cfg);
            let state = ServerState {
                metrics: self.metrics.clone(),
                health: agent.health.clone(),
                coord: self.coord.clone(),
                runtime: Arc::new(self.runtime.clone()),
                max_cycle_age: cfg.poll_interval * 3 + cfg.safety.lock_ttl,
                keys: agent.keys().clone(),
                status: Arc::new(crate::fleet::view::StatusPage { timing }),
            };
            tracing::info!(%addr, "serving /metrics /healthz /readyz (read-only)");
            self.tracker.spawn(server::serve(listener, state, self.stop.clone()));
        }
        let worker_api = WorkerApiState {
            coord: self.coord.clone(),
            keys: agent.keys().clone(),
            metrics: self.metrics.clone(),
            directory: Arc::new(self.runtime.clone()),
            tcp_auth: cfg.worker_api.auth,
            reviewer: None,
            procfs: Procfs::default(),
            max_grace: cfg.policy.max_grace,
            reviews: WorkerApiState::review_budget(),
        };
        self.start_worker_api(worker_api).await
    }

    /// The worker write API's listeners, when configured (`[worker_api]`). A listener that cannot
    /// start, or token authentication without an API server to review tokens, stops the agent: a
    /// worker API that silently is not there would leave every worker looking hung.
    async fn start_worker_api(&self, mut state: WorkerApiState) -> Result<(), RunError> {
        let api = &self.cfg.worker_api;
        if let Some(addr) = api.listen {
            if api.auth == WorkerAuth::Kubernetes {
                let url = &self.cfg.kubernetes.api_url;
                let review = KubeTokenReview::connect(url, &api.audience).await.map_err(|e| {
                    RunError(format!(
                        "worker_api.auth = \"kubernetes\": no Kubernetes API client to review workers' tokens: {e}"
                    ))
                })?;
                state.reviewer = Some(Arc::new(CachedReviews::new(review, api.review_cache)));
            }
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| RunError(format!("worker_api.listen {addr}: cannot bind: {e}")))?;
            tracing::info!(%addr, auth = api.auth.as_str(), "serving the worker API");
            self.tracker.spawn(worker_api::serve(listener, state.clone(), self.stop.clone()));
        }
        if !api.socket.as_os_str().is_empty() {
            let listener = bind_unix(&api.socket).map_err(|e| {
                RunError(format!("worker_api.socket {}: cannot listen: {e}", api.socket.display()))
            })?;
            tracing::info!(socket = %api.socket.display(), "serving the worker API to this host's containers");
            let peers = UnixPeers { listener, procfs: Procfs::default() };
            self.tracker.spawn(worker_api::serve(peers, state, self.stop.clone()));
        }
        Ok(())
    }

    /// Everything after SIGTERM must end before the pod's grace period, or the kubelet kills us
    /// mid-checkpoint. The deadline starts at the signal, not when the restart loop finishes its
    /// cycle: first the checkpoint round (the controller returns when it is recorded), then every
    /// other task.
    async fn drain(
        &self,
        controller: tokio::task::JoinHandle<()>,
        term_at: &TermAt,
    ) -> Result<(), RunError> {
        let grace = self.cfg.checkpoint.grace;
        let signalled = term_at.get().copied().unwrap_or_else(tokio::time::Instant::now);
        let deadline = signalled + grace.saturating_sub(Duration::from_secs(1));
        let checkpointed = tokio::time::timeout_at(deadline, controller).await.is_ok();
        self.stop.cancel();
        self.tracker.close();
        // The rest only has to notice the token; a short wait is plenty, within the deadline.
        let rest = (tokio::time::Instant::now() + Duration::from_secs(3)).min(deadline);
        let settled = tokio::time::timeout_at(rest, self.tracker.wait()).await.is_ok();
        if !checkpointed {
            tracing::error!("the grace period is about to end before the checkpoint round was recorded: exiting now");
            let grace = humantime::format_duration(grace);
            return Err(RunError(format!(
                "drain ran out of time: the checkpoint round did not finish within checkpoint.grace ({grace}) - 1s"
            )));
        }
        if !settled {
            tracing::warn!("some tasks did not stop in time; exiting without them");
        }
        tracing::info!("vigil exited cleanly");
        Ok(())
    }
}
