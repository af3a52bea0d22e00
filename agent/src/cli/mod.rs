//! The `vigil` command line: the agent (`run`, wired in `crate::app`) and the commands an
//! operator or a worker runs by hand, one file each. Config errors exit 2 with one line naming
//! the key, as does a malformed flag (clap's usage error, naming the flag); a drill that could not
//! run exits 3; other failures exit 1.

mod beat;
mod budget;
pub(crate) mod check;
mod cleanup;
mod config;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub(crate) mod doctor;
mod drill;
mod explain;
mod idle;
pub(crate) mod policy;
mod status;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ConfigError, ProcessEnv};
use crate::hang::model;

#[derive(Debug, Parser)]
#[command(
    name = "vigil",
    version,
    about = "Node-local agent that restarts hung accelerator workers — safely",
    long_about = "Vigil watches the opted-in worker containers of one node, decides from their shared \
status records whether one is hung, and restarts it behind a persistence timer, a per-node lock, \
last-moment revalidation, a daily circuit breaker, a fleet budget and a cooldown marker.\n\n\
Environment: NODE_NAME, REDIS_URL, DOCKER_HOST, GCE_METADATA_HOST, VIGIL_POOL, VIGIL_SLICE, \
VIGIL_WEBHOOK_URL, VIGIL_ALERTMANAGER_URL and VIGIL_PAGERDUTY_ROUTING_KEY win over the config \
file (node_name, redis.url, docker.host, metadata.host, fleet.pool, fleet.slice, \
alerts.webhook_url, alerts.alertmanager_url, alerts.routing_key); VIGIL_WEBHOOK_HEADERS \
(`Name: value` lines) adds to alerts.headers; RUST_LOG overrides log.level; \
KUBERNETES_SERVICE_HOST (set in every pod) makes kubernetes.enabled = \"auto\" mean on; without \
node_name or NODE_NAME, HOSTNAME (else /etc/hostname) names the node. VIGIL_CONFIG stands for \
--config, VIGIL_TOKEN_FILE for `vigil beat --token-file`; NO_COLOR keeps the log plain at a \
terminal. Details: docs/configuration.md."
)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Args, Clone)]
pub(crate) struct ConfigArg {
    /// Config file (TOML, or YAML when it ends in .yaml/.yml). Without it, the documented
    /// defaults plus the environment.
    #[arg(long, short = 'c', value_name = "FILE", env = "VIGIL_CONFIG")]
    pub(crate) config: Option<PathBuf>,
}

// NB: parsed once per process: the size of `Beat`'s many flags costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    Beat(BeatArgs),
    /// Print the verdict → action table, generated from the policy code and the configured
    /// thresholds; `vigil policy gpu` prints the XID → action table (NVIDIA's immediate action,
    /// with the configured `gpu.xid_actions`).
    Policy {
        #[command(flatten)]
        config: ConfigArg,
        /// Which table: `restart` (the default) or `gpu`.
        #[arg(value_enum, default_value = "restart")]
        table: policy::Table,
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
    /// when all its nodes are healthy, or unknown — their runtime down — and none is in
    /// maintenance).
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
    Doctor(ConfigArg),
    /// Uninstall from a Node what Vigil wrote there, and nothing else: every label and annotation
    /// under `kubernetes.label_prefix`; Vigil's taints under that prefix, whatever their effect
    /// (`termination-imminent`, `gpu-failed`, `tpu-failed`, `slow`); its conditions
    /// (VigilMaintenance, VigilGPUUnhealthy, VigilTPUUnhealthy, VigilSlow). The retired
    /// VigilGPUHealthy is not removed (docs/upgrading.md), nor GKE's
    /// `cloud.google.com/perform-maintenance` label (named when set). Run it after `kubectl
    /// delete -k`, once per node; a second run removes nothing and says so.
    Cleanup {
        #[command(flatten)]
        config: ConfigArg,
        /// The Node to clean (defaults to this node: NODE_NAME, or the config's node_name).
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        /// Print what would be removed and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Replay the seed's night in seconds: a worker hangs, the alert posts, the timer persists,
    /// the restart runs, the cooldown keeps the booting worker safe, it recovers; then a
    /// maintenance notice arrives and the worker checkpoints. Needs nothing installed.
    #[cfg(feature = "demo")]
    Demo {
        /// Real time per simulated 15-second cycle.
        #[arg(long, default_value = "60ms", value_parser = humantime::parse_duration)]
        pace: Duration,
    },
    /// Validate a config file, or print the defaults.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Drills: find out before the real notice whether the workers keep their promises.
    #[command(subcommand)]
    Drill(DrillCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum DrillCommand {
    /// Send a real checkpoint request, marked as a drill (`checkpoint_reason=drill`), to a gang,
    /// a worker or a node's workers; measure the time to every acknowledgement against the
    /// budgets of a preemption and of a maintenance notice, and print the verdict. The result
    /// goes to the trail of every node asked and to the metrics of the target's first node
    /// (`vigil_checkpoint_drill_seconds`). Never stands restarts down, never touches the Node;
    /// refuses to run beside a real round. Exits 1 when a member did not acknowledge.
    Checkpoint(drill::CheckpointDrill),
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Validate the config (file + environment) and print it resolved.
    Check(ConfigArg),
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
    /// A command that could not do what it was asked (`vigil drill`: refused, interrupted, or
    /// no Redis), told apart from one whose answer is "no".
    #[error("{0}")]
    Unable(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Config(_) => 2,
            CliError::Failed(_) => 1,
            CliError::Unable(_) => 3,
        }
    }
}

/// `--worker`: the documented worker-id rule (a bad one exits 2, naming the flag).
fn worker_id(s: &str) -> Result<String, String> {
    accept(model::valid_worker_id(s), s, "a worker id is 1-128 characters of A-Z a-z 0-9 . _ -")
}

/// `--gang`: a gang id as the record takes it.
fn gang_id(s: &str) -> Result<String, String> {
    accept(model::valid_gang_id(s), s, "a gang id is 1-253 characters of A-Z a-z 0-9 . _ / -")
}

/// `--gang-size`: how many members.
fn gang_size(s: &str) -> Result<String, String> {
    let n = model::parse_gang_size(s).map(|n| n.to_string());
    n.ok_or_else(|| "a gang size is a whole number from 1 to 65536".into())
}

/// `--checkpoint-step`: a whole number.
fn step(s: &str) -> Result<String, String> {
    let n = s.trim().parse::<u64>().map(|n| n.to_string());
    n.map_err(|_| "a checkpoint step is a whole number".into())
}

/// `--compute-ms`: whole milliseconds, at most a day.
fn compute_ms(s: &str) -> Result<String, String> {
    let n = model::parse_compute(s).map(|n| n.to_string());
    n.ok_or_else(|| "the compute time is whole milliseconds, at most a day (86400000)".into())
}

/// `--state`: one word.
fn state_word(s: &str) -> Result<String, String> {
    let why = "a state is one word of 1-64 characters of A-Z a-z 0-9 . _ - (idle, processing, error, ...)";
    accept(model::valid_state(s), s, why)
}

/// A flag's value `s` when `ok`, else `why`.
fn accept(ok: bool, s: &str, why: &str) -> Result<String, String> {
    ok.then(|| s.to_string()).ok_or_else(|| why.to_string())
}

/// `--grace`: a duration (`20m`, `90s`, `0`), as the record's seconds.
fn grace_seconds(s: &str) -> Result<String, String> {
    if s.trim() == "0" {
        return Ok("0".into());
    }
    humantime::parse_duration(s.trim())
        .map(|d| format!("{:.3}", d.as_secs_f64()))
        .map_err(|e| format!("a duration like 20m or 90s, or 0 to end a grace: {e}"))
}

fn load(arg: &ConfigArg) -> Result<Config, CliError> {
    Ok(Config::load(arg.config.as_deref(), &ProcessEnv)?)
}

/// The config as the agent on this node runs it: an empty `REDIS_URL` refused
/// (`crate::config::refuse_empty_redis_url`), for `run` and the commands that say what it would
/// do (`config check`, `doctor`).
fn load_for_node(arg: &ConfigArg) -> Result<Config, CliError> {
    crate::config::refuse_empty_redis_url(&ProcessEnv)?;
    load(arg)
}

/// A failure (a coordinator's, or a message), as a command failure (exit 1).
fn failed(e: impl std::fmt::Display) -> CliError {
    CliError::Failed(e.to_string())
}

/// `http://HOST:PORT` of a listener of this node's agent, as a local client reaches it: a
/// listener on every address is reached on loopback.
fn local_url(addr: std::net::SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => "127.0.0.1".to_string(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => "[::1]".to_string(),
        std::net::IpAddr::V4(ip) => ip.to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
    };
    format!("http://{ip}:{}", addr.port())
}

/// GET `path` from this node's agent (`server.listen` of the config): what `status` and `explain`
/// read when the CLI has no Redis of its own.
async fn local_agent(cfg: &Config, path: &str) -> Result<String, CliError> {
    let no_port = "no Redis URL (REDIS_URL or redis.url) and the agent serves no HTTP port (server.listen is empty): nothing to read";
    let Some(addr) = cfg.server.listen else { return Err(failed(no_port)) };
    let base = local_url(addr);
    let (client, url) = beat::client_for(&base, path)?;
    let resp = client.get(url).timeout(Duration::from_secs(10)).send().await.map_err(|e| {
        CliError::Failed(format!(
            "no Redis URL (REDIS_URL or redis.url), and no agent answers at {base} (server.listen): start it (bash scripts/run.sh), or point -c at the config it runs with: {}",
            crate::http::http_error(e)
        ))
    })?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(failed(format!("the agent at {base} answered {status}: {}", text.trim())));
    }
    Ok(text)
}

/// `vigil beat`'s arguments.
#[derive(Debug, clap::Args)]
pub struct BeatArgs {
    #[command(flatten)]
    pub(crate) config: ConfigArg,
    /// Worker id (the value of the container's opt-in label): 1-128 characters of
    /// [A-Za-z0-9._-].
    #[arg(long, value_parser = worker_id)]
    pub(crate) worker: String,
    /// idle | processing | error | any other word for a long operation (loading, compile:
    /// watched like processing): 1-64 characters of [A-Za-z0-9._-].
    #[arg(long, required_unless_present_any = ["checkpoint_ack", "grace"], value_parser = state_word)]
    pub(crate) state: Option<String>,
    /// What the worker is working on: the job, not one attempt of it (a new job starts its
    /// run of fruitless restarts over).
    #[arg(long)]
    pub(crate) job: Option<String>,
    /// The distributed job this worker is one member of (every rank of it, on every node,
    /// gives the same id): 1-253 characters of [A-Za-z0-9._/-].
    #[arg(long, value_parser = gang_id)]
    pub(crate) gang: Option<String>,
    /// How many members the gang has (with --gang): 1 to 65536.
    #[arg(long, requires = "gang", value_parser = gang_size)]
    pub(crate) gang_size: Option<String>,
    /// A progress marker that changes as work advances (step, batch, offset).
    #[arg(long)]
    pub(crate) progress: Option<String>,
    /// Acknowledge a checkpoint request (give the request id from `checkpoint_request`).
    #[arg(long, value_name = "ID")]
    pub(crate) checkpoint_ack: Option<String>,
    /// The step of the last durable checkpoint (a whole number): Vigil judges whether its
    /// restarts help by progress past it.
    #[arg(long, value_name = "STEP", value_parser = step)]
    pub(crate) checkpoint_step: Option<String>,
    /// How long the last step computed before its collective (whole milliseconds): in a gang
    /// that slows down, the rank that computes longest is the one the others wait for.
    #[arg(long, value_name = "MS", value_parser = compute_ms)]
    pub(crate) compute_ms: Option<String>,
    /// A long operation ahead: the worker may stay silent this long after this beat
    /// (e.g. 20m; honoured up to `policy.max_grace`); 0 ends it.
    #[arg(long, value_name = "DURATION", value_parser = grace_seconds)]
    pub(crate) grace: Option<String>,
    /// Send the beat to an agent's worker API instead of Redis: `http://HOST:PORT` or
    /// `unix:/run/vigil/worker.sock`. Without it: Redis when `REDIS_URL` is set, else this
    /// node's worker API as configured in `[worker_api]`.
    #[arg(long, value_name = "URL")]
    pub(crate) agent: Option<String>,
    /// A file holding the worker's projected ServiceAccount token (sent as a bearer token
    /// to an agent with `worker_api.auth = "kubernetes"`); read afresh on every beat, as
    /// the kubelet rotates it.
    #[arg(long, value_name = "PATH", env = "VIGIL_TOKEN_FILE")]
    pub(crate) token_file: Option<std::path::PathBuf>,
}

pub async fn dispatch(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Run { config, dry_run } => {
            let mut cfg = load_for_node(&config)?;
            cfg.dry_run |= dry_run;
            crate::app::run(cfg, config.config, dry_run).await.map_err(failed)
        }
        Command::Beat(args) => beat::command(args).await,
        Command::Policy { config, table } => policy::run(&load(&config)?, table),
        Command::Explain { config, node, limit } => {
            explain::run(&load(&config)?, node, limit).await
        }
        Command::Status { config, json } => status::run(&load(&config)?, json).await,
        Command::Doctor(config) => doctor::command(&load_for_node(&config)?).await,
        Command::Cleanup { config, node, dry_run } => {
            cleanup::run(&load(&config)?, node, dry_run).await
        }
        #[cfg(feature = "demo")]
        Command::Demo { pace } => {
            let ran = demo::run(&mut std::io::stdout(), pace).await;
            ran.map(|_| ()).map_err(|e| CliError::Failed(format!("demo: {e}")))
        }
        Command::Drill(DrillCommand::Checkpoint(d)) => drill::run(&load(&d.config)?, &d).await,
        Command::Config(ConfigCommand::Check(config)) => config::check(&load_for_node(&config)?),
        Command::Config(ConfigCommand::Defaults) => config::defaults(),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use clap::CommandFactory;

    use super::*;
    use crate::config::Env;

    /// An environment that holds nothing and remembers every name asked of it.
    #[derive(Default)]
    struct Asked(RefCell<Vec<String>>);

    impl Env for Asked {
        fn get(&self, name: &str) -> Option<String> {
            self.0.borrow_mut().push(name.to_string());
            None
        }
    }

    /// A command that runs, with its words (`config check`).
    type Leaf<'a> = (Vec<&'a str>, &'a clap::Command);

    /// Every command that runs (`vigil config check`, not the group `vigil config`).
    fn leaves<'a>(cmd: &'a clap::Command, words: &[&'a str], out: &mut Vec<Leaf<'a>>) {
        for sub in cmd.get_subcommands() {
            let mut path = words.to_vec();
            path.push(sub.get_name());
            if sub.has_subcommands() {
                leaves(sub, &path, out);
            } else {
                out.push((path, sub));
            }
        }
    }

    #[test]
    fn the_help_names_every_environment_variable_vigil_reads() {
        let asked = Asked::default();
        let applied = Config::default().apply_env(&asked);
        assert!(applied.is_ok(), "{applied:?}");
        let mut names = asked.0.take();
        // Read by the log filter and the log writer (`crate::app`), not by the config.
        names.extend(["RUST_LOG", "NO_COLOR"].map(String::from));
        let cli = Cli::command();
        let mut commands = Vec::new();
        leaves(&cli, &[], &mut commands);
        for (_, cmd) in &commands {
            let flags = cmd.get_arguments().filter_map(|a| a.get_env()?.to_str());
            names.extend(flags.map(String::from));
        }
        assert!(names.iter().any(|n| n == "VIGIL_TOKEN_FILE"), "{names:?}");
        let help = cli.get_long_about().map(ToString::to_string).unwrap_or_default();
        for name in &names {
            assert!(help.contains(name.as_str()), "{name} missing from `vigil --help`: {help}");
        }
    }

    /// The synopses (first cells) of docs/cli.md's command table, as words (backticks and the
    /// cell's bar dropped).
    fn documented_synopses() -> Vec<Vec<String>> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md");
        let page = std::fs::read_to_string(path).unwrap_or_default();
        let rows = page.lines().filter(|l| l.starts_with("| `vigil "));
        let cells = rows.filter_map(|l| l.split(" | ").next()).map(|c| c.replace(['|', '`'], " "));
        cells.map(|c| c.split_whitespace().map(String::from).collect()).collect()
    }

    #[test]
    fn docs_cli_md_names_every_flag_of_every_command() {
        let synopses = documented_synopses();
        assert!(!synopses.is_empty(), "no command table in docs/cli.md");
        let cli = Cli::command();
        let mut commands = Vec::new();
        leaves(&cli, &[], &mut commands);
        for (words, cmd) in &commands {
            let command = words.join(" ");
            let named = |s: &&Vec<String>| {
                let after = s.get(1..=words.len()).unwrap_or_default();
                after.iter().map(String::as_str).eq(words.iter().copied())
            };
            let Some(row) = synopses.iter().find(named) else {
                panic!("vigil {command} missing from docs/cli.md")
            };
            let row = row.join(" ");
            for long in cmd.get_arguments().filter_map(|a| a.get_long()) {
                let flag = format!("--{long}");
                assert!(row.contains(&flag), "docs/cli.md: vigil {command} lacks {flag}: {row}");
            }
        }
    }
}
