//! The container runtime: list opted-in workers, read their logs, restart one.
//!
//! Docker (and Podman, which serves the same API) through bollard; the simulated runtime of the
//! demo and the scenario tests (`sim`) implements the same trait.

pub mod docker;
pub mod sim;

pub use crate::model::container::Container;

use std::time::Duration;

use async_trait::async_trait;

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
