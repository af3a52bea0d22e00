//! A coordinator that counts the requests it passes on: whoever holds it can tell whether
//! anything was read or written since a moment it noted. The agent cycle reads its whole node
//! in one round trip and hands each worker its part only while nothing has been asked of the
//! coordinator since (`crate::cycle::agent`): a worker evaluated after one that acted is read
//! again, on its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;

use super::{CoordError, Coordinator, Reply, Request};

pub struct Tally {
    inner: Arc<dyn Coordinator>,
    requests: AtomicU64,
}

impl Tally {
    pub fn new(inner: Arc<dyn Coordinator>) -> Tally {
        Tally { inner, requests: AtomicU64::new(0) }
    }

    /// How many requests were passed on so far (failed ones too).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl Coordinator for Tally {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn single_node(&self) -> bool {
        self.inner.single_node()
    }
    async fn execute(&self, request: Request) -> Result<Reply, CoordError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.execute(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::coord::memory::MemoryCoordinator;

    #[tokio::test]
    async fn every_request_is_counted_and_passed_on() {
        let inner: Arc<dyn Coordinator> =
            Arc::new(MemoryCoordinator::new(Arc::new(FakeClock::at(5_000))));
        let tally = Tally::new(inner.clone());
        assert!(tally.single_node());
        let coord: &dyn Coordinator = &tally;
        assert_eq!(coord.time().await.unwrap(), 5_000);
        coord.set("k", "v", std::time::Duration::from_secs(1)).await.unwrap();
        assert_eq!(tally.requests(), 2);
        assert_eq!(inner.get("k").await.unwrap().as_deref(), Some("v"));
    }
}
