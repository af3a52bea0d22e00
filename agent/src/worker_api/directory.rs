//! Which container carries a worker: the one question the worker API asks of the container
//! runtime, answered here for the runtime (so the arrow runs from the feature down).

use std::sync::Arc;

use crate::runtime::container::Container;
use crate::runtime::RuntimeError;

/// The opted-in worker containers on this node now. The worker API asks only this of the runtime
/// (implemented here for the runtime, so the arrow between the two runs one way: from the
/// feature down to the infrastructure).
#[async_trait::async_trait]
pub(crate) trait WorkerDirectory: Send + Sync {
    async fn workers(&self) -> Result<Vec<Container>, RuntimeError>;
    /// The host pid of the process the runtime started in `container`; `None` when it runs
    /// none (or the runtime cannot say).
    async fn init_pid(&self, container: &str) -> Result<Option<i32>, RuntimeError>;
}

/// The worker API looks up which container carries a worker through [`WorkerDirectory`].
#[async_trait::async_trait]
impl WorkerDirectory for Arc<dyn crate::runtime::ContainerRuntime> {
    async fn workers(&self) -> Result<Vec<Container>, RuntimeError> {
        self.list_workers().await
    }

    async fn init_pid(&self, container: &str) -> Result<Option<i32>, RuntimeError> {
        crate::runtime::ContainerRuntime::init_pid(&**self, container).await
    }
}
