//! In-process fakes for the deterministic scenario tests. The runtime, alert sink and Node API
//! fakes live in the library (`vigil::runtime::sim`, `vigil::actions::recording`, shared with `vigil demo`); the switchable
//! coordinator (Redis "stopping" mid-incident) is test-only.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
#[allow(unused_imports)]
pub use vigil::actions::recording::{RecordingNodeApi, RecordingSink};
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

macro_rules! delegate {
    ($self:ident, $call:expr) => {{
        $self.check()?;
        $call.await
    }};
}

#[async_trait]
impl vigil::coord::Coordinator for Switchable {
    fn describe(&self) -> String {
        "switchable".into()
    }
    async fn time(&self) -> Result<i64, vigil::coord::CoordError> {
        delegate!(self, self.inner.time())
    }
    async fn get_many(
        &self,
        keys: &[String],
    ) -> Result<Vec<Option<String>>, vigil::coord::CoordError> {
        delegate!(self, self.inner.get_many(keys))
    }
    async fn set_nx(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<bool, vigil::coord::CoordError> {
        delegate!(self, self.inner.set_nx(key, value, ttl))
    }
    async fn del(&self, keys: &[String]) -> Result<(), vigil::coord::CoordError> {
        delegate!(self, self.inner.del(keys))
    }
    async fn owner_ttl(
        &self,
        key: &str,
        token: &str,
    ) -> Result<Option<i64>, vigil::coord::CoordError> {
        delegate!(self, self.inner.owner_ttl(key, token))
    }
    async fn del_if_owner(&self, key: &str, token: &str) -> Result<bool, vigil::coord::CoordError> {
        delegate!(self, self.inner.del_if_owner(key, token))
    }
    async fn incr_capped(
        &self,
        key: &str,
        cap: u64,
        ttl: Duration,
    ) -> Result<Option<u64>, vigil::coord::CoordError> {
        delegate!(self, self.inner.incr_capped(key, cap, ttl))
    }
    async fn decr(&self, key: &str) -> Result<(), vigil::coord::CoordError> {
        delegate!(self, self.inner.decr(key))
    }
    async fn hgetall(
        &self,
        key: &str,
    ) -> Result<HashMap<String, String>, vigil::coord::CoordError> {
        delegate!(self, self.inner.hgetall(key))
    }
    async fn append(
        &self,
        key: &str,
        fields: &[(String, String)],
        max_len: usize,
    ) -> Result<(), vigil::coord::CoordError> {
        delegate!(self, self.inner.append(key, fields, max_len))
    }
    async fn index_members(
        &self,
        key: &str,
    ) -> Result<Vec<(String, i64)>, vigil::coord::CoordError> {
        delegate!(self, self.inner.index_members(key))
    }
    async fn read_recent(
        &self,
        key: &str,
        count: usize,
    ) -> Result<Vec<vigil::coord::TrailEntry>, vigil::coord::CoordError> {
        delegate!(self, self.inner.read_recent(key, count))
    }
    async fn batch(&self, ops: &[vigil::coord::Op]) -> Result<Vec<u64>, vigil::coord::CoordError> {
        delegate!(self, self.inner.batch(ops))
    }
}
