//! In-process fakes for the deterministic scenario tests: a container runtime with scriptable
//! failures and an alert sink that records what it was given. They implement the same traits as
//! the production adapters, so the agent under test runs its real pipeline.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use vigil::actions::alert::{Alert, AlertError, AlertKind, AlertSink};
use vigil::runtime::{Container, ContainerRuntime, RuntimeError};

type Hook = Box<dyn Fn() + Send + Sync>;
type SignalHook = Box<dyn Fn(&str) + Send + Sync>;

#[derive(Default)]
struct State {
    containers: HashMap<String, Container>,
    restarts: HashMap<String, usize>,
    generation: u64,
    fail_logs: bool,
    fail_restarts: usize,
    down: bool,
    signals: Vec<(String, String)>,
    lose_restart_replies: usize,
}

/// A container runtime in memory. A restart changes the container's start time, as Docker does.
#[derive(Default, Clone)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    on_logs: Arc<Mutex<Option<Hook>>>,
    on_signal: Arc<Mutex<Option<SignalHook>>>,
}

impl FakeRuntime {
    pub fn add(&self, id: &str, worker: &str) {
        let mut s = self.state.lock().unwrap();
        s.generation += 1;
        let started_at = format!("gen-{}", s.generation);
        s.containers.insert(
            id.to_string(),
            Container {
                id: id.to_string(),
                name: format!("name-{id}"),
                worker: worker.to_string(),
                started_at,
                running: true,
                checkpoint: None,
            },
        );
    }
    pub fn restarts(&self, id: &str) -> usize {
        *self.state.lock().unwrap().restarts.get(id).unwrap_or(&0)
    }
    pub fn started_at(&self, id: &str) -> String {
        self.state.lock().unwrap().containers[id].started_at.clone()
    }
    pub fn fail_logs(&self, fail: bool) {
        self.state.lock().unwrap().fail_logs = fail;
    }
    pub fn fail_next_restarts(&self, n: usize) {
        self.state.lock().unwrap().fail_restarts = n;
    }
    /// The next `n` restarts happen, but the call reports an error (a lost reply).
    pub fn lose_next_restart_replies(&self, n: usize) {
        self.state.lock().unwrap().lose_restart_replies = n;
    }
    pub fn set_down(&self, down: bool) {
        self.state.lock().unwrap().down = down;
    }
    /// Run `hook` while logs are being collected (between decision and command).
    pub fn on_logs(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.on_logs.lock().unwrap() = Some(Box::new(hook));
    }
    /// Signals delivered so far: (container id, signal).
    pub fn signals(&self) -> Vec<(String, String)> {
        self.state.lock().unwrap().signals.clone()
    }
    /// Run `hook(container_id)` when a signal is delivered (a worker that acknowledges).
    pub fn on_signal(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        *self.on_signal.lock().unwrap() = Some(Box::new(hook));
    }
    /// Set a container's checkpoint-method label.
    pub fn set_checkpoint_label(&self, id: &str, value: &str) {
        if let Some(c) = self.state.lock().unwrap().containers.get_mut(id) {
            c.checkpoint = Some(value.to_string());
        }
    }
    fn check_up(&self) -> Result<(), RuntimeError> {
        if self.state.lock().unwrap().down {
            return Err(RuntimeError::Unreachable {
                addr: "fake".into(),
                detail: "connection refused".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl ContainerRuntime for FakeRuntime {
    fn describe(&self) -> String {
        "fake runtime".into()
    }
    async fn list_workers(&self) -> Result<Vec<Container>, RuntimeError> {
        self.check_up()?;
        let mut v: Vec<_> = self
            .state
            .lock()
            .unwrap()
            .containers
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(v)
    }
    async fn inspect(&self, id: &str) -> Result<Option<Container>, RuntimeError> {
        self.check_up()?;
        Ok(self.state.lock().unwrap().containers.get(id).cloned())
    }
    async fn logs(&self, id: &str, lines: usize) -> Result<String, RuntimeError> {
        self.check_up()?;
        if let Some(h) = self.on_logs.lock().unwrap().as_ref() {
            h();
        }
        if self.state.lock().unwrap().fail_logs {
            return Err(RuntimeError::Refused {
                addr: "fake".into(),
                op: "logs",
                container: id.into(),
                detail: "log driver none".into(),
            });
        }
        Ok(format!("last {lines} lines of {id}\nstep 41\nstep 42"))
    }
    async fn restart(&self, id: &str, _grace: Duration) -> Result<(), RuntimeError> {
        self.check_up()?;
        let mut s = self.state.lock().unwrap();
        if s.fail_restarts > 0 {
            s.fail_restarts -= 1;
            return Err(RuntimeError::Refused {
                addr: "fake".into(),
                op: "restart",
                container: id.into(),
                detail: "cannot kill container: device or resource busy".into(),
            });
        }
        s.generation += 1;
        let generation = s.generation;
        if let Some(c) = s.containers.get_mut(id) {
            c.started_at = format!("gen-{generation}");
        }
        *s.restarts.entry(id.to_string()).or_default() += 1;
        if s.lose_restart_replies > 0 {
            s.lose_restart_replies -= 1;
            return Err(RuntimeError::Timeout {
                op: "restart",
                container: id.into(),
                timeout: Duration::from_secs(90),
            });
        }
        Ok(())
    }
    async fn kill(&self, id: &str, signal: &str) -> Result<(), RuntimeError> {
        self.check_up()?;
        self.state
            .lock()
            .unwrap()
            .signals
            .push((id.to_string(), signal.to_string()));
        if let Some(h) = self.on_signal.lock().unwrap().as_ref() {
            h(id);
        }
        Ok(())
    }
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.check_up()
    }
}

/// An alert sink that keeps every alert.
#[derive(Default, Clone)]
pub struct RecordingSink(pub Arc<Mutex<Vec<Alert>>>);

impl RecordingSink {
    pub fn count(&self, kind: AlertKind) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.kind == kind)
            .count()
    }
    pub fn of(&self, kind: AlertKind) -> Vec<Alert> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.kind == kind)
            .cloned()
            .collect()
    }
    pub fn kinds(&self) -> Vec<&'static str> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|a| a.kind.as_str())
            .collect()
    }
}

#[async_trait]
impl AlertSink for RecordingSink {
    async fn send(&self, alert: &Alert) -> Result<(), AlertError> {
        self.0.lock().unwrap().push(alert.clone());
        Ok(())
    }
}

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
    fn single_node(&self) -> bool {
        false
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
    async fn set(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<(), vigil::coord::CoordError> {
        delegate!(self, self.inner.set(key, value, ttl))
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
    async fn counter(&self, key: &str) -> Result<u64, vigil::coord::CoordError> {
        delegate!(self, self.inner.counter(key))
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
    async fn hset(
        &self,
        key: &str,
        fields: &[(String, String)],
    ) -> Result<(), vigil::coord::CoordError> {
        delegate!(self, self.inner.hset(key, fields))
    }
    async fn append(
        &self,
        key: &str,
        fields: &[(String, String)],
        max_len: usize,
    ) -> Result<(), vigil::coord::CoordError> {
        delegate!(self, self.inner.append(key, fields, max_len))
    }
    async fn hset_ttl(
        &self,
        key: &str,
        fields: &[(String, String)],
        ttl: Duration,
    ) -> Result<(), vigil::coord::CoordError> {
        delegate!(self, self.inner.hset_ttl(key, fields, ttl))
    }
    async fn index_touch(
        &self,
        key: &str,
        member: &str,
        score: i64,
        prune_before: i64,
    ) -> Result<(), vigil::coord::CoordError> {
        delegate!(
            self,
            self.inner.index_touch(key, member, score, prune_before)
        )
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
}

/// A NodeApi that records what it was asked to do (the HTTP-level behaviour is tested against
/// the fake API server in tests/kube.rs).
#[derive(Default, Clone)]
pub struct RecordingNodeApi {
    pub desired: Arc<Mutex<Vec<vigil::actions::node::NodeDesired>>>,
    pub events: Arc<Mutex<Vec<(String, String, vigil::actions::node::EventType)>>>,
}

impl RecordingNodeApi {
    pub fn last(&self) -> vigil::actions::node::NodeDesired {
        self.desired
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    }
    pub fn reasons(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.0.clone())
            .collect()
    }
}

#[async_trait]
impl vigil::actions::node::NodeApi for RecordingNodeApi {
    async fn reconcile(
        &self,
        _node: &str,
        desired: &vigil::actions::node::NodeDesired,
    ) -> Result<(), vigil::actions::node::NodeError> {
        self.desired.lock().unwrap().push(desired.clone());
        Ok(())
    }
    async fn event(
        &self,
        _node: &str,
        reason: &str,
        message: &str,
        kind: vigil::actions::node::EventType,
    ) -> Result<(), vigil::actions::node::NodeError> {
        self.events
            .lock()
            .unwrap()
            .push((reason.to_string(), message.to_string(), kind));
        Ok(())
    }
}
