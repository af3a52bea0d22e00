//! In-process fakes for the deterministic scenario tests. The runtime, alert sink and Node API
//! fakes live in the library (`vigil::runtime::sim`, `vigil::recording`, shared with `vigil demo`); the switchable
//! coordinator (Redis "stopping" mid-incident) is test-only.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
#[allow(unused_imports)]
pub use vigil::recording::{RecordingNodeApi, RecordingSink};
#[allow(unused_imports)]
pub use vigil::runtime::sim::FakeRuntime;

/// A coordinator that can be switched off, as if Redis had stopped, and on again with its data.
pub struct Switchable {
    pub inner: Arc<dyn vigil::coord::Coordinator>,
    pub down: Arc<std::sync::atomic::AtomicBool>,
}

impl Switchable {
    fn check(&self) -> Result<(), vigil::coord::CoordError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(vigil::coord::CoordError::Timeout {
                addr: "switchable".into(),
                timeout: Duration::from_secs(2),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl vigil::coord::Coordinator for Switchable {
    fn describe(&self) -> String {
        "switchable".into()
    }
    async fn execute(
        &self,
        request: vigil::coord::Request,
    ) -> Result<vigil::coord::Reply, vigil::coord::CoordError> {
        self.check()?;
        self.inner.execute(request).await
    }
}
