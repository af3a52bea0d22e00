//! Configuration: one file (TOML or YAML), every key with a documented default, a few environment
//! overrides, and validation that names the offending key.
//!
//! The environment is read through the [`Env`] trait so that every parse and validation error is a
//! unit test with a `HashMap`, never a `set_var`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A configuration problem, always naming the key so the operator can find the line to fix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("config file {path}: {problem}")]
    File { path: PathBuf, problem: String },
    #[error("config key `{key}`: {problem}")]
    Invalid { key: &'static str, problem: String },
}

/// Where environment overrides come from: the process environment in production, a map in tests.
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

/// The real process environment.
pub(crate) struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }
}

/// `auto`, `on` or `off`, for the optional integrations (metadata server, Kubernetes, NVML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    /// On where the platform is detected; off, said once, elsewhere.
    Auto,
    /// Always on: a missing platform is an error, retried.
    On,
    Off,
}

impl Switch {
    pub fn as_str(self) -> &'static str {
        match self {
            Switch::Auto => "auto",
            Switch::On => "on",
            Switch::Off => "off",
        }
    }
}

impl std::fmt::Display for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// A signal a worker may be asked to checkpoint with. SIGKILL and SIGSTOP are not among them:
/// they cannot be handled, so they can never checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Signal {
    Usr1,
    Usr2,
    Term,
    Int,
    Hup,
    Quit,
    Winch,
    Pwr,
}

impl Signal {
    const ALL: [Signal; 8] = [
        Signal::Usr1,
        Signal::Usr2,
        Signal::Term,
        Signal::Int,
        Signal::Hup,
        Signal::Quit,
        Signal::Winch,
        Signal::Pwr,
    ];

    /// The canonical name, e.g. `SIGUSR1` (what Docker's kill endpoint takes).
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Usr1 => "SIGUSR1",
            Signal::Usr2 => "SIGUSR2",
            Signal::Term => "SIGTERM",
            Signal::Int => "SIGINT",
            Signal::Hup => "SIGHUP",
            Signal::Quit => "SIGQUIT",
            Signal::Winch => "SIGWINCH",
            Signal::Pwr => "SIGPWR",
        }
    }
}

impl std::str::FromStr for Signal {
    type Err = String;
    /// `SIGUSR1`, `sigusr1` or `USR1`.
    fn from_str(name: &str) -> Result<Signal, String> {
        let upper = name.trim().to_ascii_uppercase();
        let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
        Signal::ALL
            .into_iter()
            .find(|s| &s.as_str()[3..] == bare)
            .ok_or_else(|| {
                format!("`{name}` is not a signal a worker can handle (SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGWINCH, SIGPWR)")
            })
    }
}

impl TryFrom<String> for Signal {
    type Error = String;
    fn try_from(s: String) -> Result<Signal, String> {
        s.parse()
    }
}

impl From<Signal> for String {
    fn from(s: Signal) -> String {
        s.as_str().to_string()
    }
}

/// How a worker is asked to checkpoint: `redis`, `signal` (the configured signal),
/// `signal:NAME`, or an `http(s)://` URL. The same syntax serves the config key and the
/// container label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CheckpointMethod {
    /// The request in the status record is all: the worker polls its own record.
    Redis,
    /// A signal to the container's main process; `None` = `checkpoint.signal`.
    Signal(Option<Signal>),
    /// An HTTP POST to this URL, with a JSON body `{request, reason, deadline_ms}`.
    Http(String),
}

impl std::str::FromStr for CheckpointMethod {
    type Err = String;
    fn from_str(s: &str) -> Result<CheckpointMethod, String> {
        let s = s.trim();
        match s {
            "redis" => Ok(CheckpointMethod::Redis),
            "signal" => Ok(CheckpointMethod::Signal(None)),
            _ if s.starts_with("signal:") => Ok(CheckpointMethod::Signal(Some(
                s["signal:".len()..].parse()?,
            ))),
            _ if s.starts_with("http://") || s.starts_with("https://") => {
                Ok(CheckpointMethod::Http(s.to_string()))
            }
            _ => Err(format!(
                "`{s}` is not `redis`, `signal`, `signal:NAME` or an http(s):// URL"
            )),
        }
    }
}

impl TryFrom<String> for CheckpointMethod {
    type Error = String;
    fn try_from(s: String) -> Result<CheckpointMethod, String> {
        s.parse()
    }
}

impl From<CheckpointMethod> for String {
    fn from(m: CheckpointMethod) -> String {
        match m {
            CheckpointMethod::Redis => "redis".into(),
            CheckpointMethod::Signal(None) => "signal".into(),
            CheckpointMethod::Signal(Some(s)) => format!("signal:{}", s.as_str()),
            CheckpointMethod::Http(url) => url,
        }
    }
}

/// `server.listen`: a socket address, or the empty string for "no server".
mod listen {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        v: &Option<SocketAddr>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(a) => s.collect_str(a),
            None => s.serialize_str(""),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        text.trim().parse().map(Some).map_err(|_| {
            serde::de::Error::custom(format!(
                "`{text}` is not host:port (e.g. 0.0.0.0:9464), or \"\" to disable the server"
            ))
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Name of the node this agent watches; env `NODE_NAME`, else the host name.
    pub node_name: String,
    /// Observe mode: decide everything, run no restart.
    pub dry_run: bool,
    /// How often the worker records are evaluated.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    pub redis: RedisConfig,
    pub runtime: RuntimeConfig,
    pub docker: DockerConfig,
    pub policy: PolicyConfig,
    pub safety: SafetyConfig,
    pub alerts: AlertsConfig,
    pub server: ServerConfig,
    pub log: LogConfig,
    pub fleet: FleetConfig,
    pub metadata: MetadataConfig,
    pub kubernetes: KubernetesConfig,
    pub checkpoint: CheckpointConfig,
    pub opportunistic: OpportunisticConfig,
    pub gpu: GpuConfig,
    /// Set from the environment (`KUBERNETES_SERVICE_HOST`), never from the file.
    #[serde(skip)]
    pub kubernetes_in_cluster: bool,
    /// Deprecated keys the file used, with their replacement, said once at start-up.
    #[serde(skip)]
    pub deprecated: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetConfig {
    /// Node pool this node belongs to; env `VIGIL_POOL`.
    pub pool: String,
    /// Slice (a group of nodes that train together, e.g. a TPU slice); env `VIGIL_SLICE`.
    pub slice: String,
    /// The agent's heartbeat record expires after this; a node silent longer is "down".
    #[serde(with = "humantime_serde")]
    pub heartbeat_ttl: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    /// `auto` (watch; unreachable is said once and probed again with backoff), `on`, or `off`.
    pub enabled: Switch,
    /// Metadata server host[:port]; env `GCE_METADATA_HOST`; empty = `metadata.google.internal`.
    pub host: String,
    /// Long-poll `timeout_sec` for each watch request.
    pub timeout_sec: u32,
    /// A PENDING notice stands restarts down only once its window starts within this long
    /// (GCE posts them days ahead).
    #[serde(with = "humantime_serde")]
    pub pending_horizon: Duration,
    /// After a maintenance event ends, restarts stay suppressed this long.
    #[serde(with = "humantime_serde")]
    pub settle: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// `auto` (on when running in a cluster), `on`, or `off`.
    pub enabled: Switch,
    /// API server URL; empty = in-cluster config or kubeconfig.
    pub api_url: String,
    /// Prefix of the labels, annotations and taint Vigil writes on its Node.
    pub label_prefix: String,
    /// Put a `NoSchedule` taint on the Node while termination is imminent.
    pub taint_on_termination: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuConfig {
    /// `auto` (load NVML; off, said once, when there is no driver), `on`, or `off`.
    pub enabled: Switch,
    /// Path of `libnvidia-ml.so`; empty = the loader's search path.
    pub library_path: String,
    /// How often every GPU is read (XID events are waited for continuously).
    #[serde(with = "humantime_serde")]
    pub sample_interval: Duration,
    /// XIDs that mean the hardware is broken: the GPU is `failed`.
    pub hardware_xids: Vec<u64>,
    /// XIDs caused by the application: recorded, never a hardware verdict.
    pub application_xids: Vec<u64>,
    /// XIDs attached to a hang alert of a worker on that GPU, as evidence.
    pub evidence_xids: Vec<u64>,
    /// How far back an evidence XID is attached to a hang alert.
    #[serde(with = "humantime_serde")]
    pub evidence_window: Duration,
    /// Put a `NoSchedule` taint on the Node while a GPU has failed.
    pub taint_on_failure: bool,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            enabled: Switch::Auto,
            library_path: String::new(),
            sample_interval: Duration::from_secs(15),
            hardware_xids: vec![48, 63, 64, 74, 79, 92, 94, 95],
            application_xids: vec![13, 31, 43, 45, 68, 109],
            evidence_xids: vec![43, 109],
            evidence_window: Duration::from_secs(30 * 60),
            taint_on_failure: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpportunisticConfig {
    /// Opt-in: label the node `cloud.google.com/perform-maintenance=true` when it is idle.
    pub enabled: bool,
    /// Every worker idle at least this long.
    #[serde(with = "humantime_serde")]
    pub idle_for: Duration,
    /// Other healthy nodes of the pool that must remain.
    pub min_nodes: u32,
    /// The pool claim's TTL (one node of a pool at a time).
    #[serde(with = "humantime_serde")]
    pub claim_ttl: Duration,
}

impl Default for OpportunisticConfig {
    fn default() -> Self {
        OpportunisticConfig {
            enabled: false,
            idle_for: Duration::from_secs(30 * 60),
            min_nodes: 1,
            claim_ttl: Duration::from_secs(2 * 3600),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Default request method: `redis`, `signal`, `signal:NAME` or an `http(s)://` URL; a
    /// container label overrides it.
    pub method: CheckpointMethod,
    /// Container label naming a worker's method: `redis`, `signal:SIGUSR1`, `http://host:port/path`.
    pub label: String,
    /// Signal sent by the `signal` method without an explicit one.
    pub signal: Signal,
    /// Budget on the agent's own SIGTERM/SIGINT (must end before the pod's grace period).
    #[serde(with = "humantime_serde")]
    pub sigterm_budget: Duration,
    /// Budget on a Spot/preemptible preemption notice (GCE gives 30 s in total).
    #[serde(with = "humantime_serde")]
    pub preemption_budget: Duration,
    /// Budget on a host-maintenance notice (GCE warns 60 s ahead).
    #[serde(with = "humantime_serde")]
    pub maintenance_budget: Duration,
    /// The pod's termination grace period; the agent exits before it ends.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    /// Ask the workers to checkpoint on the agent's own SIGTERM/SIGINT.
    pub on_sigterm: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[:password@]host:port[/db]`; env `REDIS_URL`. Empty: embedded single-node
    /// coordinator. With `mode = "cluster"`: the cluster's seed nodes, comma-separated; with
    /// `mode = "sentinel"`: the Sentinels, comma-separated (their credentials and database are
    /// the master's too).
    pub url: String,
    /// `single` (one server, or a managed endpoint that fails over behind one address),
    /// `cluster` (Redis Cluster), or `sentinel` (the master Sentinel names, followed across
    /// failovers).
    pub mode: RedisMode,
    /// With `mode = "sentinel"`: the name the Sentinels monitor the master under.
    pub sentinel_service: String,
    /// First component of every key Vigil writes.
    pub key_prefix: String,
    /// Per-command timeout; a slower Redis counts as unreachable (and restarts pause).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Entries kept in each node's decision trail stream.
    pub trail_max_len: usize,
    /// For `rediss://`: a PEM file of the CA that signed the server's certificate (e.g. a
    /// managed Redis's server CA); empty = the system's trusted roots.
    pub ca_file: String,
}

/// How `redis.url` is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    #[default]
    Single,
    Cluster,
    Sentinel,
}

/// Which container runtime the agent speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// The socket that exists: Docker's (`docker.host`), then rootful Podman's
    /// (`runtime.podman_socket`), then containerd's, then CRI-O's.
    Auto,
    /// The Docker Engine API at `docker.host`.
    Docker,
    /// Podman's Docker-compatible API at `runtime.podman_socket` (`podman system service`).
    Podman,
    /// The Kubernetes CRI (containerd, CRI-O).
    Cri,
}

/// The runtime-neutral settings of the container runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// `auto`, `docker`, `podman` or `cri`.
    pub kind: RuntimeKind,
    /// Podman's API socket (its Docker-compatible API); the rootful default is
    /// `/run/podman/podman.sock`.
    pub podman_socket: String,
    /// The CRI socket; empty = the first that exists of `/run/containerd/containerd.sock` and
    /// `/var/run/crio/crio.sock`.
    pub cri_socket: String,
    /// Opt-in label (a container label on Docker, a pod label on CRI); its value is the worker id.
    pub worker_label: String,
    /// Log lines collected before a restart and attached to the alert.
    pub log_lines: usize,
    /// Time allowed for log collection.
    #[serde(with = "humantime_serde")]
    pub log_timeout: Duration,
    /// Grace between SIGTERM and SIGKILL when a worker is restarted.
    #[serde(with = "humantime_serde")]
    pub stop_grace: Duration,
    /// Time allowed for the whole restart (on CRI: until kubelet's next attempt runs); must
    /// exceed `stop_grace + call_timeout`.
    #[serde(with = "humantime_serde")]
    pub restart_timeout: Duration,
    /// Deadline of every runtime call but the restart (list, inspect, logs, signal, ping): a
    /// runtime that accepts and never answers is noticed this soon. The restart's stop is never
    /// bound by it: it gets the whole stop grace plus this margin.
    #[serde(with = "humantime_serde")]
    pub call_timeout: Duration,
    /// CRI: also restart pods whose restartPolicy is Never (which ends the pod), or whose policy
    /// cannot be read (no Kubernetes API).
    pub allow_pod_replacement: bool,
    /// CRI: the kubelet's PodResources socket, where each worker's GPUs are read; empty = off
    /// (every worker counts as using every GPU).
    pub pod_resources_socket: String,
}

/// The Docker Engine API. The keys that are not Docker-specific moved to `[runtime]`; the old
/// spellings still work, with a deprecation line at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DockerConfig {
    /// `unix:///var/run/docker.sock` or `tcp://host:port`; env `DOCKER_HOST`.
    pub host: String,
    /// Deprecated: `runtime.worker_label`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_label: Option<String>,
    /// Deprecated: `runtime.log_lines`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_lines: Option<usize>,
    /// Deprecated: `runtime.log_timeout`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub log_timeout: Option<Duration>,
    /// Deprecated: `runtime.stop_grace`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub stop_grace: Option<Duration>,
    /// Deprecated: `runtime.restart_timeout`.
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub restart_timeout: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// A processing worker whose heartbeat is older than this is stale.
    #[serde(with = "humantime_serde")]
    pub stale_after: Duration,
    /// Minimum gap between the two observations that confirm a hang.
    #[serde(with = "humantime_serde")]
    pub confirm_after: Duration,
    /// A confirmed hang must persist this long before a restart.
    #[serde(with = "humantime_serde")]
    pub restart_delay: Duration,
    /// A worker in state `error` this long is restarted.
    #[serde(with = "humantime_serde")]
    pub error_for: Duration,
    /// Fresh heartbeat with an unchanged progress marker this long: alert (no restart).
    #[serde(with = "humantime_serde")]
    pub stalled_after: Duration,
    /// After a restart, the worker is "booting" for this long: no new incident.
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
    /// Still hung this long after a restart: page a person, once.
    #[serde(with = "humantime_serde")]
    pub escalate_after: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyConfig {
    /// TTL of the per-node execution lock.
    #[serde(with = "humantime_serde")]
    pub lock_ttl: Duration,
    /// Restarts allowed per node per UTC day (the circuit breaker).
    pub breaker_per_day: u32,
    /// Remove the per-node cap entirely (not recommended; must be said explicitly).
    pub breaker_disabled: bool,
    /// Restarts allowed across the whole fleet per `fleet_window`; 0 disables the fleet cap.
    pub fleet_budget: u32,
    #[serde(with = "humantime_serde")]
    pub fleet_window: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    /// Slack-compatible incoming webhook; empty: alerts go to the log only.
    pub webhook_url: String,
    /// Prepended to pages (escalations, failed restarts), e.g. `<!here>` or `<@U123>`.
    pub page_mention: String,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Attempts per alert, with exponential backoff between them.
    pub attempts: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address of `/metrics`, `/healthz`, `/readyz` and the local status API; empty disables it.
    #[serde(with = "listen")]
    pub listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `vigil=debug`; env `RUST_LOG` wins.
    pub level: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_name: String::new(),
            dry_run: false,
            poll_interval: Duration::from_secs(15),
            redis: RedisConfig::default(),
            runtime: RuntimeConfig::default(),
            docker: DockerConfig::default(),
            policy: PolicyConfig::default(),
            safety: SafetyConfig::default(),
            alerts: AlertsConfig::default(),
            server: ServerConfig::default(),
            log: LogConfig::default(),
            fleet: FleetConfig::default(),
            metadata: MetadataConfig::default(),
            kubernetes: KubernetesConfig::default(),
            checkpoint: CheckpointConfig::default(),
            opportunistic: OpportunisticConfig::default(),
            gpu: GpuConfig::default(),
            kubernetes_in_cluster: false,
            deprecated: Vec::new(),
        }
    }
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            pool: String::new(),
            slice: String::new(),
            heartbeat_ttl: Duration::from_secs(60),
        }
    }
}

impl Default for MetadataConfig {
    fn default() -> Self {
        MetadataConfig {
            enabled: Switch::Auto,
            host: String::new(),
            timeout_sec: 60,
            pending_horizon: Duration::from_secs(3600),
            settle: Duration::from_secs(300),
        }
    }
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            enabled: Switch::Auto,
            api_url: String::new(),
            label_prefix: "vigil.dev/".into(),
            taint_on_termination: true,
        }
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            method: CheckpointMethod::Redis,
            label: "vigil.checkpoint".into(),
            signal: Signal::Usr1,
            sigterm_budget: Duration::from_secs(25),
            preemption_budget: Duration::from_secs(25),
            maintenance_budget: Duration::from_secs(50),
            grace: Duration::from_secs(30),
            on_sigterm: true,
        }
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: String::new(),
            mode: RedisMode::Single,
            sentinel_service: String::new(),
            key_prefix: "vigil".into(),
            timeout: Duration::from_secs(2),
            trail_max_len: 1000,
            ca_file: String::new(),
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            kind: RuntimeKind::Auto,
            podman_socket: "/run/podman/podman.sock".into(),
            cri_socket: String::new(),
            worker_label: "vigil.worker".into(),
            log_lines: 100,
            log_timeout: Duration::from_secs(20),
            stop_grace: Duration::from_secs(30),
            restart_timeout: Duration::from_secs(90),
            call_timeout: Duration::from_secs(10),
            allow_pod_replacement: false,
            pod_resources_socket: crate::sources::podresources::DEFAULT_SOCKET.into(),
        }
    }
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            host: "unix:///var/run/docker.sock".into(),
            worker_label: None,
            log_lines: None,
            log_timeout: None,
            stop_grace: None,
            restart_timeout: None,
        }
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            stale_after: Duration::from_secs(120),
            confirm_after: Duration::from_secs(10),
            restart_delay: Duration::from_secs(180),
            error_for: Duration::from_secs(30 * 60),
            stalled_after: Duration::from_secs(30 * 60),
            cooldown: Duration::from_secs(10 * 60),
            escalate_after: Duration::from_secs(10 * 60),
        }
    }
}

impl Default for SafetyConfig {
    fn default() -> Self {
        SafetyConfig {
            lock_ttl: Duration::from_secs(180),
            breaker_per_day: 3,
            breaker_disabled: false,
            fleet_budget: 10,
            fleet_window: Duration::from_secs(3600),
        }
    }
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            webhook_url: String::new(),
            page_mention: "<!here>".into(),
            timeout: Duration::from_secs(10),
            attempts: 3,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: Some(std::net::SocketAddr::from(([0, 0, 0, 0], 9464))),
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// `example.com/` — a DNS subdomain and a slash, as Kubernetes label prefixes are.
fn valid_prefix(p: &str) -> bool {
    let Some(domain) = p.strip_suffix('/') else {
        return false;
    };
    !domain.is_empty()
        && domain.len() <= 253
        && domain.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// Pause before alert delivery attempt `attempt` (0 = first, no pause).
pub(crate) fn alert_backoff(attempt: u32) -> Duration {
    // No jitter: `lock_needed` adds these up in advance.
    crate::backoff::nth_delay(Duration::from_millis(500), Duration::from_secs(8), attempt)
}

/// Room the lock must still have when the restart command starts, beyond the restart timeout.
pub(crate) const LOCK_MARGIN: Duration = Duration::from_secs(5);

impl Config {
    /// Parse a file's text; the format follows the extension (`.yaml`/`.yml`, else TOML).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml") | Some("yml")
        );
        // serde_path_to_error keeps the dotted key path, so the error can name the key.
        fn located(path: String, msg: String) -> String {
            if path.is_empty() || path == "." {
                msg
            } else {
                format!("key `{path}`: {msg}")
            }
        }
        let parsed = if yaml {
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize::<_, Config>(de)
                .map_err(|e| located(e.path().to_string(), e.inner().to_string()))
        } else {
            match toml::Deserializer::parse(text) {
                Ok(de) => serde_path_to_error::deserialize::<_, Config>(de)
                    .map_err(|e| located(e.path().to_string(), e.inner().message().to_string())),
                Err(e) => Err(e.to_string()),
            }
        };
        let mut cfg = parsed.map_err(|problem| ConfigError::File {
            path: path.to_path_buf(),
            problem: problem.replace('\n', " "),
        })?;
        cfg.migrate();
        Ok(cfg)
    }

    /// Move the deprecated `docker.*` keys to `[runtime]`, remembering each for a warning.
    /// NB: the old key wins when both are set: it is the one the operator wrote last time.
    fn migrate(&mut self) {
        let d = &mut self.docker;
        let r = &mut self.runtime;
        let mut moved = Vec::new();
        if let Some(v) = d.worker_label.take() {
            r.worker_label = v;
            moved.push("worker_label");
        }
        if let Some(v) = d.log_lines.take() {
            r.log_lines = v;
            moved.push("log_lines");
        }
        if let Some(v) = d.log_timeout.take() {
            r.log_timeout = v;
            moved.push("log_timeout");
        }
        if let Some(v) = d.stop_grace.take() {
            r.stop_grace = v;
            moved.push("stop_grace");
        }
        if let Some(v) = d.restart_timeout.take() {
            r.restart_timeout = v;
            moved.push("restart_timeout");
        }
        self.deprecated.extend(
            moved
                .into_iter()
                .map(|k| format!("docker.{k} is deprecated: use runtime.{k}")),
        );
    }

    /// Load from an optional file, apply environment overrides, validate.
    pub fn load(path: Option<&Path>, env: &dyn Env) -> Result<Config, ConfigError> {
        let mut cfg = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| ConfigError::File {
                    path: p.to_path_buf(),
                    problem: e.to_string(),
                })?;
                Config::parse(&text, p)?
            }
            None => Config::default(),
        };
        cfg.apply_env(env);
        cfg.validate()?;
        cfg.check_files()?;
        Ok(cfg)
    }

    /// The files the config names exist and can be read. Kept out of [`Config::validate`], which
    /// does no I/O (a reload validates the merged config in the agent's loop).
    pub(crate) fn check_files(&self) -> Result<(), ConfigError> {
        if !self.redis.ca_file.is_empty() {
            if let Err(e) = std::fs::metadata(&self.redis.ca_file) {
                return Err(ConfigError::Invalid {
                    key: "redis.ca_file",
                    problem: format!("cannot read {}: {e}", self.redis.ca_file),
                });
            }
        }
        Ok(())
    }

    /// `NODE_NAME`, `REDIS_URL` and `DOCKER_HOST` win over the file, as in the DaemonSet.
    pub(crate) fn apply_env(&mut self, env: &dyn Env) {
        if let Some(v) = env.get("NODE_NAME") {
            self.node_name = v;
        }
        if let Some(v) = env.get("REDIS_URL") {
            self.redis.url = v;
        }
        if let Some(v) = env.get("DOCKER_HOST") {
            self.docker.host = v;
        }
        if let Some(v) = env.get("VIGIL_WEBHOOK_URL") {
            self.alerts.webhook_url = v;
        }
        if let Some(v) = env.get("GCE_METADATA_HOST") {
            self.metadata.host = v;
        }
        if let Some(v) = env.get("VIGIL_POOL") {
            self.fleet.pool = v;
        }
        if let Some(v) = env.get("VIGIL_SLICE") {
            self.fleet.slice = v;
        }
        if self.kubernetes.enabled == Switch::Auto {
            self.kubernetes_in_cluster = env.get("KUBERNETES_SERVICE_HOST").is_some();
        }
        if self.node_name.is_empty() {
            if let Some(h) = env.get("HOSTNAME") {
                self.node_name = h;
            } else if let Ok(h) = std::fs::read_to_string("/etc/hostname") {
                self.node_name = h.trim().to_string();
            }
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        fn bad(key: &'static str, problem: impl Into<String>) -> Result<(), ConfigError> {
            Err(ConfigError::Invalid {
                key,
                problem: problem.into(),
            })
        }
        let nonzero: [(&'static str, Duration); 14] = [
            ("poll_interval", self.poll_interval),
            ("redis.timeout", self.redis.timeout),
            ("runtime.log_timeout", self.runtime.log_timeout),
            ("runtime.restart_timeout", self.runtime.restart_timeout),
            ("runtime.call_timeout", self.runtime.call_timeout),
            ("policy.stale_after", self.policy.stale_after),
            // Zero would skip a safeguard: the second observation, the persistence delay.
            ("policy.confirm_after", self.policy.confirm_after),
            ("policy.restart_delay", self.policy.restart_delay),
            ("policy.error_for", self.policy.error_for),
            ("policy.stalled_after", self.policy.stalled_after),
            ("policy.cooldown", self.policy.cooldown),
            ("policy.escalate_after", self.policy.escalate_after),
            ("safety.lock_ttl", self.safety.lock_ttl),
            ("alerts.timeout", self.alerts.timeout),
        ];
        for (key, d) in nonzero {
            if d.is_zero() {
                return bad(key, "must be greater than zero");
            }
        }
        if self.node_name.trim().is_empty() {
            return bad(
                "node_name",
                "is empty and no NODE_NAME or host name was found",
            );
        }
        // NB: the node name goes into Redis keys (inside a hash tag), labels of the fleet view
        // and Kubernetes calls: a Kubernetes node name is a DNS subdomain.
        let name_ok = self.node_name.len() <= 253
            && self
                .node_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
        if !name_ok {
            return bad(
                "node_name",
                "must be at most 253 characters of a-z A-Z 0-9 . - _ (a Kubernetes node name): no braces, spaces, `:`, `/` or newlines",
            );
        }
        if self.redis.key_prefix.is_empty() || self.redis.key_prefix.contains(['{', '}', ':']) {
            return bad(
                "redis.key_prefix",
                "must be non-empty without braces or colons",
            );
        }
        let has_scheme = |s: &str, schemes: &[&str]| schemes.iter().any(|p| s.starts_with(p));
        let urls = crate::coord::redis::split_urls(&self.redis.url);
        if urls.len() > 1 && self.redis.mode == RedisMode::Single {
            return bad(
                "redis.url",
                "lists several servers: set redis.mode = \"cluster\" (Redis Cluster seed nodes) or \"sentinel\" (the Sentinels)",
            );
        }
        for url in &urls {
            if !has_scheme(url, &["redis://", "rediss://", "unix://"]) {
                return bad(
                    "redis.url",
                    format!("`{url}` is not a redis://, rediss:// or unix:// URL"),
                );
            }
            if let Err(e) = redis::Client::open(url.as_str()) {
                return bad("redis.url", format!("`{url}` does not parse: {e}"));
            }
        }
        if self.redis.mode != RedisMode::Single && urls.is_empty() {
            return bad(
                "redis.url",
                "is empty: redis.mode = cluster or sentinel needs the servers' addresses",
            );
        }
        if self.redis.mode == RedisMode::Sentinel && self.redis.sentinel_service.trim().is_empty() {
            return bad(
                "redis.sentinel_service",
                "is empty: name the master the Sentinels monitor (as in `sentinel monitor NAME ...`)",
            );
        }
        if !self.redis.ca_file.is_empty() && !self.redis.url.starts_with("rediss://") {
            return bad(
                "redis.ca_file",
                "is only used with a rediss:// (TLS) redis.url",
            );
        }
        if self.redis.trail_max_len == 0 {
            return bad("redis.trail_max_len", "must be at least 1");
        }
        if !(self.docker.host.starts_with("unix://")
            || self.docker.host.starts_with("tcp://")
            || self.docker.host.starts_with("http://"))
        {
            return bad(
                "docker.host",
                format!(
                    "`{}` is not a unix://, tcp:// or http:// address",
                    self.docker.host
                ),
            );
        }
        if self.runtime.worker_label.is_empty() {
            return bad("runtime.worker_label", "must not be empty");
        }
        let restart_needs = self.runtime.stop_grace + self.runtime.call_timeout;
        if self.runtime.restart_timeout <= restart_needs {
            return bad(
                "runtime.restart_timeout",
                format!(
                    "{} is not longer than runtime.stop_grace + runtime.call_timeout = {}: a worker that ignores SIGTERM \
                     (any hung one) is killed only when the stop grace ends, and starting it again takes up to a call's time; \
                     we would give up before the runtime's SIGKILL",
                    humantime::format_duration(self.runtime.restart_timeout),
                    humantime::format_duration(restart_needs)
                ),
            );
        }
        if !self.runtime.podman_socket.starts_with('/') {
            return bad(
                "runtime.podman_socket",
                format!(
                    "`{}` is not an absolute path to a unix socket",
                    self.runtime.podman_socket
                ),
            );
        }
        if !self.runtime.cri_socket.is_empty() && !self.runtime.cri_socket.starts_with('/') {
            return bad(
                "runtime.cri_socket",
                format!(
                    "`{}` is not an absolute path to a unix socket",
                    self.runtime.cri_socket
                ),
            );
        }
        let pr = &self.runtime.pod_resources_socket;
        if !pr.is_empty() && !pr.starts_with('/') {
            return bad(
                "runtime.pod_resources_socket",
                format!("`{pr}` is not an absolute path to a unix socket (empty = off)"),
            );
        }
        if self.policy.confirm_after >= self.policy.stale_after {
            return bad(
                "policy.confirm_after",
                "must be shorter than policy.stale_after",
            );
        }
        let needed = self.lock_needed();
        if self.safety.lock_ttl < needed {
            return bad(
                "safety.lock_ttl",
                format!(
                    "{} is shorter than runtime.log_timeout + alert delivery (alerts.timeout x attempts, with backoff) \
                     + runtime.restart_timeout + {}s margin = {}; the lock could expire mid-restart",
                    humantime::format_duration(self.safety.lock_ttl),
                    LOCK_MARGIN.as_secs(),
                    humantime::format_duration(needed)
                ),
            );
        }
        if self.safety.breaker_per_day == 0 && !self.safety.breaker_disabled {
            return bad(
                "safety.breaker_per_day",
                "0 is ambiguous: use dry_run = true to never restart, or safety.breaker_disabled = true to remove the cap",
            );
        }
        if self.safety.fleet_budget > 0 && self.safety.fleet_window < Duration::from_secs(1) {
            return bad("safety.fleet_window", "must be at least 1s");
        }
        if self.alerts.attempts == 0 {
            return bad("alerts.attempts", "must be at least 1");
        }
        if !self.alerts.webhook_url.is_empty()
            && !has_scheme(&self.alerts.webhook_url, &["http://", "https://"])
        {
            return bad("alerts.webhook_url", "must be an http:// or https:// URL");
        }
        if self.gpu.sample_interval < Duration::from_secs(1) {
            return bad("gpu.sample_interval", "must be at least 1s");
        }
        if let Some(x) = self
            .gpu
            .hardware_xids
            .iter()
            .find(|x| self.gpu.application_xids.contains(x))
        {
            return bad(
                "gpu.hardware_xids",
                format!("XID {x} is also in gpu.application_xids; it must be one or the other"),
            );
        }
        if self.metadata.timeout_sec == 0 || self.metadata.timeout_sec > 3600 {
            return bad("metadata.timeout_sec", "must be between 1 and 3600");
        }
        if self.fleet.heartbeat_ttl < self.poll_interval * 2 {
            return bad(
                "fleet.heartbeat_ttl",
                "must be at least twice poll_interval, or healthy nodes flap to down",
            );
        }
        if !self.kubernetes.api_url.is_empty()
            && !has_scheme(&self.kubernetes.api_url, &["http://", "https://"])
        {
            return bad("kubernetes.api_url", "must be an http:// or https:// URL");
        }
        if !valid_prefix(&self.kubernetes.label_prefix) {
            return bad(
                "kubernetes.label_prefix",
                "must be a DNS subdomain followed by `/`, e.g. `vigil.dev/`",
            );
        }
        if self.checkpoint.label.is_empty() {
            return bad("checkpoint.label", "must not be empty");
        }
        for (key, budget) in [
            ("checkpoint.sigterm_budget", self.checkpoint.sigterm_budget),
            (
                "checkpoint.preemption_budget",
                self.checkpoint.preemption_budget,
            ),
        ] {
            // The drain ends 1 s before the grace: the budget must fit in what is left.
            let room = self.checkpoint.grace.saturating_sub(Duration::from_secs(1));
            if budget.is_zero() || budget > room {
                return bad(
                    key,
                    format!(
                        "must be above 0 and at most checkpoint.grace - 1s ({}), so the round ends before the agent exits and the agent exits before it is killed",
                        humantime::format_duration(room)
                    ),
                );
            }
        }
        if self.opportunistic.enabled && self.fleet.pool.is_empty() {
            return bad(
                "opportunistic.enabled",
                "needs fleet.pool (or VIGIL_POOL): the min_nodes rule counts the node's pool",
            );
        }
        if self.opportunistic.enabled && self.embedded() {
            return bad(
                "opportunistic.enabled",
                "needs Redis (REDIS_URL): the pool claim must be shared by every node",
            );
        }
        if self.checkpoint.maintenance_budget.is_zero() {
            return bad("checkpoint.maintenance_budget", "must be greater than zero");
        }
        Ok(())
    }

    /// The defaults, as a commented TOML file (`vigil config defaults`).
    pub fn defaults_toml() -> String {
        let cfg = Config {
            node_name: "my-node".into(),
            ..Config::default()
        };
        toml::to_string_pretty(&cfg).unwrap_or_default()
    }

    /// The longest the lock must be held in one pass: logs, the restart alert (every attempt and
    /// its backoff), the restart itself, and a margin.
    pub(crate) fn lock_needed(&self) -> Duration {
        let alert: Duration = (0..self.alerts.attempts)
            .map(|a| self.alerts.timeout + alert_backoff(a))
            .sum();
        self.runtime.log_timeout + alert + self.runtime.restart_timeout + LOCK_MARGIN
    }

    /// Whether the Node object is published (explicit `on`, or `auto` inside a cluster).
    pub(crate) fn kubernetes_on(&self) -> bool {
        match self.kubernetes.enabled {
            Switch::On => true,
            Switch::Auto => self.kubernetes_in_cluster || !self.kubernetes.api_url.is_empty(),
            Switch::Off => false,
        }
    }

    pub fn embedded(&self) -> bool {
        self.redis.url.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let mut c = Config::parse(text, Path::new("vigil.toml"))?;
        c.apply_env(&env(&[("NODE_NAME", "n1")]));
        c.validate()?;
        Ok(c)
    }

    /// The key an error names: a validation error's key, or the dotted path of a value that
    /// did not parse into its type.
    fn key_of(r: Result<Config, ConfigError>) -> String {
        match r {
            Err(ConfigError::Invalid { key, .. }) => key.to_string(),
            Err(ConfigError::File { problem, .. }) => problem
                .strip_prefix("key `")
                .and_then(|p| p.split_once('`'))
                .map(|(k, _)| k.to_string())
                .unwrap_or(problem),
            other => panic!("expected an invalid key, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid_and_match_the_brief() {
        let c = parse("").unwrap();
        assert_eq!(c.policy.stale_after, Duration::from_secs(120));
        assert_eq!(c.policy.restart_delay, Duration::from_secs(180));
        assert_eq!(c.policy.error_for, Duration::from_secs(1800));
        assert_eq!(c.policy.cooldown, Duration::from_secs(600));
        assert_eq!(c.policy.escalate_after, Duration::from_secs(600));
        assert_eq!(c.safety.breaker_per_day, 3);
        assert!(c.embedded());
    }

    #[test]
    fn durations_accept_human_units() {
        let c = parse("[policy]\nstale_after = \"2m\"\nrestart_delay = \"90s\"\n").unwrap();
        assert_eq!(c.policy.stale_after, Duration::from_secs(120));
        assert_eq!(c.policy.restart_delay, Duration::from_secs(90));
    }

    #[test]
    fn yaml_is_accepted() {
        let mut c = Config::parse(
            "policy:\n  stale_after: 3m\nsafety:\n  breaker_per_day: 5\n",
            Path::new("v.yaml"),
        )
        .unwrap();
        c.apply_env(&env(&[("NODE_NAME", "n1")]));
        c.validate().unwrap();
        assert_eq!(c.policy.stale_after, Duration::from_secs(180));
        assert_eq!(c.safety.breaker_per_day, 5);
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse("[policy]\nstale_afterr = \"2m\"\n").unwrap_err();
        assert!(err.to_string().contains("stale_afterr"), "{err}");
    }

    #[test]
    fn bad_duration_is_named() {
        let err = parse("[policy]\nstale_after = \"two minutes\"\n").unwrap_err();
        assert!(
            err.to_string().contains("key `policy.stale_after`"),
            "{err}"
        );
    }

    #[test]
    fn zero_stale_threshold_is_rejected() {
        assert_eq!(
            key_of(parse("[policy]\nstale_after = \"0s\"\n")),
            "policy.stale_after"
        );
    }

    #[test]
    fn short_lock_ttl_is_rejected() {
        let r = parse("[safety]\nlock_ttl = \"30s\"\n");
        assert_eq!(key_of(r), "safety.lock_ttl");
    }

    #[test]
    fn a_restart_timeout_shorter_than_the_stop_grace_plus_a_call_says_why() {
        let err =
            parse("[runtime]\nstop_grace = \"45s\"\nrestart_timeout = \"50s\"\n").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("runtime.restart_timeout"), "{text}");
        assert!(
            text.contains("stop_grace + runtime.call_timeout = 55s"),
            "{text}"
        );
        assert!(text.contains("ignores SIGTERM"), "{text}");
        // The default grace and call deadline fit the default restart timeout with room.
        assert!(parse("[runtime]\nstop_grace = \"45s\"\nrestart_timeout = \"56s\"\n").is_ok());
    }

    #[test]
    fn breaker_zero_needs_explicit_disable() {
        assert_eq!(
            key_of(parse("[safety]\nbreaker_per_day = 0\n")),
            "safety.breaker_per_day"
        );
        assert!(parse("[safety]\nbreaker_per_day = 0\nbreaker_disabled = true\n").is_ok());
    }

    #[test]
    fn env_overrides_file() {
        let mut c = Config::parse(
            "node_name = \"file\"\n[redis]\nurl = \"redis://file:1\"\n",
            Path::new("v.toml"),
        )
        .unwrap();
        c.apply_env(&env(&[
            ("NODE_NAME", "env-node"),
            ("REDIS_URL", "redis://env:2"),
            ("DOCKER_HOST", "tcp://127.0.0.1:2375"),
        ]));
        assert_eq!(c.node_name, "env-node");
        assert_eq!(c.redis.url, "redis://env:2");
        assert_eq!(c.docker.host, "tcp://127.0.0.1:2375");
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        let cases: &[(&str, &str)] = &[
            ("poll_interval = \"0s\"", "poll_interval"),
            ("[redis]\nurl = \"http://x\"", "redis.url"),
            ("[redis]\nkey_prefix = \"a:b\"", "redis.key_prefix"),
            ("[redis]\ntrail_max_len = 0", "redis.trail_max_len"),
            ("[docker]\nhost = \"/var/run/docker.sock\"", "docker.host"),
            ("[runtime]\nworker_label = \"\"", "runtime.worker_label"),
            (
                "[runtime]\nstop_grace = \"90s\"\nrestart_timeout = \"60s\"",
                "runtime.restart_timeout",
            ),
            (
                // The stop grace plus one call's time is the least a restart can take.
                "[runtime]\nstop_grace = \"60s\"\nrestart_timeout = \"70s\"",
                "runtime.restart_timeout",
            ),
            ("[runtime]\ncall_timeout = \"0s\"", "runtime.call_timeout"),
            ("[runtime]\nkind = \"rkt\"", "runtime.kind"),
            (
                "[runtime]\npodman_socket = \"podman.sock\"",
                "runtime.podman_socket",
            ),
            (
                "[runtime]\ncri_socket = \"containerd.sock\"",
                "runtime.cri_socket",
            ),
            (
                "[runtime]\npod_resources_socket = \"kubelet.sock\"",
                "runtime.pod_resources_socket",
            ),
            ("[policy]\nconfirm_after = \"5m\"", "policy.confirm_after"),
            ("[policy]\ncooldown = \"0s\"", "policy.cooldown"),
            ("[policy]\nrestart_delay = \"0s\"", "policy.restart_delay"),
            ("[redis]\nurl = \"redis://host:notaport\"", "redis.url"),
            (
                "[checkpoint]\ngrace = \"1s\"\nsigterm_budget = \"900ms\"\npreemption_budget = \"900ms\"",
                "checkpoint.sigterm_budget",
            ),
            ("[policy]\nconfirm_after = \"0s\"", "policy.confirm_after"),
            ("[alerts]\nattempts = 0", "alerts.attempts"),
            ("[alerts]\nwebhook_url = \"slack\"", "alerts.webhook_url"),
            ("[server]\nlisten = \"nope\"", "server.listen"),
            ("[log]\nformat = \"xml\"", "log.format"),
            ("[metadata]\nenabled = \"yes\"", "metadata.enabled"),
            ("[gpu]\nenabled = \"maybe\"", "gpu.enabled"),
            (
                "[checkpoint]\nmethod = \"carrier-pigeon\"",
                "checkpoint.method",
            ),
            (
                "[checkpoint]\nmethod = \"signal:SIGKILL\"",
                "checkpoint.method",
            ),
            ("[checkpoint]\nsignal = \"SIGSTOP\"", "checkpoint.signal"),
        ];
        for (text, key) in cases {
            assert_eq!(key_of(parse(text)), *key, "for {text:?}");
        }
    }

    #[test]
    fn typed_values_parse_at_the_boundary() {
        let c = parse(
            "[server]\nlisten = \"\"\n[log]\nformat = \"json\"\n[checkpoint]\nmethod = \"signal:usr2\"\nsignal = \"SIGHUP\"\n[gpu]\nenabled = \"off\"\n",
        )
        .unwrap();
        assert_eq!(c.server.listen, None, "empty disables the server");
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(
            c.checkpoint.method,
            CheckpointMethod::Signal(Some(Signal::Usr2))
        );
        assert_eq!(c.checkpoint.signal, Signal::Hup);
        assert_eq!(c.gpu.enabled, Switch::Off);
        let c = parse("[checkpoint]\nmethod = \"https://w:8080/ckpt\"\n").unwrap();
        assert_eq!(
            c.checkpoint.method,
            CheckpointMethod::Http("https://w:8080/ckpt".into())
        );
    }

    #[test]
    fn validation_does_no_io_and_load_checks_files() {
        let mut c = Config {
            node_name: "n1".into(),
            ..Config::default()
        };
        c.redis.url = "rediss://r:6380".into();
        c.redis.ca_file = "/nonexistent/vigil-ca.pem".into();
        assert!(c.validate().is_ok(), "validate reads no file");
        let err = c.check_files().unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Invalid {
                    key: "redis.ca_file",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn node_names_are_kubernetes_node_names() {
        let long = "n".repeat(254);
        for bad in ["a:b", "a/b", "a\nb", "a b", "{n}", long.as_str()] {
            let c = Config {
                node_name: bad.into(),
                ..Config::default()
            };
            assert_eq!(
                key_of(c.validate().map(|()| c.clone())),
                "node_name",
                "{bad:?}"
            );
        }
        let ok = Config {
            node_name: "gke-pool-1-abcd.europe-west4-a_x".into(),
            ..Config::default()
        };
        assert!(ok.validate().is_ok());
    }

    #[test]
    fn old_docker_keys_still_work_and_say_so() {
        let c =
            parse("[docker]\nworker_label = \"team.worker\"\nrestart_timeout = \"2m\"\n").unwrap();
        assert_eq!(c.runtime.worker_label, "team.worker");
        assert_eq!(c.runtime.restart_timeout, Duration::from_secs(120));
        assert_eq!(c.docker.worker_label, None, "moved, not kept twice");
        assert_eq!(
            c.deprecated,
            vec![
                "docker.worker_label is deprecated: use runtime.worker_label",
                "docker.restart_timeout is deprecated: use runtime.restart_timeout",
            ]
        );
        let c = parse("[runtime]\nkind = \"cri\"\n").unwrap();
        assert_eq!(c.runtime.kind, RuntimeKind::Cri);
        let c = parse("[runtime]\nkind = \"podman\"\n").unwrap();
        assert_eq!(c.runtime.kind, RuntimeKind::Podman);
        assert_eq!(c.runtime.podman_socket, "/run/podman/podman.sock");
        assert!(c.deprecated.is_empty());
    }

    #[test]
    fn defaults_round_trip_through_toml() {
        let text = Config::defaults_toml();
        let c = Config::parse(&text, Path::new("d.toml")).unwrap();
        assert_eq!(c.policy, PolicyConfig::default());
        assert_eq!(c.safety, SafetyConfig::default());
        assert_eq!(c.server, ServerConfig::default());
        assert_eq!(c.checkpoint, CheckpointConfig::default());
        assert_eq!(c.log, LogConfig::default());
    }
}
