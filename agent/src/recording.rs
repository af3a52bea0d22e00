//! Recording adapters: an alert sink and a Node API that keep what they were given, for
//! `vigil demo` and the scenario tests (the HTTP-level behaviour is tested against the real
//! webhook receiver and the fake API server).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::alerts::{Alert, AlertError, AlertSink, Resolve};
use crate::kube::node::{EventType, NodeApi, NodeDesired, NodeError};

/// An alert sink that keeps every alert, and every resolve (worker, end).
#[derive(Default, Clone)]
pub struct RecordingSink(pub Arc<Mutex<Vec<Alert>>>, pub Arc<Mutex<Vec<(String, Resolve)>>>);

impl RecordingSink {
    /// The resolves the engine asked for, in order: (worker, end).
    pub fn resolved(&self) -> Vec<(String, Resolve)> {
        self.1.lock().unwrap().clone()
    }
}

#[cfg(any(test, feature = "bench"))]
impl RecordingSink {
    pub fn count(&self, kind: crate::alerts::AlertKind) -> usize {
        self.0.lock().unwrap().iter().filter(|a| a.kind == kind).count()
    }
    pub fn of(&self, kind: crate::alerts::AlertKind) -> Vec<Alert> {
        self.0.lock().unwrap().iter().filter(|a| a.kind == kind).cloned().collect()
    }
    pub fn kinds(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().iter().map(|a| a.kind.as_str()).collect()
    }
}

#[async_trait]
impl AlertSink for RecordingSink {
    async fn send(&self, alert: &Alert) -> Result<(), AlertError> {
        self.0.lock().unwrap().push(alert.clone());
        Ok(())
    }

    /// The workers with alerts here and no `Gone` since.
    fn open_workers(&self, node: &str) -> Vec<String> {
        let gone = self.resolved().into_iter().filter(|(_, e)| *e == Resolve::Gone);
        let gone: Vec<String> = gone.map(|(w, _)| w).collect();
        let alerts = self.0.lock().unwrap();
        let open = alerts.iter().filter(|a| a.node == node).filter_map(|a| a.worker.clone());
        open.filter(|w| !gone.contains(w)).collect::<BTreeSet<_>>().into_iter().collect()
    }

    async fn resolve(&self, _node: &str, worker: &str, end: Resolve) {
        self.1.lock().unwrap().push((worker.to_string(), end));
    }
}

/// A NodeApi that records what it was asked to do (the HTTP-level behaviour is tested against
/// the fake API server in tests/kube.rs).
#[derive(Default, Clone)]
pub struct RecordingNodeApi {
    pub(crate) desired: Arc<Mutex<Vec<NodeDesired>>>,
    pub(crate) events: Arc<Mutex<Vec<(String, String, EventType)>>>,
}

impl RecordingNodeApi {
    pub fn last(&self) -> NodeDesired {
        self.desired.lock().unwrap().last().cloned().unwrap_or_default()
    }
}

#[cfg(any(test, feature = "bench"))]
impl RecordingNodeApi {
    pub fn reasons(&self) -> Vec<String> {
        self.events.lock().unwrap().iter().map(|e| e.0.clone()).collect()
    }
}

#[async_trait]
impl NodeApi for RecordingNodeApi {
    async fn reconcile(&self, _node: &str, desired: &NodeDesired) -> Result<(), NodeError> {
        self.desired.lock().unwrap().push(desired.clone());
        Ok(())
    }
    async fn event(
        &self,
        _node: &str,
        reason: &str,
        message: &str,
        kind: EventType,
    ) -> Result<(), NodeError> {
        self.events.lock().unwrap().push((reason.to_string(), message.to_string(), kind));
        Ok(())
    }
}
