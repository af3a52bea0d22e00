//! A configuration reloaded at SIGHUP, merged into the running one: keys that need a new
//! connection, a new listener or a new task keep their running values (and the log says which);
//! the rest take effect from the next cycle.

use tokio::sync::watch;

use crate::config::Config;

/// The new configuration from SIGHUP, if one arrived since the last look.
pub(crate) fn take(rx: &mut Option<watch::Receiver<Config>>) -> Option<Config> {
    let rx = rx.as_mut()?;
    rx.has_changed().unwrap_or(false).then(|| rx.borrow_and_update().clone())
}

/// `new` with the keys that cannot change without a restart set back to their values in `old`,
/// the kept keys named in the log. `None` (logged) when the result is not a valid
/// configuration: the running one stays.
pub(crate) fn merge(old: &Config, new: Config) -> Option<Config> {
    let mut merged = new;
    let mut kept = Vec::new();
    macro_rules! keep {
        ($($field:ident).+, $name:literal) => {
            if merged.$($field).+ != old.$($field).+ {
                merged.$($field).+ = old.$($field).+.clone();
                kept.push($name);
            }
        };
    }
    keep!(node_name, "node_name");
    keep!(redis, "redis.*");
    keep!(docker.host, "docker.host");
    keep!(runtime.kind, "runtime.kind");
    keep!(runtime.podman_socket, "runtime.podman_socket");
    keep!(runtime.cri_socket, "runtime.cri_socket");
    keep!(runtime.worker_label, "runtime.worker_label");
    keep!(runtime.allow_pod_replacement, "runtime.allow_pod_replacement");
    keep!(runtime.pod_resources_socket, "runtime.pod_resources_socket");
    keep!(server, "server.*");
    // The worker API's listeners, and the TokenReview client and cache behind them.
    keep!(worker_api, "worker_api.*");
    keep!(alerts, "alerts.*");
    keep!(log, "log.*");
    keep!(metadata, "metadata.*");
    keep!(kubernetes, "kubernetes.*");
    keep!(fleet, "fleet.*");
    keep!(checkpoint, "checkpoint.*");
    keep!(opportunistic, "opportunistic.*");
    keep!(gpu, "gpu.*");
    // The TPU monitor's task, and the node controller's taint rule, take it at start-up.
    keep!(tpu, "tpu.*");
    // The node controller shows the pace's condition and taint from its start-up config.
    keep!(gang.pace, "gang.pace.*");
    // The health check's age limit and the controller's tick were sized from it.
    keep!(poll_interval, "poll_interval");
    // The runtime client's own timeout was sized from it at start-up.
    keep!(runtime.restart_timeout, "runtime.restart_timeout");
    // The runtime clients bound their calls with it; kept also so that the restart timeout's
    // rule checks the running value.
    keep!(runtime.call_timeout, "runtime.call_timeout");
    if let Err(e) = merged.validate() {
        tracing::error!(error = %e, "config reload refused: the running values of the keys above make the new file invalid; keeping the running config");
        return None;
    }
    if !kept.is_empty() {
        tracing::warn!(keys = %kept.join(", "), "config reloaded, but these keys need a restart of the agent to change; their running values are kept");
    }
    Some(merged)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn keys_that_need_a_restart_keep_their_running_values() {
        let old = Config { node_name: "n1".into(), ..Config::default() };
        let mut new = old.clone();
        new.node_name = "another".into();
        new.poll_interval = old.poll_interval * 2;
        new.dry_run = !old.dry_run;
        new.policy.stale_after = old.policy.stale_after + Duration::from_secs(60);
        new.tpu.taint_on_failure = !old.tpu.taint_on_failure;
        new.worker_api.audience = "another".into();
        new.runtime.call_timeout = old.runtime.call_timeout + Duration::from_secs(5);
        new.runtime.podman_socket = "/srv/podman/api.sock".into();
        let merged = merge(&old, new.clone()).expect("valid");
        assert_eq!(merged.node_name, old.node_name);
        assert_eq!(merged.poll_interval, old.poll_interval);
        // Built at start-up: the TPU monitor and taint, the worker API, the runtime clients.
        assert_eq!(merged.tpu, old.tpu);
        assert_eq!(merged.worker_api, old.worker_api);
        assert_eq!(merged.runtime.call_timeout, old.runtime.call_timeout);
        assert_eq!(merged.runtime.podman_socket, old.runtime.podman_socket);
        assert_eq!(merged.dry_run, new.dry_run, "applied at once");
        assert_eq!(merged.policy.stale_after, new.policy.stale_after);
    }

    /// The restart timeout's rule is checked against the call timeout the runtime clients run
    /// with, not the file's new one.
    #[test]
    fn a_reload_is_checked_against_the_running_call_timeout() {
        let old = Config { node_name: "n1".into(), ..Config::default() };
        let mut new = old.clone();
        // 85s + 4s < 90s: valid alone; 85s + the running 10s is not below 90s.
        new.runtime.stop_grace = Duration::from_secs(85);
        new.runtime.call_timeout = Duration::from_secs(4);
        assert!(new.validate().is_ok());
        assert!(merge(&old, new).is_none());
    }

    #[test]
    fn an_invalid_reload_keeps_the_running_config() {
        let old = Config { node_name: "n1".into(), ..Config::default() };
        let mut new = old.clone();
        new.policy.stale_after = Duration::ZERO;
        assert!(merge(&old, new).is_none());
    }
}
