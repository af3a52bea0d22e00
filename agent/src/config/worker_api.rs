//! `[worker_api]`: the listeners through which workers write their own status record. Off unless
//! configured, and separate from `[server]` (metrics and probes, read-only), so that the port
//! Prometheus scrapes never takes a write. Every write is authenticated as the one worker it
//! concerns (see `crate::worker_api::policy`); the one exception, `auth = "none"`, is refused
//! anywhere but a loopback address.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, bad_if, ConfigError};

/// The longest a TokenReview's answer may be reused: a revoked token (its pod deleted) stops
/// working within this bound.
pub(crate) const MAX_REVIEW_CACHE: Duration = Duration::from_secs(600);

/// How a write on the TCP listener proves who sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum WorkerAuth {
    /// A projected ServiceAccount token (audience `worker_api.audience`) bound to the worker's
    /// pod, checked with a TokenReview.
    Kubernetes,
    /// No proof at all: accepted on a loopback address only (a single-user host, a demo).
    None,
}

as_str!(pub WorkerAuth);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerApiConfig {
    /// TCP address of the worker write API; empty (the default) serves none.
    #[serde(with = "super::server::listen")]
    pub(crate) listen: Option<SocketAddr>,
    /// How a write on `listen` is authenticated: `kubernetes` or, on loopback only, `none`.
    #[educe(Default(expression = WorkerAuth::Kubernetes))]
    pub(crate) auth: WorkerAuth,
    /// Unix socket of the worker write API for workers in containers of this host; empty (the
    /// default) serves none. A write is accepted only from the container of the worker it names
    /// (the peer's cgroup, proven against the container's init process). Mount its directory,
    /// read-only, into the workers; the directory must be writable by its owner (root or the
    /// agent's user) only.
    pub(crate) socket: PathBuf,
    /// The audience a worker's projected token must be minted for.
    #[educe(Default(expression = "vigil".into()))]
    pub(crate) audience: String,
    /// How long a TokenReview's answer is reused (at most 10m).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(60)))]
    pub(crate) review_cache: Duration,
}

impl WorkerApiConfig {
    /// No unauthenticated write off loopback; a bounded review cache; an audience.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let open = self.listen.filter(|a| self.auth == WorkerAuth::None && !a.ip().is_loopback());
        if let Some(addr) = open {
            let why = format!(
                "is \"none\" while worker_api.listen is {addr}, which is not a loopback address: \
                 anyone who can reach it could keep a hung worker looking healthy or push a healthy \
                 one into a restart. Use auth = \"kubernetes\" (projected ServiceAccount tokens), \
                 listen on 127.0.0.1, or serve containers through worker_api.socket"
            );
            return bad("worker_api.auth", why);
        }
        bad_if(self.audience.trim().is_empty(), "worker_api.audience", "must not be empty")?;
        let cache = self.review_cache;
        let why = "must be above zero and at most 10m (a revoked token must stop working soon)";
        bad_if(cache.is_zero() || cache > MAX_REVIEW_CACHE, "worker_api.review_cache", why)?;
        let relative = !self.socket.as_os_str().is_empty() && !self.socket.is_absolute();
        bad_if(relative, "worker_api.socket", "must be an absolute path, or empty")
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, parse};
    use super::WorkerAuth;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[worker_api]\nlisten = \"nope\"", "worker_api.listen"),
            ("[worker_api]\nlisten = \"0.0.0.0:9465\"\nauth = \"none\"", "worker_api.auth"),
            ("[worker_api]\nlisten = \"10.0.0.7:9465\"\nauth = \"none\"", "worker_api.auth"),
            ("[worker_api]\nauth = \"maybe\"", "worker_api.auth"),
            ("[worker_api]\naudience = \" \"", "worker_api.audience"),
            ("[worker_api]\nreview_cache = \"1h\"", "worker_api.review_cache"),
            ("[worker_api]\nreview_cache = \"0s\"", "worker_api.review_cache"),
            ("[worker_api]\nsocket = \"run/w.sock\"", "worker_api.socket"),
        ]);
    }

    #[test]
    fn off_by_default_and_unauthenticated_only_on_loopback() {
        let c = parse("").unwrap().worker_api;
        assert!(c.listen.is_none() && c.socket.as_os_str().is_empty());
        assert_eq!(c.auth, WorkerAuth::Kubernetes);
        let c = parse("[worker_api]\nlisten = \"127.0.0.1:9465\"\nauth = \"none\"\n")
            .unwrap()
            .worker_api;
        assert!(c.listen.is_some());
        assert!(parse("[worker_api]\nlisten = \"[::1]:9465\"\nauth = \"none\"\n").is_ok());
        let k8s = "[kubernetes]\nenabled = \"on\"\n";
        assert!(parse(&format!("{k8s}[worker_api]\nlisten = \"0.0.0.0:9465\"\n")).is_ok());
        // Tokens need an API server to review them.
        assert_names_keys(&[("[worker_api]\nlisten = \"0.0.0.0:9465\"", "worker_api.auth")]);
    }
}
