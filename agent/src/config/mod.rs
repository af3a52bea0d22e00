//! Configuration: one file (TOML or YAML), every key with a documented default, a few environment
//! overrides, and validation that names the offending key.
//!
//! One file per section, beside its struct: the keys, their defaults and the section's own
//! `validate`. This file holds the whole [`Config`]: parsing, environment overrides, the
//! keys removed before 1.0 (named in the error), and [`Config::validate`], which runs every section's rules and
//! the few that span sections.
//!
//! The environment is read through the [`Env`] trait so that every parse and validation error is a
//! unit test with a `HashMap`, never a `set_var`.

#[cfg(any(test, feature = "bench"))]
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod alerts;
mod checkpoint;
mod docker;
mod duration;
mod fleet;
mod gang;
mod gpu;
mod kubernetes;
mod log;
mod metadata;
mod opportunistic;
mod policy;
mod redis;
pub(crate) mod reload;
mod removed;
pub(crate) mod runtime;
mod safety;
mod server;
/// A node name as Vigil takes it: at most 253 characters of `a-z A-Z 0-9 . - _` (a
/// Kubernetes node name; it goes inside a Redis hash tag, so never a brace).
pub(crate) fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

#[cfg(test)]
mod testing;
mod tpu;
mod worker_api;

pub(crate) use alerts::alert_backoff;
pub use alerts::{AlertsConfig, WebhookFormat};
pub(crate) use checkpoint::{CheckpointConfig, CheckpointMethod, OnSigterm, Signal};
pub(crate) use docker::DockerConfig;
pub(crate) use fleet::FleetConfig;
pub use gang::{GangAction, GangConfig, PaceConfig, SlowTaint, StragglerAction};
pub use gpu::{GpuConfig, XidAction, XidThreshold};
pub use kubernetes::KubernetesConfig;
pub(crate) use log::{LogConfig, LogFormat};
pub(crate) use metadata::MetadataConfig;
pub(crate) use opportunistic::OpportunisticConfig;
pub(crate) use policy::PolicyConfig;
pub use redis::{RedisConfig, RedisMode};
pub(crate) use runtime::{RuntimeConfig, RuntimeKind};
pub(crate) use safety::{SafetyConfig, LOCK_MARGIN};
pub(crate) use server::ServerConfig;
pub(crate) use tpu::TpuConfig;
pub(crate) use worker_api::{WorkerApiConfig, WorkerAuth};

/// A configuration problem, always naming the key so the operator can find the line to fix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("config file {path}: {problem}")]
    File { path: PathBuf, problem: String },
    #[error("config key `{key}`: {problem}")]
    Invalid { key: &'static str, problem: String },
}

/// Where environment overrides come from: the process environment in production, a map in tests.
/// A variable set to the empty string is `Some("")` here: what empty means is the config's to say
/// (unset, and for `REDIS_URL` an error where the agent runs: `refuse_empty_redis_url`), the
/// same in production and in tests.
pub(crate) trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

/// The real process environment.
pub(crate) struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// A map, for the unit tests.
#[cfg(any(test, feature = "bench"))]
impl Env for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }
}

/// `auto`, `on` or `off`, for the optional integrations (metadata server, Kubernetes, NVML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::Display)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "kebab-case")]
pub enum Switch {
    /// On where the platform is detected; off, said once, elsewhere.
    Auto,
    /// Always on: a missing platform is an error, retried.
    On,
    Off,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Name of the node this agent watches; env `NODE_NAME`, else the host name.
    pub node_name: String,
    /// Observe mode: decide everything, run no restart.
    pub dry_run: bool,
    /// How often the worker records are evaluated.
    #[serde(with = "duration")]
    #[educe(Default(expression = Duration::from_secs(15)))]
    pub poll_interval: Duration,
    pub redis: RedisConfig,
    pub runtime: RuntimeConfig,
    pub docker: DockerConfig,
    pub policy: PolicyConfig,
    pub safety: SafetyConfig,
    pub alerts: AlertsConfig,
    pub server: ServerConfig,
    pub worker_api: WorkerApiConfig,
    pub log: LogConfig,
    pub fleet: FleetConfig,
    pub metadata: MetadataConfig,
    pub kubernetes: KubernetesConfig,
    pub checkpoint: CheckpointConfig,
    pub opportunistic: OpportunisticConfig,
    pub gang: GangConfig,
    pub gpu: GpuConfig,
    pub tpu: TpuConfig,
    /// Set from the environment (`KUBERNETES_SERVICE_HOST`), never from the file.
    #[serde(skip)]
    pub kubernetes_in_cluster: bool,
}

/// A validation error naming `key`.
fn bad(key: &'static str, problem: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid { key, problem: problem.into() })
}

/// [`bad`] when `broken`: a rule in one call.
fn bad_if(broken: bool, key: &'static str, problem: impl Into<String>) -> Result<(), ConfigError> {
    if broken {
        return bad(key, problem);
    }
    Ok(())
}

/// The rule of every duration that must be at least a second.
fn at_least_a_second(key: &'static str, value: Duration) -> Result<(), ConfigError> {
    bad_if(value < Duration::from_secs(1), key, "must be at least 1s")
}

/// The rule of a URL that may be empty: else `http://` or `https://` (`note`, when not empty,
/// after the problem and a space).
fn http_or_empty(key: &'static str, url: &str, note: &str) -> Result<(), ConfigError> {
    let gap = if note.is_empty() { "" } else { " " };
    let why = format!("must be an http:// or https:// URL{gap}{note}");
    bad_if(!url.is_empty() && !has_scheme(url, &["http://", "https://"]), key, why)
}

/// A file that cannot be read or parsed.
fn file_error(path: &Path, problem: impl ToString) -> ConfigError {
    ConfigError::File { path: path.to_path_buf(), problem: problem.to_string() }
}

/// `var`'s value when it is set and not empty: an empty variable counts as unset.
fn non_empty(env: &dyn Env, var: &str) -> Option<String> {
    env.get(var).filter(|v| !v.is_empty())
}

/// `var`'s value, when it is set and not empty, into `slot`.
fn from_env<T: From<String>>(env: &dyn Env, var: &str, slot: &mut T) {
    if let Some(v) = non_empty(env, var) {
        *slot = v.into();
    }
}

/// A `REDIS_URL` that is set but empty (or blank) is refused where the agent runs (`vigil run`,
/// and `config check` and `doctor`, which say what it would do): taken as unset, it silently
/// gave every node its own embedded coordinator (its own breaker, budget and locks: no fleet
/// safety), where an empty Secret value or a template that forgot the URL meant the fleet's
/// Redis. NB: not in [`Config::apply_env`]: a worker's `vigil beat` (its container may blank the
/// variable) reads it as unset, as the Python client does — refused, its beats would stop and a
/// healthy worker be restarted as hung.
pub(crate) fn refuse_empty_redis_url(env: &dyn Env) -> Result<(), ConfigError> {
    let empty = env.get("REDIS_URL").is_some_and(|v| v.trim().is_empty());
    let why = "is set but empty: unset it to use redis.url from the file (empty there: the \
               embedded coordinator, for one agent on one node only), or set it to the fleet's \
               Redis URL (in Kubernetes, the Secret `vigil`'s key `redis-url`)";
    bad_if(empty, "REDIS_URL", why)
}

/// The lines of `VIGIL_WEBHOOK_HEADERS` that say something (numbered from 1): not blank, not a
/// `#` comment.
fn header_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let said = |l: &str| !l.trim().is_empty() && !l.trim_start().starts_with('#');
    text.lines().enumerate().filter(move |(_, l)| said(l)).map(|(i, l)| (i + 1, l))
}

/// A TOML syntax error as where and what, never the line itself: toml's own text quotes the
/// line, and a line that does not parse is often the one with a password in it (an unquoted
/// `url = redis://:pw@host`, a quote inside the password).
fn toml_syntax(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim();
    let Some(at) = e.span().map(|s| s.start.min(text.len())) else {
        return format!("TOML syntax: {message}");
    };
    let before = text.get(..at).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
    format!("TOML syntax at line {line}, column {column}: {message} (the line is not shown: it may hold a secret)")
}

/// Whether `s` starts with one of `schemes` (`"https://"`).
fn has_scheme(s: &str, schemes: &[&str]) -> bool {
    schemes.iter().any(|p| s.starts_with(p))
}

impl Config {
    /// Parse a file's text; the format follows the extension (`.yaml`/`.yml`, else TOML).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let yaml = matches!(path.extension().and_then(|e| e.to_str()), Some("yaml") | Some("yml"));
        // serde_path_to_error keeps the dotted key path, so the error can name the key.
        let located = |path: String, msg: String| match path.as_str() {
            "" | "." => msg,
            _ => format!("key `{path}`: {msg}"),
        };
        let parsed = if yaml {
            let de = serde_yaml_ng::Deserializer::from_str(text);
            serde_path_to_error::deserialize::<_, Config>(de)
                .map_err(|e| located(e.path().to_string(), e.inner().to_string()))
        } else {
            match toml::Deserializer::parse(text) {
                Ok(de) => serde_path_to_error::deserialize::<_, Config>(de)
                    .map_err(|e| located(e.path().to_string(), e.inner().message().to_string())),
                Err(e) => Err(toml_syntax(text, &e)),
            }
        };
        parsed.map_err(|problem| file_error(path, removed::hint(problem.replace('\n', " "))))
    }

    /// Load from an optional file, apply environment overrides, validate.
    pub(crate) fn load(path: Option<&Path>, env: &dyn Env) -> Result<Config, ConfigError> {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| file_error(p, e));
        let mut cfg = match path {
            Some(p) => Config::parse(&read(p)?, p)?,
            None => Config::default(),
        };
        cfg.apply_env(env)?;
        cfg.validate()?;
        cfg.check_files()?;
        Ok(cfg)
    }

    /// The files the config names exist and can be read (`redis.ca_file`). Kept out of
    /// [`Config::validate`], which does no I/O (a reload validates the merged config in the
    /// agent's loop).
    pub(crate) fn check_files(&self) -> Result<(), ConfigError> {
        let ca = &self.redis.ca_file;
        let Some(Err(e)) = (!ca.is_empty()).then(|| std::fs::metadata(ca)) else { return Ok(()) };
        bad("redis.ca_file", format!("cannot read {ca}: {e}"))
    }

    /// `NODE_NAME`, `REDIS_URL` and `DOCKER_HOST` win over the file, as in the DaemonSet; an
    /// empty variable counts as unset (`REDIS_URL` too: the agent's commands refuse it first,
    /// `refuse_empty_redis_url`). Every line of `VIGIL_WEBHOOK_HEADERS` that says something is
    /// `Name: value`, or an error that does not show the line.
    pub(crate) fn apply_env(&mut self, env: &dyn Env) -> Result<(), ConfigError> {
        from_env(env, "NODE_NAME", &mut self.node_name);
        from_env(env, "DOCKER_HOST", &mut self.docker.host);
        from_env(env, "GCE_METADATA_HOST", &mut self.metadata.host);
        from_env(env, "VIGIL_POOL", &mut self.fleet.pool);
        from_env(env, "VIGIL_SLICE", &mut self.fleet.slice);
        from_env(env, "REDIS_URL", &mut self.redis.url);
        from_env(env, "VIGIL_WEBHOOK_URL", &mut self.alerts.webhook_url);
        from_env(env, "VIGIL_ALERTMANAGER_URL", &mut self.alerts.alertmanager_url);
        from_env(env, "VIGIL_PAGERDUTY_ROUTING_KEY", &mut self.alerts.routing_key);
        let headers = env.get("VIGIL_WEBHOOK_HEADERS").unwrap_or_default();
        for (n, line) in header_lines(&headers) {
            // NB: a line without a colon used to be dropped without a word (a pasted `Bearer …`
            // sent no credential). (A name that is no header name is refused by `alerts.headers`'s
            // rule.)
            let Some((name, value)) = line.split_once(':') else {
                return bad(
                    "VIGIL_WEBHOOK_HEADERS",
                    format!("line {n} is not `Name: value` (the line is not shown: it may hold a secret)"),
                );
            };
            self.alerts.headers.insert(name.trim().to_string(), value.trim().into());
        }
        if self.kubernetes.enabled == Switch::Auto {
            self.kubernetes_in_cluster = non_empty(env, "KUBERNETES_SERVICE_HOST").is_some();
        }
        if self.node_name.is_empty() {
            let file =
                || std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string());
            self.node_name = non_empty(env, "HOSTNAME").or_else(file).unwrap_or_default();
        }
        Ok(())
    }

    /// Every rule, each section's and those across sections. Every zero duration is named before
    /// any other problem, and the rest in the order of the sections below, so a file with several
    /// problems has the same one named first whichever file a rule lives in. No I/O: a reload
    /// validates the merged config in the agent's loop.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_nonzero()?;
        self.validate_node_name()?;
        self.redis.validate()?;
        self.docker.validate()?;
        self.runtime.validate()?;
        self.policy.validate()?;
        // NB: the alerts first: the lock's rule adds up their attempts.
        self.alerts.validate()?;
        self.validate_lock_ttl()?;
        self.safety.validate()?;
        self.gpu.validate()?;
        self.tpu.validate()?;
        self.metadata.validate()?;
        self.validate_heartbeat_ttl()?;
        self.kubernetes.validate()?;
        self.checkpoint.validate()?;
        self.validate_opportunistic()?;
        self.gang.validate()?;
        self.worker_api.validate()?;
        self.validate_worker_auth()?;
        self.log.validate()
    }

    /// Every duration that must be above zero, in every section (the sections' `validate` run
    /// after this, so none checks its own again): the first that is zero, named by its key.
    fn validate_nonzero(&self) -> Result<(), ConfigError> {
        let durations = [
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
            ("policy.start_grace", self.policy.start_grace),
            ("policy.escalate_after", self.policy.escalate_after),
            ("policy.max_grace", self.policy.max_grace),
            ("safety.lock_ttl", self.safety.lock_ttl),
            ("alerts.timeout", self.alerts.timeout),
            ("alerts.alertmanager_repost", self.alerts.alertmanager_repost),
            ("checkpoint.maintenance_budget", self.checkpoint.maintenance_budget),
        ];
        let zero = durations.into_iter().find(|(_, d)| d.is_zero());
        zero.map_or(Ok(()), |(key, _)| bad(key, "must be greater than zero"))
    }

    /// Tokens are reviewed by the API server: `auth = "kubernetes"` needs one.
    fn validate_worker_auth(&self) -> Result<(), ConfigError> {
        let api = &self.worker_api;
        let unreviewed =
            api.listen.is_some() && api.auth == WorkerAuth::Kubernetes && !self.kubernetes_on();
        let why = "is \"kubernetes\" (the default), which reviews workers' tokens with the API server, but the \
             Kubernetes API is off here (kubernetes.enabled, no in-cluster ServiceAccount, no kubernetes.api_url); \
             on a host without Kubernetes serve containers through worker_api.socket, or listen on 127.0.0.1 with auth = \"none\"";
        bad_if(unreviewed, "worker_api.auth", why)
    }

    fn validate_node_name(&self) -> Result<(), ConfigError> {
        let empty = self.node_name.trim().is_empty();
        bad_if(empty, "node_name", "is empty and no NODE_NAME or host name was found")?;
        // NB: the node name goes into Redis keys (inside a hash tag), labels of the fleet view
        // and Kubernetes calls: a Kubernetes node name is a DNS subdomain.
        let why = "must be at most 253 characters of a-z A-Z 0-9 . - _ (a Kubernetes node name): no braces, spaces, `:`, `/` or newlines";
        bad_if(!valid_node_name(&self.node_name), "node_name", why)
    }

    /// `safety.lock_ttl` covers one pass: `runtime` and `alerts` durations (see [`Config::lock_needed`]).
    fn validate_lock_ttl(&self) -> Result<(), ConfigError> {
        let (ttl, needed) = (self.safety.lock_ttl, self.lock_needed());
        if ttl >= needed {
            return Ok(());
        }
        let shown = humantime::format_duration(ttl);
        let margin = LOCK_MARGIN.as_secs();
        let why = format!(
            "{shown} is shorter than runtime.log_timeout + alert delivery (alerts.timeout x attempts, with backoff) \
             + runtime.restart_timeout + {margin}s margin = {}; the lock could expire mid-restart",
            crate::clock::brief(needed)
        );
        bad("safety.lock_ttl", why)
    }

    /// `fleet.heartbeat_ttl` outlives two polls.
    fn validate_heartbeat_ttl(&self) -> Result<(), ConfigError> {
        let why = "must be at least twice poll_interval, or healthy nodes flap to down";
        bad_if(self.fleet.heartbeat_ttl < self.poll_interval * 2, "fleet.heartbeat_ttl", why)
    }

    /// `opportunistic.enabled` needs a pool to count and a shared Redis. The pool is
    /// `fleet.pool`, or the Node's `cloud.google.com/gke-nodepool` label, read at run time when
    /// the Kubernetes API is on (until that read, no claim is taken); and its claim's TTL
    /// ([`Config::validate_claim_ttl`]).
    fn validate_opportunistic(&self) -> Result<(), ConfigError> {
        let on = self.opportunistic.enabled;
        let why = "needs the node's pool: set fleet.pool (or VIGIL_POOL), or turn the Kubernetes API on \
             (kubernetes.enabled) so the pool is read from the Node's cloud.google.com/gke-nodepool \
             label; the min_nodes rule counts the node's pool";
        let no_pool = on && self.fleet.pool.is_empty() && !self.kubernetes_on();
        bad_if(no_pool, "opportunistic.enabled", why)?;
        let why = "needs Redis (REDIS_URL): the pool claim must be shared by every node";
        bad_if(on && self.embedded(), "opportunistic.enabled", why)?;
        self.validate_claim_ttl()
    }

    /// `opportunistic.claim_ttl` outlives two polls (its text formatted only when it does not).
    /// NB: the holder looks at its claim once a poll and takes its label off only when it finds
    /// the claim gone: a claim shorter than two polls could lapse before its holder ever looked
    /// (a 0s TTL was a 1 ms claim), and another node of the pool claim while the first is still
    /// offered.
    fn validate_claim_ttl(&self) -> Result<(), ConfigError> {
        let least = self.poll_interval * 2;
        if self.opportunistic.claim_ttl >= least {
            return Ok(());
        }
        let why = format!(
            "must be at least twice poll_interval ({}): the node holding the pool's claim renews \
             it once a poll, so a shorter claim can lapse between two renewals while that node is \
             still offered for maintenance and let a second node of the pool be offered too",
            humantime::format_duration(least)
        );
        bad("opportunistic.claim_ttl", why)
    }

    /// The defaults, as a commented TOML file (`vigil config defaults`).
    pub fn defaults_toml() -> String {
        let cfg = Config { node_name: "my-node".into(), ..Config::default() };
        toml::to_string_pretty(&cfg).unwrap_or_default()
    }

    /// The longest the lock must be held in one pass: logs, the restart alert (every attempt and
    /// its backoff), the restart itself, and a margin.
    pub(crate) fn lock_needed(&self) -> Duration {
        let alert: Duration =
            (0..self.alerts.attempts).map(|a| self.alerts.timeout + alert_backoff(a)).sum();
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

    pub(crate) fn embedded(&self) -> bool {
        self.redis.url.is_empty()
    }
}

#[cfg(test)]
mod tests;
