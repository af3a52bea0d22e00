//! The simulated container runtime: containers in memory, with scriptable failures. `vigil demo`
//! replays the seed's night with it (and the recording sinks of `crate::recording`), and
//! the scenario tests drive the real pipeline through it. It implements the same trait as the
//! Docker adapter, so everything above it is the real code.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::runtime::{Container, ContainerRuntime, Result, RuntimeError};
use crate::vocab::workload::{Remediation, Stops};

type Hook = Box<dyn Fn() + Send + Sync>;
/// A hook told which container.
type ContainerHook = Box<dyn Fn(&str) + Send + Sync>;

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
    /// Restarts after which the container exits at once (a crash on start).
    exit_after_restarts: usize,
    /// Containers without the opt-in label: inspectable, never listed.
    unlabelled: std::collections::HashSet<String>,
    /// How each container's restart goes, where a test says (else in place).
    remediations: HashMap<String, Remediation>,
    /// Containers stopped for their controller (`fail`), in order: (id, grace, whole pod).
    failed: Vec<(String, Duration, bool)>,
}

/// A container runtime in memory. A restart changes the container's start time, as Docker does.
#[derive(Default, Clone)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    on_logs: Arc<Mutex<Option<Hook>>>,
    on_restart: Arc<Mutex<Option<ContainerHook>>>,
    on_signal: Arc<Mutex<Option<ContainerHook>>>,
}

impl FakeRuntime {
    pub fn add(&self, id: &str, worker: &str) {
        let mut s = self.state.lock().unwrap();
        s.generation += 1;
        let c = Container {
            id: id.to_string(),
            name: format!("name-{id}"),
            worker: worker.to_string(),
            started_at: format!("gen-{}", s.generation),
            running: true,
            ..Default::default()
        };
        s.containers.insert(id.to_string(), c);
    }
    pub fn restarts(&self, id: &str) -> usize {
        *self.state.lock().unwrap().restarts.get(id).unwrap_or(&0)
    }
    fn check_up(&self) -> Result<()> {
        if self.state.lock().unwrap().down {
            return Err(RuntimeError::unreachable(self, "connection refused"));
        }
        Ok(())
    }
}

/// The tests' hooks: scripted failures, external changes, what was done (`vigil demo` uses none).
#[cfg(any(test, feature = "bench"))]
impl FakeRuntime {
    /// How `id`'s restart goes from now on (`ContainerRuntime::remediation`).
    pub fn set_remediation(&self, id: &str, r: Remediation) {
        let mut s = self.state.lock().unwrap();
        s.remediations.insert(id.to_string(), r);
    }
    /// Say when `id`'s current incarnation started, in a form the runtimes use (e.g. RFC 3339):
    /// the fake's own `gen-N` reads as a start the runtime does not say.
    pub fn set_started_at(&self, id: &str, value: &str) {
        self.with(id, |c| c.started_at = value.to_string());
    }
    /// The containers stopped for their controller so far, in order.
    pub fn failed(&self) -> Vec<String> {
        let s = self.state.lock().unwrap();
        s.failed.iter().map(|f| f.0.clone()).collect()
    }
    /// How each was stopped: (id, stop grace, every container of its pod).
    pub fn fail_calls(&self) -> Vec<(String, Duration, bool)> {
        self.state.lock().unwrap().failed.clone()
    }
    /// A container without the opt-in label (a sidecar, someone's shell): never a worker.
    pub fn add_unlabelled(&self, id: &str) {
        self.add(id, "-");
        self.state.lock().unwrap().unlabelled.insert(id.to_string());
    }
    /// Whether `id` carries the opt-in label.
    pub fn labelled(&self, id: &str) -> bool {
        !self.state.lock().unwrap().unlabelled.contains(id)
    }
    /// The container as it is now.
    pub fn container(&self, id: &str) -> Option<Container> {
        self.state.lock().unwrap().containers.get(id).cloned()
    }
    /// Someone else's restart (`docker restart`, the restart policy): a new start time.
    pub fn restart_externally(&self, id: &str) {
        let mut s = self.state.lock().unwrap();
        s.generation += 1;
        let started_at = format!("gen-{}", s.generation);
        if let Some(c) = s.containers.get_mut(id) {
            c.started_at = started_at;
            c.running = true;
            c.paused = false;
        }
    }
    /// `docker stop` a container (it is still listed, exited).
    pub fn stop(&self, id: &str) {
        self.with(id, |c| (c.running, c.paused) = (false, false));
    }
    /// `docker rm` a container: it is no longer listed.
    pub fn remove(&self, id: &str) {
        self.state.lock().unwrap().containers.remove(id);
    }
    /// `docker pause` (or unpause) a container.
    pub fn set_paused(&self, id: &str, paused: bool) {
        self.with(id, |c| (c.paused, c.running) = (paused, !paused));
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
    /// After each of the next `n` restarts the container exits at once (it crashes on start).
    pub fn exit_after_next_restarts(&self, n: usize) {
        self.state.lock().unwrap().exit_after_restarts = n;
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
    /// Run `hook(container_id)` when a restart begins, before the container restarts (a slow
    /// runtime's window: the old incarnation still runs).
    pub fn on_restart(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        *self.on_restart.lock().unwrap() = Some(Box::new(hook));
    }
    /// Signals delivered so far: (container id, signal).
    pub fn signals(&self) -> Vec<(String, String)> {
        self.state.lock().unwrap().signals.clone()
    }
    /// Run `hook(container_id)` when a signal is delivered (a worker that acknowledges).
    pub fn on_signal(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        *self.on_signal.lock().unwrap() = Some(Box::new(hook));
    }
    /// Set the GPUs a container sees.
    pub fn set_gpus(&self, id: &str, gpus: &[&str]) {
        self.with(id, |c| c.gpus = Some(gpus.iter().map(|g| g.to_string()).collect()));
    }
    /// Place a container in a Kubernetes pod (as a runtime under the kubelet reports it).
    pub fn set_kube_pod(&self, id: &str, namespace: &str, pod: &str) {
        let identity = crate::runtime::container::PodIdentity {
            namespace: namespace.into(),
            name: pod.into(),
            uid: format!("uid-{pod}"),
        };
        self.with(id, |c| c.kube_pod = Some(identity));
    }
    /// Give a container the pod labels of a job controller: `labels` as the pod in `namespace`
    /// carries them (the gang comes from them as on a CRI node).
    pub fn set_pod_labels(&self, id: &str, namespace: &str, labels: &[(&str, &str)]) {
        let labels: std::collections::HashMap<String, String> =
            labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let gang = crate::runtime::container::gang_of_pod(
            Some(namespace),
            &labels,
            &Default::default(),
            "vigil.worker",
        );
        self.with(id, |c| c.gang = gang);
    }
    /// Set a container's checkpoint-method label.
    pub fn set_checkpoint_label(&self, id: &str, value: &str) {
        self.with(id, |c| c.checkpoint = Some(value.into()));
    }
    /// Change container `id`, if there is one.
    fn with(&self, id: &str, f: impl FnOnce(&mut Container)) {
        if let Some(c) = self.state.lock().unwrap().containers.get_mut(id) {
            f(c);
        }
    }
}

#[async_trait]
impl ContainerRuntime for FakeRuntime {
    fn describe(&self) -> String {
        "fake runtime".into()
    }
    async fn list_workers(&self) -> Result<Vec<Container>> {
        self.check_up()?;
        let s = self.state.lock().unwrap();
        let mut v: Vec<_> =
            s.containers.values().filter(|c| !s.unlabelled.contains(&c.id)).cloned().collect();
        drop(s);
        v.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(v)
    }
    async fn inspect(&self, id: &str) -> Result<Option<Container>> {
        self.check_up()?;
        Ok(self.state.lock().unwrap().containers.get(id).cloned())
    }
    async fn logs(&self, id: &str, lines: usize) -> Result<String> {
        self.check_up()?;
        self.on_logs.lock().unwrap().iter().for_each(|h| h());
        if self.state.lock().unwrap().fail_logs {
            return Err(RuntimeError::refused(self, "logs", id, "log driver none"));
        }
        Ok(format!("last {lines} lines of {id}\nstep 41\nstep 42"))
    }
    async fn restart(&self, target: &Container, _grace: Duration) -> Result<()> {
        let id = target.id.as_str();
        self.check_up()?;
        self.on_restart.lock().unwrap().iter().for_each(|h| h(id));
        let mut s = self.state.lock().unwrap();
        if s.fail_restarts > 0 {
            s.fail_restarts -= 1;
            let busy = "cannot kill container: device or resource busy";
            return Err(RuntimeError::refused(self, "restart", id, busy));
        }
        s.generation += 1;
        let generation = s.generation;
        // Like `docker restart`: whatever state it was in, it runs afterwards.
        let exits = s.exit_after_restarts > 0;
        s.exit_after_restarts = s.exit_after_restarts.saturating_sub(1);
        if let Some(c) = s.containers.get_mut(id) {
            c.started_at = format!("gen-{generation}");
            (c.running, c.paused) = (!exits, false);
        }
        *s.restarts.entry(id.to_string()).or_default() += 1;
        if s.lose_restart_replies > 0 {
            s.lose_restart_replies -= 1;
            let timeout = Duration::from_secs(90);
            return Err(RuntimeError::Timeout { op: "restart", container: id.into(), timeout });
        }
        Ok(())
    }
    async fn remediation(&self, c: &Container, _stops: Stops) -> Remediation {
        self.state.lock().unwrap().remediations.get(&c.id).cloned().unwrap_or(Remediation::IN_PLACE)
    }
    /// A stop: the container ends, and nothing starts it again (its controller would).
    async fn fail(&self, c: &Container, grace: Duration, whole_pod: bool) -> Result<()> {
        self.check_up()?;
        let mut s = self.state.lock().unwrap();
        if let Some(x) = s.containers.get_mut(&c.id) {
            x.running = false;
        }
        s.failed.push((c.id.clone(), grace, whole_pod));
        Ok(())
    }
    async fn kill(&self, id: &str, signal: &str) -> Result<()> {
        self.check_up()?;
        self.state.lock().unwrap().signals.push((id.to_string(), signal.to_string()));
        self.on_signal.lock().unwrap().iter().for_each(|h| h(id));
        Ok(())
    }
    async fn ping(&self) -> Result<()> {
        self.check_up()
    }
}
