//! The end-to-end rig shared by the suites that run the `vigil` binary (tests/e2e*.rs,
//! tests/podman.rs): the names one process under test runs with (its node, Redis key prefix,
//! worker label and worker id, the addresses of its metrics server and worker API), a directory for its config file,
//! the part of that config the suites share (the restart pipeline compressed from minutes to
//! seconds), and how they read the trail that `vigil explain` prints.

use std::path::PathBuf;

use super::real::{free_port, unique};

/// A suite's own config keys, added to [`Setup::write_config`]'s.
#[derive(Default)]
pub struct ConfigParts<'a> {
    /// Top-level keys.
    pub top: &'a str,
    /// More `[runtime]` keys.
    pub runtime: &'a str,
    /// More `[policy]` keys.
    pub policy: &'a str,
    /// Further tables, whole.
    pub tables: &'a str,
    /// The `[worker_api]` table, whole; empty: the worker API on [`Setup::worker_listen`]
    /// (loopback) without authentication, as a single-user host runs it.
    pub worker_api: &'a str,
    /// `runtime.call_timeout`; empty: 2s (a runtime that answers slower under a loaded CI
    /// machine — Podman's service — takes more).
    pub call_timeout: &'a str,
    /// `policy.confirm_after`; empty: 500ms.
    pub confirm_after: &'a str,
}

pub struct Setup {
    pub dir: tempfile::TempDir,
    pub node: String,
    pub prefix: String,
    pub label: String,
    pub worker: String,
    pub listen: String,
    /// The worker API's loopback address.
    pub worker_listen: String,
}

impl Setup {
    /// Fresh names, with Redis keys under a unique prefix starting with `prefix`.
    pub fn new(prefix: &str) -> Setup {
        Setup {
            dir: tempfile::tempdir().unwrap(),
            node: unique("node-"),
            prefix: unique(prefix),
            label: unique("vigil.test."),
            worker: unique("trainer-"),
            listen: format!("127.0.0.1:{}", free_port()),
            worker_listen: format!("127.0.0.1:{}", free_port()),
        }
    }

    /// A second agent process on the same node, watching the same worker: its own config
    /// directory and its own status-API port.
    pub fn second_process(&self) -> Setup {
        Setup {
            listen: format!("127.0.0.1:{}", free_port()),
            worker_listen: format!("127.0.0.1:{}", free_port()),
            dir: tempfile::tempdir().unwrap(),
            node: self.node.clone(),
            prefix: self.prefix.clone(),
            label: self.label.clone(),
            worker: self.worker.clone(),
        }
    }

    /// Write the agent's `vigil.toml`: these names, the restart pipeline compressed to seconds,
    /// and the suite's own keys; its path.
    pub fn write_config(&self, own: ConfigParts) -> PathBuf {
        let loopback_api =
            format!("[worker_api]\nlisten = \"{}\"\nauth = \"none\"\n", self.worker_listen);
        let worker_api =
            if own.worker_api.is_empty() { loopback_api.as_str() } else { own.worker_api };
        let text = format!(
            r#"node_name = "{node}"
poll_interval = "300ms"
{top}
[redis]
key_prefix = "{prefix}"
[server]
listen = "{listen}"
[runtime]
worker_label = "{label}"
{runtime}
log_timeout = "5s"
# NB: a stop grace longer than every runtime call's deadline: the default worker ignores SIGTERM,
# so a deadline shorter than the grace would cut every restart short (issue 16).
call_timeout = "{call_timeout}"
stop_grace = "3s"
restart_timeout = "15s"
[policy]
stale_after = "2s"
confirm_after = "{confirm_after}"
restart_delay = "2s"
{policy}
{worker_api}
{tables}"#,
            node = self.node,
            prefix = self.prefix,
            listen = self.listen,
            label = self.label,
            top = own.top,
            runtime = own.runtime,
            policy = own.policy,
            tables = own.tables,
            worker_api = worker_api,
            call_timeout = if own.call_timeout.is_empty() { "2s" } else { own.call_timeout },
            confirm_after = if own.confirm_after.is_empty() { "500ms" } else { own.confirm_after },
        );
        let path = self.dir.path().join("vigil.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `http://LISTEN{path}`, the agent's metrics and probes.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    /// `http://WORKER_LISTEN{path}`, the agent's worker API.
    pub fn worker_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.worker_listen)
    }

    /// GET `path` from the agent's metrics server.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::get(self.url(path)).await.unwrap()
    }

    /// The agent's `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.unwrap()
    }
}

/// How many lines of a `vigil explain` trail carry `decision` (its fourth column).
pub fn decisions(trail: &str, decision: &str) -> usize {
    trail.lines().filter(|l| l.split_whitespace().nth(3) == Some(decision)).count()
}

/// How many lines of `worker` (the second column) carry `decision`.
pub fn worker_decisions(trail: &str, worker: &str, decision: &str) -> usize {
    trail
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(worker))
        .filter(|l| l.split_whitespace().nth(3) == Some(decision))
        .count()
}
