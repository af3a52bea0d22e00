//! Liveness of the agent loop, read by `/healthz`: the loop beats at every cycle and between
//! workers, and a wedged loop stops beating. And the standing warnings `/readyz` shows in its
//! detail (a source that runs but cannot do its job, e.g. a metadata server without the
//! maintenance key).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

/// Standing warnings by source: set while the problem lasts, cleared when it ends.
#[derive(Debug, Clone, Default)]
pub struct Warnings(Arc<std::sync::Mutex<BTreeMap<&'static str, String>>>);

impl Warnings {
    /// Set (`Some`) or clear (`None`) the warning of `source`; true when it changed.
    pub fn set(&self, source: &'static str, warning: Option<String>) -> bool {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match warning {
            Some(text) => w.insert(source, text.clone()).as_ref() != Some(&text),
            None => w.remove(source).is_some(),
        }
    }

    /// `source: warning` lines, by source.
    pub fn lines(&self) -> Vec<String> {
        let w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        w.iter().map(|(k, v)| format!("{k}: {v}")).collect()
    }
}

/// Liveness of the loop, read by `/healthz`, and the warnings `/readyz` shows.
#[derive(Default)]
pub struct Health {
    last_cycle: Mutex<Option<tokio::time::Instant>>,
    pub(crate) warnings: Warnings,
}

impl Health {
    pub(crate) async fn beat(&self) {
        *self.last_cycle.lock().await = Some(tokio::time::Instant::now());
    }
    /// True when a cycle finished within `max_age` (a wedged loop fails this).
    pub(crate) async fn alive(&self, max_age: Duration) -> bool {
        matches!(*self.last_cycle.lock().await, Some(t) if t.elapsed() <= max_age)
    }
}
