//! The `vigil` command line: the agent (`run`) and the commands an operator or a worker runs by
//! hand. Config errors exit 2 with one line naming the key; other failures exit 1.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::actions::alert::{AlertSink, Notifier, WebhookSink};
use crate::actions::node::{KubeNodeApi, NodeApi};
use crate::agent::Agent;
use crate::clock::SystemClock;
use crate::config::{Config, ConfigError, ProcessEnv};
use crate::coord::memory::MemoryCoordinator;
use crate::coord::redis::RedisCoordinator;
use crate::coord::{write_status, Coordinator, Keys};
use crate::maintenance::{Controller, SharedFacts};
use crate::metrics::Metrics;
use crate::policy::gpu::GpuReport;
use crate::runtime::docker::DockerRuntime;
use crate::server::{self, ServerState};
use crate::sources::metadata::{watch_with, MetadataClient, RawMetadata, WatchConfig};

#[derive(Debug, Parser)]
#[command(
    name = "vigil",
    version,
    about = "Node-local agent that restarts hung accelerator workers — safely",
    long_about = "Vigil watches the opted-in worker containers of one node, decides from their shared \
status records whether one is hung, and restarts it behind a persistence timer, a per-node lock, \
last-moment revalidation, a daily circuit breaker, a fleet budget and a cooldown marker.\n\n\
Environment: NODE_NAME, REDIS_URL and DOCKER_HOST override the config file; RUST_LOG overrides log.level."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone)]
pub struct ConfigArg {
    /// Config file (TOML, or YAML when it ends in .yaml/.yml). Without it, the documented
    /// defaults plus the environment.
    #[arg(long, short = 'c', value_name = "FILE", env = "VIGIL_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent (the DaemonSet's command).
    Run {
        #[command(flatten)]
        config: ConfigArg,
        /// Observe mode: decide, alert and record everything, but never run a restart.
        #[arg(long)]
        dry_run: bool,
    },
    /// Publish a worker's status record (for shell workers); the heartbeat is stamped with the
    /// coordinator's clock.
    Beat {
        #[command(flatten)]
        config: ConfigArg,
        /// Worker id (the value of the container's opt-in label).
        #[arg(long)]
        worker: String,
        /// idle | processing | error | any other word (never hung).
        #[arg(long, required_unless_present = "checkpoint_ack")]
        state: Option<String>,
        /// What the worker is working on.
        #[arg(long)]
        job: Option<String>,
        /// A progress marker that changes as work advances (step, batch, offset).
        #[arg(long)]
        progress: Option<String>,
        /// Acknowledge a checkpoint request (give the request id from `checkpoint_request`).
        #[arg(long, value_name = "ID")]
        checkpoint_ack: Option<String>,
        /// Without Redis: the local agent's status API to send the beat to.
        #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:9464")]
        agent: String,
    },
    /// Print the verdict → action table, generated from the policy code and the configured
    /// thresholds.
    Policy {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Show the decision trail of a node: what Vigil decided, and why, oldest first.
    Explain {
        #[command(flatten)]
        config: ConfigArg,
        /// Node name (defaults to this node).
        node: Option<String>,
        /// Number of most recent decisions to show.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// The fleet: every agent's node record and a per-slice summary (a slice is available only
    /// when all its nodes are healthy and none is in maintenance).
    Status {
        #[command(flatten)]
        config: ConfigArg,
        /// Machine-readable output, for a training controller to poll.
        #[arg(long)]
        json: bool,
    },
    /// Check the local node as deployed: config, Redis, Docker, NVML, metadata server,
    /// Kubernetes permissions; one line each with ok / warn / FAIL and what to do. Exits 1 when
    /// a check fails.
    Doctor {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Replay the seed's night in seconds: a worker hangs, the alert posts, the timer persists,
    /// the restart runs, the cooldown keeps the booting worker safe, it recovers; then a
    /// maintenance notice arrives and the worker checkpoints. Needs nothing installed.
    Demo {
        /// Real time per simulated 15-second cycle.
        #[arg(long, default_value = "60ms", value_parser = humantime::parse_duration)]
        pace: Duration,
    },
    /// Validate a config file, or print the defaults.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the config (file + environment) and print it resolved.
    Check {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Print every key with its default value, as TOML.
    Defaults,
}

/// A failure of a command, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Config(_) => 2,
            CliError::Failed(_) => 1,
        }
    }
}

fn load(arg: &ConfigArg) -> Result<Config, CliError> {
    Ok(Config::load(arg.config.as_deref(), &ProcessEnv)?)
}

pub async fn dispatch(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Run { config, dry_run } => {
            let mut cfg = load(&config)?;
            cfg.dry_run |= dry_run;
            let signals = install_signals(config.config.clone(), &cfg, dry_run)?;
            run(cfg, signals).await
        }
        Command::Beat {
            config,
            worker,
            state,
            job,
            progress,
            checkpoint_ack,
            agent,
        } => {
            let cfg = load(&config)?;
            let fields: Vec<(String, String)> = [
                ("state", state),
                ("job", job),
                ("progress", progress),
                ("checkpoint_ack", checkpoint_ack),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect();
            beat(&cfg, &worker, fields, &agent).await
        }
        Command::Policy { config } => {
            let cfg = load(&config)?;
            print!("{}", render_policy(&cfg));
            Ok(())
        }
        Command::Explain {
            config,
            node,
            limit,
        } => {
            let cfg = load(&config)?;
            if cfg.embedded() {
                return Err(CliError::Failed(
                    "explain reads the trail from Redis: set REDIS_URL (with the embedded coordinator the trail lives in the agent's memory and its log)".into(),
                ));
            }
            let node = node.unwrap_or_else(|| cfg.node_name.clone());
            let coord = RedisCoordinator::from_config(&cfg.redis)
                .map_err(|e| CliError::Failed(e.to_string()))?;
            let keys = Keys::new(&cfg.redis.key_prefix, &node);
            let entries = coord
                .read_recent(&keys.trail(), limit)
                .await
                .map_err(|e| CliError::Failed(e.to_string()))?;
            print!("{}", crate::trail::render(&node, &entries));
            Ok(())
        }
        Command::Status { config, json } => {
            let cfg = load(&config)?;
            if cfg.embedded() {
                return Err(CliError::Failed(
                    "status reads the fleet from Redis: set REDIS_URL".into(),
                ));
            }
            let coord = RedisCoordinator::from_config(&cfg.redis)
                .map_err(|e| CliError::Failed(e.to_string()))?;
            let fail = |e: crate::coord::CoordError| CliError::Failed(e.to_string());
            let now = coord.time().await.map_err(fail)?;
            let (views, last_slice) = crate::fleet::read(&coord, &cfg.redis.key_prefix)
                .await
                .map_err(fail)?;
            let slices = crate::fleet::slices(&views, &last_slice);
            if json {
                let body = serde_json::json!({ "at": now, "nodes": views, "slices": slices });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&body).unwrap_or_default()
                );
            } else {
                print!("{}", crate::fleet::render(&views, &slices, now));
            }
            Ok(())
        }
        Command::Doctor { config } => {
            let cfg = load(&config)?;
            let checks = crate::doctor::run(&cfg).await;
            print!("{}", crate::doctor::render(&checks));
            if checks.iter().any(|c| c.level == crate::doctor::Level::Fail) {
                return Err(CliError::Failed("doctor found failures (see above)".into()));
            }
            Ok(())
        }
        Command::Demo { pace } => {
            let mut stdout = std::io::stdout();
            crate::demo::run(&mut stdout, pace)
                .await
                .map(|_| ())
                .map_err(|e| CliError::Failed(format!("demo: {e}")))
        }
        Command::Config(ConfigCommand::Check { config }) => {
            let cfg = load(&config)?;
            println!("config ok");
            print!("{}", toml::to_string_pretty(&cfg).unwrap_or_default());
            Ok(())
        }
        Command::Config(ConfigCommand::Defaults) => {
            print!("{}", Config::defaults_toml());
            Ok(())
        }
    }
}

/// The verdict → action table as printed by `vigil policy`.
pub fn render_policy(cfg: &Config) -> String {
    let rows = crate::policy::table(&cfg.policy);
    let w0 = rows
        .iter()
        .map(|r| r.verdict.len())
        .max()
        .unwrap_or(7)
        .max(7);
    let w1 = rows.iter().map(|r| r.predicate.len()).max().unwrap_or(9);
    let mut out = format!("{:<w0$}  {:<w1$}  action\n", "verdict", "predicate");
    out.push_str(&format!(
        "{}  {}  {}\n",
        "-".repeat(w0),
        "-".repeat(w1),
        "-".repeat(6)
    ));
    for r in rows {
        out.push_str(&format!(
            "{:<w0$}  {:<w1$}  {}\n",
            r.verdict, r.predicate, r.action
        ));
    }
    out.push_str(&format!(
        "\nrestart pipeline: hang persists {} → node lock → logs → alert → revalidate → lock TTL check → \
         compare container → breaker ({}/day{}) + fleet budget ({} per {}) → cooldown {} → restart; \
         escalation page after {}{}\n",
        humantime::format_duration(cfg.policy.restart_delay),
        cfg.safety.breaker_per_day,
        if cfg.safety.breaker_disabled { ", DISABLED" } else { "" },
        cfg.safety.fleet_budget,
        humantime::format_duration(cfg.safety.fleet_window),
        humantime::format_duration(cfg.policy.cooldown),
        humantime::format_duration(cfg.policy.escalate_after),
        if cfg.dry_run { "\nobserve mode (dry_run): restarts are never run" } else { "" },
    ));
    out
}

async fn beat(
    cfg: &Config,
    worker: &str,
    fields: Vec<(String, String)>,
    agent: &str,
) -> Result<(), CliError> {
    if cfg.embedded() {
        let body: serde_json::Map<String, serde_json::Value> = fields
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect();
        let url = format!("{}/v1/workers/{worker}/status", agent.trim_end_matches('/'));
        let resp = reqwest::Client::new()
            .put(&url)
            .timeout(Duration::from_secs(10))
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                CliError::Failed(format!(
                    "no REDIS_URL, and the local agent at {url} did not answer: {e}"
                ))
            })?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(CliError::Failed(format!(
                "agent at {url} refused the beat: {status} {}",
                text.trim()
            )));
        }
        println!("beat sent to {url}");
        return Ok(());
    }
    let coord =
        RedisCoordinator::from_config(&cfg.redis).map_err(|e| CliError::Failed(e.to_string()))?;
    let keys = Keys::new(&cfg.redis.key_prefix, &cfg.node_name);
    let now = write_status(&coord, &keys, worker, &fields)
        .await
        .map_err(|e| CliError::Failed(e.to_string()))?;
    println!(
        "{} heartbeat={}",
        keys.status(worker),
        crate::coord::heartbeat_value(now)
    );
    Ok(())
}

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
fn install_signals(
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
        tokio::task::spawn_blocking(move || crate::sources::gpu::start(&gcfg, gpu_tx, stop))
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
            crate::fleet::heartbeat_loop(coord, keys, record, every, ttl, stop).await
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
