//! The wiring of `vigil run`: logging, signals, the production adapters, the engines and the
//! server, and the drain at SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::actions::alert::{AlertSink, Notifier, WebhookSink};
use crate::actions::node::{KubeNodeApi, NodeApi};
use crate::cli::CliError;
use crate::clock::SystemClock;
use crate::config::{Config, ProcessEnv};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::redis::RedisCoordinator;
use crate::coord::Coordinator;
use crate::engine::agent::Agent;
use crate::engine::node::{Controller, SharedFacts};
use crate::model::gpu::GpuReport;
use crate::model::maintenance::RawMetadata;
use crate::observe::metrics::Metrics;
use crate::observe::server::{self, ServerState};
use crate::runtime::docker::DockerRuntime;
use crate::sources::metadata::{watch_with, MetadataClient, WatchConfig};

fn init_logging(cfg: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&cfg.log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if cfg.log.format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// The process signals the agent reacts to.
pub struct Signals {
    /// SIGTERM / SIGINT: checkpoint the workers, then exit.
    pub term: CancellationToken,
    /// SIGHUP: new configurations (already validated).
    pub reload: Option<tokio::sync::watch::Receiver<Config>>,
}

/// Install the handlers. SIGHUP re-reads `path` (and the environment); an invalid new config
/// keeps the running one and says why.
pub(crate) fn install_signals(
    path: Option<PathBuf>,
    first: &Config,
    dry_run_flag: bool,
) -> Result<Signals, CliError> {
    use tokio::signal::unix::{signal, SignalKind};
    let fail = |what: &str, e: std::io::Error| {
        CliError::Failed(format!("cannot install the {what} handler: {e}"))
    };
    let term = CancellationToken::new();
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| fail("SIGTERM", e))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| fail("SIGINT", e))?;
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| fail("SIGHUP", e))?;
    let t = term.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: checkpointing workers, then exiting"),
            _ = sigint.recv() => tracing::info!("SIGINT: checkpointing workers, then exiting"),
        }
        t.cancel();
    });
    let (tx, rx) = tokio::sync::watch::channel(first.clone());
    tokio::spawn(async move {
        while sighup.recv().await.is_some() {
            match Config::load(path.as_deref(), &ProcessEnv) {
                Ok(mut cfg) => {
                    // `--dry-run` on the command line stays in force across reloads.
                    cfg.dry_run |= dry_run_flag;
                    tracing::info!("SIGHUP: configuration re-read");
                    let _ = tx.send(cfg);
                }
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: the new configuration is invalid; keeping the running one")
                }
            }
        }
    });
    Ok(Signals {
        term,
        reload: Some(rx),
    })
}

/// Wire the production adapters and run until SIGTERM/SIGINT (or `signals.term`).
pub async fn run(cfg: Config, signals: Signals) -> Result<(), CliError> {
    init_logging(&cfg);
    let coord: Arc<dyn Coordinator> = if cfg.embedded() {
        Arc::new(MemoryCoordinator::new(Arc::new(SystemClock)))
    } else {
        Arc::new(
            RedisCoordinator::from_config(&cfg.redis)
                .map_err(|e| CliError::Failed(e.to_string()))?,
        )
    };
    let runtime: Arc<dyn crate::runtime::ContainerRuntime> = Arc::new(DockerRuntime::new(
        &cfg.docker.host,
        &cfg.docker.worker_label,
        &cfg.checkpoint.label,
        cfg.docker.restart_timeout + Duration::from_secs(5),
    ));
    let metrics = Arc::new(Metrics::new());
    let sink: Option<Arc<dyn AlertSink>> = (!cfg.alerts.webhook_url.is_empty()).then(|| {
        Arc::new(WebhookSink::new(
            &cfg.alerts.webhook_url,
            &cfg.alerts.page_mention,
            cfg.alerts.timeout,
            cfg.alerts.attempts,
        )) as Arc<dyn AlertSink>
    });
    let notifier = Notifier::new(sink.clone(), metrics.clone());
    let facts = SharedFacts::default();
    let mut agent = Agent::new(
        cfg.clone(),
        coord.clone(),
        runtime.clone(),
        notifier,
        metrics.clone(),
    )
    .with_facts(facts.clone());
    if let Some(rx) = signals.reload {
        agent = agent.with_reload(rx);
    }
    let stop = CancellationToken::new();

    let node_api: Option<Arc<dyn NodeApi>> = if cfg.kubernetes_on() {
        let api = if cfg.kubernetes.api_url.is_empty() {
            KubeNodeApi::infer().await
        } else {
            KubeNodeApi::from_url(&cfg.kubernetes.api_url)
        };
        match api {
            Ok(a) => Some(Arc::new(a)),
            Err(e) => {
                tracing::error!(error = %e, "Kubernetes API unavailable: the Node will not show maintenance state");
                None
            }
        }
    } else {
        tracing::info!(
            "not in a Kubernetes cluster (kubernetes.enabled = {}): Node labels and Events off",
            cfg.kubernetes.enabled
        );
        None
    };

    let (meta_tx, meta_rx) = tokio::sync::watch::channel(RawMetadata::default());
    let mut tasks = Vec::new();
    if cfg.metadata.enabled != "off" {
        let host = if cfg.metadata.host.is_empty() {
            "metadata.google.internal".to_string()
        } else {
            cfg.metadata.host.clone()
        };
        match MetadataClient::new(&host, Duration::from_secs(5)) {
            Ok(client) => {
                let watch_cfg = WatchConfig {
                    timeout_sec: cfg.metadata.timeout_sec,
                    // `on` means the operator knows this is GCE: keep trying at start-up (the
                    // network may come up late) rather than switch the watcher off.
                    startup_attempts: if cfg.metadata.enabled == "on" {
                        u32::MAX
                    } else {
                        WatchConfig::default().startup_attempts
                    },
                    ..WatchConfig::default()
                };
                let m = metrics.clone();
                let s = stop.clone();
                tasks.push(tokio::spawn(async move {
                    watch_with(client, meta_tx, m, s, watch_cfg).await
                }));
            }
            Err(e) => tracing::error!(error = %e, "metadata watcher off"),
        }
    } else {
        drop(meta_tx);
    }
    // NVML calls block: the monitor runs on its own thread and publishes reports.
    let (gpu_tx, gpu_rx) = tokio::sync::watch::channel(GpuReport::default());
    let gpu_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // NB: loading NVML can block on a wedged driver: never on the executor.
    let gpu_thread = {
        let (gcfg, stop) = (cfg.gpu.clone(), gpu_stop.clone());
        tokio::task::spawn_blocking(move || crate::engine::gpu::start(&gcfg, gpu_tx, stop))
            .await
            .ok()
            .flatten()
    };
    agent = agent.with_gpu(gpu_rx.clone());
    let controller = Controller::new(
        cfg.clone(),
        coord.clone(),
        runtime.clone(),
        node_api,
        metrics.clone(),
        agent.trail.clone(),
        facts,
    )
    .with_notifier(Notifier::new(sink, metrics.clone()));
    let controller_task = {
        let term = signals.term.clone();
        let s = stop.clone();
        tokio::spawn(async move { controller.run(meta_rx, gpu_rx, term, s).await })
    };

    let mut server_task = None;
    if !cfg.server.listen.is_empty() {
        let listener = tokio::net::TcpListener::bind(&cfg.server.listen)
            .await
            .map_err(|e| {
                CliError::Failed(format!(
                    "server.listen {}: cannot bind: {e}",
                    cfg.server.listen
                ))
            })?;
        let state = ServerState {
            metrics,
            health: agent.health.clone(),
            coord,
            runtime,
            keys: agent.keys.clone(),
            max_cycle_age: cfg.poll_interval * 3 + cfg.safety.lock_ttl,
        };
        tracing::info!(addr = %cfg.server.listen, "serving /metrics /healthz /readyz and the status API");
        server_task = Some(tokio::spawn(server::serve(listener, state, stop.clone())));
    }

    // NB: everything after SIGTERM must end before the pod's grace period, or the kubelet
    // kills us mid-checkpoint. The deadline starts at the signal (not when the restart loop
    // finishes its cycle), and a guard exits the process when it passes, whatever is running.
    let drain = cfg.checkpoint.grace.saturating_sub(Duration::from_secs(1));
    {
        let term = signals.term.clone();
        tokio::spawn(async move {
            term.cancelled().await;
            tokio::time::sleep(drain).await;
            tracing::error!("the grace period is about to end: exiting now");
            std::process::exit(0);
        });
    }
    // A separate heartbeat, so a long cycle (a restart can take minutes) never lets the node
    // record expire and the fleet view call a working node down.
    {
        let (coord, keys, record, every, ttl, stop) = (
            agent.coord.clone(),
            agent.keys.clone(),
            agent.heartbeat_record(),
            cfg.poll_interval,
            cfg.fleet.heartbeat_ttl,
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            crate::engine::heartbeat::heartbeat_loop(coord, keys, record, every, ttl, stop).await
        }));
    }
    // The restart loop stops at SIGTERM; the controller then checkpoints the workers.
    agent.run(signals.term.clone()).await;
    let _ = controller_task.await;
    stop.cancel();
    gpu_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(t) = gpu_thread {
        // The monitor sees the flag within about a second; never block the exit on it.
        let join = tokio::task::spawn_blocking(move || t.join());
        let _ = tokio::time::timeout(Duration::from_secs(3), join).await;
    }
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
    }
    if let Some(t) = server_task {
        let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
    }
    tracing::info!("vigil exited cleanly");
    Ok(())
}
