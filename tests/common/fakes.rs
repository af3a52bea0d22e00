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
    /// Writes that fail once, unanswered (a Redis blip): the first SET NX or capped increment of
    /// a key that holds one of these fails, and that one is used up (`set:<part>`: a plain SET —
    /// a batch that sets the key — instead; `landed:<part>`: the write lands, its answer lost).
    pub blips: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Switchable {
    /// `Err`: the request fails unanswered; `Ok(true)`: it lands and its answer is lost.
    fn check(&self, request: &vigil::coord::Request) -> Result<bool, vigil::coord::CoordError> {
        use vigil::coord::Request;
        let unanswered = || vigil::coord::CoordError::Timeout {
            addr: "switchable".into(),
            timeout: Duration::from_secs(2),
        };
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(unanswered());
        }
        // A part `set:<part>` is a plain SET's only (a batch that sets the key).
        let (keys, set): (Vec<&String>, bool) = match request {
            Request::SetNx { key, .. } | Request::IncrCapped { key, .. } => (vec![key], false),
            Request::Batch(ops) => (
                ops.iter()
                    .filter_map(|op| match op {
                        vigil::coord::Op::Set { key, .. } => Some(key),
                        _ => None,
                    })
                    .collect(),
                true,
            ),
            _ => return Ok(false),
        };
        let mut blips = self.blips.lock().unwrap();
        let hit = |part: &String| {
            let part = part.strip_prefix("landed:").unwrap_or(part);
            let (only_set, part) = match part.strip_prefix("set:") {
                Some(p) => (true, p),
                None => (false, part),
            };
            set == only_set && keys.iter().any(|key| key.contains(part))
        };
        if let Some(i) = blips.iter().position(hit) {
            let part = blips.remove(i);
            return match part.starts_with("landed:") {
                true => Ok(true),
                false => Err(unanswered()),
            };
        }
        Ok(false)
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
        let landed = self.check(&request)?;
        let reply = self.inner.execute(request).await;
        match landed {
            true => Err(vigil::coord::CoordError::Timeout {
                addr: "switchable".into(),
                timeout: Duration::from_secs(2),
            }),
            false => reply,
        }
    }
}
