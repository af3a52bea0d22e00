//! Liveness of the agent loop, read by `/healthz`: the loop beats at every cycle and between
//! workers, and a wedged loop stops beating.

use std::time::Duration;

use tokio::sync::Mutex;

/// Liveness of the loop, read by `/healthz`.
#[derive(Default)]
pub struct Health {
    last_cycle: Mutex<Option<tokio::time::Instant>>,
}

impl Health {
    pub async fn beat(&self) {
        *self.last_cycle.lock().await = Some(tokio::time::Instant::now());
    }
    /// True when a cycle finished within `max_age` (a wedged loop fails this).
    pub async fn alive(&self, max_age: Duration) -> bool {
        matches!(*self.last_cycle.lock().await, Some(t) if t.elapsed() <= max_age)
    }
}
