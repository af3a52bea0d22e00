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
    /// Writes that fail once, unanswered (a Redis blip): the first SET NX or capped increment
    /// of a key that holds one of these fails, and that one is used up.
    pub blips: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Switchable {
    fn check(&self, request: &vigil::coord::Request) -> Result<(), vigil::coord::CoordError> {
        use vigil::coord::Request;
        let unanswered = || vigil::coord::CoordError::Timeout {
            addr: "switchable".into(),
            timeout: Duration::from_secs(2),
        };
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(unanswered());
        }
        let key = match request {
            Request::SetNx { key, .. } | Request::IncrCapped { key, .. } => key,
            _ => return Ok(()),
        };
        let mut blips = self.blips.lock().unwrap();
        if let Some(i) = blips.iter().position(|part| key.contains(part.as_str())) {
            blips.remove(i);
            return Err(unanswered());
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
        self.check(&request)?;
        self.inner.execute(request).await
    }
}
