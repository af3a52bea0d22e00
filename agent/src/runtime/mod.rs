//! The container runtime: list opted-in workers, read their logs, restart one.
//!
//! Docker (and Podman, which serves the same API) through bollard today; a Kubernetes
//! implementation (delete the pod) fits behind the same trait without touching the policy.

pub mod docker;

use std::time::Duration;

use async_trait::async_trait;

/// One opted-in worker container as the runtime sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub name: String,
    /// The worker id: the value of the opt-in label.
    pub worker: String,
    /// When the current incarnation started; a restart changes it (compare-and-restart key).
    pub started_at: String,
    pub running: bool,
    /// The value of the checkpoint-method label, when the container has one.
    pub checkpoint: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("docker at {addr} is unreachable: {detail}")]
    Unreachable { addr: String, detail: String },
    #[error("docker at {addr} refused `{op}` on container {container}: {detail}")]
    Refused {
        addr: String,
        op: &'static str,
        container: String,
        detail: String,
    },
    #[error("`{op}` on container {container} did not finish within {timeout:?}")]
    Timeout {
        op: &'static str,
        container: String,
        timeout: Duration,
    },
}

#[async_trait]
pub trait ContainerRuntime: Send + Sync {
    /// Where the runtime lives, for logs and alerts.
    fn describe(&self) -> String;
    /// Running containers that carry the opt-in label; nothing else is ever returned.
    async fn list_workers(&self) -> Result<Vec<Container>, RuntimeError>;
    /// The container as it is now; `None` when it no longer exists.
    async fn inspect(&self, id: &str) -> Result<Option<Container>, RuntimeError>;
    /// The last `lines` lines of its output (stdout and stderr interleaved).
    async fn logs(&self, id: &str, lines: usize) -> Result<String, RuntimeError>;
    /// Restart it: SIGTERM, wait `stop_grace`, SIGKILL, start.
    async fn restart(&self, id: &str, stop_grace: Duration) -> Result<(), RuntimeError>;
    /// Send a signal (e.g. `SIGUSR1`) to the container's main process: a checkpoint request.
    async fn kill(&self, id: &str, signal: &str) -> Result<(), RuntimeError>;
    /// Cheap liveness check for `/readyz`.
    async fn ping(&self) -> Result<(), RuntimeError>;
}
