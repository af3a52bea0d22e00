//! `[checkpoint]`: how workers are asked to save their state before the node goes, and the time
//! each round may take.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use strum::VariantArray;

use super::{bad_if, has_scheme, ConfigError};
use crate::redact::{self, Secret, Urls};

/// A signal a worker may be asked to checkpoint with. SIGKILL and SIGSTOP are not among them:
/// they cannot be handled, so they can never checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
#[derive(strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "UPPERCASE", prefix = "SIG")]
pub(crate) enum Signal {
    Usr1,
    Usr2,
    Term,
    Int,
    Hup,
    Quit,
    Winch,
    Pwr,
}

as_str!(pub Signal);

impl TryFrom<String> for Signal {
    type Error = String;
    /// `SIGUSR1`, `sigusr1` or `USR1`.
    fn try_from(name: String) -> Result<Signal, String> {
        let upper = name.trim().to_ascii_uppercase();
        let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
        let why = "is not a signal a worker can handle (SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGWINCH, SIGPWR)";
        let found = Signal::VARIANTS.iter().copied().find(|s| &s.as_str()[3..] == bare);
        found.ok_or_else(|| format!("`{name}` {why}"))
    }
}

/// How a worker is asked to checkpoint: `redis`, `signal` (the configured signal),
/// `signal:NAME`, or an `http(s)://` URL. The same syntax serves the config key and the
/// container label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub(crate) enum CheckpointMethod {
    /// The request in the status record is all: the worker reads it in its own record (the
    /// answer to its beats on the worker API, or its record in Redis).
    Record,
    /// A signal to the container's main process; `None` = `checkpoint.signal`.
    Signal(Option<Signal>),
    /// An HTTP POST to this URL, with a JSON body `{request, reason, worker, deadline_ms}`
    /// (`deadline_ms`: the milliseconds left from the POST). A secret
    /// (it may carry a token in its query or userinfo): shown as `http://w:8080/ckpt?token=***`.
    Http(Secret<Urls>),
}

impl std::str::FromStr for CheckpointMethod {
    type Err = String;
    fn from_str(s: &str) -> Result<CheckpointMethod, String> {
        let s = s.trim();
        match s {
            "record" => Ok(CheckpointMethod::Record),
            // NB: named for where the request is (the worker's record), not for a Redis that a
            // worker on the worker API never sees.
            "redis" => Err("`redis` is now called `record` (the request is in the worker's own record, with or without Redis)".into()),
            "signal" => Ok(CheckpointMethod::Signal(None)),
            _ if s.starts_with("signal:") => {
                Ok(CheckpointMethod::Signal(Some(s["signal:".len()..].to_string().try_into()?)))
            }
            _ if has_scheme(s, &["http://", "https://"]) => Ok(CheckpointMethod::Http(s.into())),
            _ => Err(format!(
                "`{}` is not `record`, `signal`, `signal:NAME` or an http(s):// URL",
                redact::url(s)
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

/// How the method is serialized, which is only ever to show it (`vigil config check`): a URL
/// redacted.
impl From<CheckpointMethod> for String {
    fn from(m: CheckpointMethod) -> String {
        match m {
            CheckpointMethod::Record => "record".into(),
            CheckpointMethod::Signal(None) => "signal".into(),
            CheckpointMethod::Signal(Some(s)) => format!("signal:{}", s.as_str()),
            CheckpointMethod::Http(url) => url.redacted(),
        }
    }
}

/// Whether the agent's own SIGTERM is a reason to ask the workers to checkpoint. The agent is
/// stopped for two very different reasons: its node is going away (the workers will go too), or
/// it is being replaced (a DaemonSet rollout, `systemctl restart`), when the workers go on as
/// they are and a save asked of every worker of every node is a cost for nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum OnSigterm {
    /// Only when the node is going away: a termination or preemption notice, the Node being
    /// deleted, shutting down (the kubelet's graceful shutdown) or marked for removal
    /// (`crate::maintenance::policy::going_away`).
    NodeGoingAway,
    /// On every SIGTERM, a rollout included.
    Always,
    /// Never (notices still do).
    Never,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Default request method: `record`, `signal`, `signal:NAME` or an `http(s)://` URL; a
    /// container label overrides it.
    #[educe(Default(expression = CheckpointMethod::Record))]
    pub(crate) method: CheckpointMethod,
    /// Container label naming a worker's method: `redis`, `signal:SIGUSR1`, `http://host:port/path`.
    #[educe(Default(expression = "vigil.checkpoint".into()))]
    pub(crate) label: String,
    /// Signal sent by the `signal` method without an explicit one.
    #[educe(Default(expression = Signal::Usr1))]
    pub(crate) signal: Signal,
    /// Budget on the agent's own SIGTERM/SIGINT (must end before the pod's grace period).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(25)))]
    pub sigterm_budget: Duration,
    /// Budget on a Spot/preemptible preemption notice (GCE gives 30 s in total).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(25)))]
    pub preemption_budget: Duration,
    /// Budget on a host-maintenance notice (GCE warns 60 s ahead).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(50)))]
    pub maintenance_budget: Duration,
    /// How long the agent may take after its SIGTERM: at most the pod's termination grace period
    /// (the Helm chart sets it to this + 5 s); the agent exits 1 s before it ends.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30)))]
    pub grace: Duration,
    /// When the agent's own SIGTERM/SIGINT asks the workers to checkpoint.
    #[educe(Default(expression = OnSigterm::NodeGoingAway))]
    pub(crate) on_sigterm: OnSigterm,
    /// What a worker needs after its checkpoint to exit. A budget plus this must fit in what the
    /// platform gives the worker (its pod's grace period, GCE's notice, GKE's node shutdown):
    /// `vigil doctor` and `vigil explain` say when it does not.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(5)))]
    pub(crate) worker_stop: Duration,
}

impl CheckpointConfig {
    /// A label to read, and budgets that end before the agent is killed.
    pub fn validate(&self) -> Result<(), ConfigError> {
        bad_if(self.label.is_empty(), "checkpoint.label", "must not be empty")?;
        // The drain ends 1 s before the grace: the budget must fit in what is left.
        let room = self.grace.saturating_sub(Duration::from_secs(1));
        let shown = humantime::format_duration(room);
        let why = format!("must be above 0 and at most checkpoint.grace - 1s ({shown}), so the round ends before the agent exits and the agent exits before it is killed");
        for (key, budget) in [
            ("checkpoint.sigterm_budget", self.sigterm_budget),
            ("checkpoint.preemption_budget", self.preemption_budget),
        ] {
            bad_if(budget.is_zero() || budget > room, key, &why)?;
        }
        // (`maintenance_budget` above zero: `Config::validate_nonzero`.)
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use strum::VariantArray;

    use super::super::testing::assert_names_keys;
    use super::Signal;

    /// The signals' names are written nowhere (strum's `prefix` and `serialize_all` make them):
    /// pinned here, as `checkpoint.signal` and the `signal:NAME` method spell them.
    #[test]
    fn signal_names() {
        let names: Vec<&str> = Signal::VARIANTS.iter().map(|s| s.as_str()).collect();
        let expected =
            ["SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGWINCH", "SIGPWR"];
        assert_eq!(names, expected);
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[checkpoint]\non_sigterm = true", "checkpoint.on_sigterm"),
            ("[checkpoint]\non_sigterm = \"sometimes\"", "checkpoint.on_sigterm"),
            (
                "[checkpoint]\ngrace = \"1s\"\nsigterm_budget = \"900ms\"\npreemption_budget = \"900ms\"",
                "checkpoint.sigterm_budget",
            ),
            (
                "[checkpoint]\nmethod = \"carrier-pigeon\"",
                "checkpoint.method",
            ),
            (
                "[checkpoint]\nmethod = \"signal:SIGKILL\"",
                "checkpoint.method",
            ),
            ("[checkpoint]\nsignal = \"SIGSTOP\"", "checkpoint.signal"),
        ]);
    }
}
