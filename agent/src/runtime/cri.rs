//! The Kubernetes Container Runtime Interface (CRI v1, gRPC on a unix socket): containerd and
//! CRI-O, the runtimes of GKE, EKS and most on-prem clusters, where there is no Docker socket.
//!
//! Facts this adapter relies on (kubelet and the CRI API):
//! - kubelet copies a pod's labels and annotations onto its *sandbox*; a pod opts in with the
//!   label `vigil.worker=<id>` there. Containers carry `io.kubernetes.container.name` and the pod
//!   keys, and `metadata.attempt`;
//! - kubelet restarts a container by creating the next attempt (a new container id) in the same
//!   pod. So Vigil's restart is `StopContainer` with the stop grace, and it is done when the next
//!   attempt runs (restartPolicy Always/OnFailure). With restartPolicy Never the pod would end
//!   instead: such pods are refused unless `runtime.allow_pod_replacement`;
//! - a container's newest attempt speaks for it, running or not (kubelet's back-off keeps an
//!   exited attempt until the next one); a deleted pod's sandbox is no longer ready;
//! - container logs are files (`log_path` in the container status) in the CRI log format;
//! - CRI has no "send a signal": the checkpoint signal goes to the container's host PID, read from
//!   the verbose status (`info.pid`), which needs the agent in the host PID namespace (`hostPID`);
//! - CRI does not say which GPUs a container has (the device plugin's allocation is the
//!   kubelet's): they come from the kubelet's PodResources API when it is wired in
//!   ([`CriRuntime::with_devices`]), else a worker counts as using every GPU.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    Container as CriContainer, ContainerFilter, ContainerState, ContainerStateValue,
    ContainerStatusRequest, ContainerStatusResponse, ListContainersRequest, ListPodSandboxRequest,
    PodSandboxFilter, PodSandboxState, PodSandboxStateValue, PodSandboxStatus,
    PodSandboxStatusRequest, StopContainerRequest, VersionRequest,
};
use tonic::transport::Channel;
use tonic::Status;

use super::cri_remediation::Remedies;
use super::cri_sandbox::{addresses_the_pod, Sandbox};
// The opt-in values' names, for the suites (tests/cri.rs): the agent reads them in cri_sandbox.
#[cfg(any(test, feature = "bench"))]
pub use super::cri_sandbox::{POD_NAME_ID, WORKER_CONTAINER_ANNOTATION};
use super::{Container, ContainerRuntime, Result, RuntimeError};
use crate::kube::podresources::{unix_channel, PodResourcesClient};
use crate::kube::pods::PodApi;
use crate::vocab::workload::{Remediation, Stops};

/// Largest tail of a log file read for an alert: the last `log_lines` are in it.
const LOG_TAIL_BYTES: u64 = 1 << 20;

/// The least time a stop gets past the grace: after the SIGKILL the runtime still has to see
/// the exit and clean up, which on a loaded node takes longer than a short call deadline.
const STOP_MARGIN: Duration = Duration::from_secs(10);

/// Settings of the CRI adapter.
#[derive(Clone)]
pub struct CriSettings {
    /// The runtime's unix socket, e.g. `/run/containerd/containerd.sock`.
    pub socket: String,
    /// The opt-in label on the pod (its value is the worker id).
    pub worker_label: String,
    /// The pod annotation with the checkpoint method (labels cannot hold `signal:…` or URLs).
    pub checkpoint_annotation: String,
    /// Deadline of every call but the restart's wait.
    pub call_timeout: Duration,
    /// Restart pods whose restartPolicy is Never (ending them), or whose policy is unknown.
    pub allow_pod_replacement: bool,
    /// How often the restart looks for kubelet's next attempt.
    pub poll: Duration,
}

impl CriSettings {
    /// What opts a pod in: its label, and the annotation of its checkpoint method.
    fn opt_in(&self) -> (&str, &str) {
        (&self.worker_label, &self.checkpoint_annotation)
    }
}

pub struct CriRuntime {
    s: CriSettings,
    client: RuntimeServiceClient<Channel>,
    /// How a container is restarted, from its pod and controllers (the Kubernetes API).
    remedies: Remedies,
    /// The containers' GPUs (the kubelet's PodResources API); `None`: every worker on every GPU.
    devices: Option<Arc<PodResourcesClient>>,
    /// The device source failed last time (its failure is logged once, not every cycle).
    devices_failing: AtomicBool,
}

impl CriRuntime {
    /// No connection is made here: a runtime that is down at start-up is reported per cycle.
    pub fn new(s: CriSettings, pods: Option<Arc<dyn PodApi>>) -> Self {
        // NB: no channel-wide `.timeout()`: gRPC keeps the shorter of a channel's timeout and
        // a request's deadline, and the stop of a worker that ignores SIGTERM (any hung
        // one) takes the whole stop grace. Every call sets its own deadline instead.
        let channel = unix_channel(&s.socket, Some(s.call_timeout));
        CriRuntime {
            client: RuntimeServiceClient::new(channel),
            remedies: Remedies::new(pods, s.allow_pod_replacement),
            s,
            devices: None,
            devices_failing: AtomicBool::new(false),
        }
    }

    /// Read the workers' GPUs from `devices` (the kubelet's PodResources API), so a failed GPU
    /// stands down only the workers on it; `None`: every worker on every GPU.
    pub fn with_devices(mut self, devices: Option<Arc<PodResourcesClient>>) -> Self {
        self.devices = devices;
        self
    }

    /// The containers' GPUs from the kubelet's allocation; left `None` (every worker on every
    /// GPU) when there is no source or it failed. NB: never an error: without the allocation the
    /// safe reading is "all GPUs" (a failed GPU then stands every worker down), and the listing
    /// must go on.
    async fn fill_gpus(&self, out: &mut [Container]) {
        let Some(src) = self.devices.as_ref().filter(|_| !out.is_empty()) else { return };
        let read = src.gpus().await;
        // Said when the source fails and when it recovers, not every cycle.
        match (&read, self.devices_failing.swap(read.is_err(), Ordering::Relaxed)) {
            (Ok(_), true) => {
                tracing::info!(source = %src.describe(), "the workers' GPUs are read again")
            }
            (Err(e), false) => {
                tracing::warn!(error = %e, "cannot read the workers' GPUs: every worker counts as using every GPU, so a failed GPU stands all of them down (said once until it recovers)")
            }
            _ => {}
        }
        let Ok(gpus) = read else { return };
        for c in out {
            if let Some(p) = &c.pod {
                c.gpus = gpus.get(&p.pod.namespace, &p.pod.name, &p.container);
            }
        }
    }

    /// A request bounded by `runtime.call_timeout`, see [`within`].
    fn req<T>(&self, msg: T) -> (tonic::Request<T>, Duration) {
        (request(msg, self.s.call_timeout), self.s.call_timeout)
    }

    /// A gRPC failure of a call bounded by `deadline`: transport problems and `Unavailable` mean
    /// the runtime is unreachable; other statuses are refusals.
    fn classify(&self, op: &'static str, id: &str, st: Status, deadline: Duration) -> RuntimeError {
        use tonic::Code;
        let transport = st.message().contains("transport");
        match st.code() {
            Code::Unavailable => RuntimeError::unreachable(self, st),
            Code::Unknown if transport => RuntimeError::unreachable(self, st),
            Code::DeadlineExceeded | Code::Cancelled => {
                RuntimeError::Timeout { op, container: id.to_string(), timeout: deadline }
            }
            _ => RuntimeError::refused(self, op, id, &format!("{:?}: {}", st.code(), st.message())),
        }
    }

    /// Ready sandboxes that opted in, by sandbox id.
    async fn opted_in_sandboxes(&self) -> Result<HashMap<String, Sandbox>> {
        let ready = Some(PodSandboxStateValue { state: PodSandboxState::SandboxReady as i32 });
        let filter = Some(PodSandboxFilter { state: ready, ..Default::default() });
        let (req, d) = self.req(ListPodSandboxRequest { filter });
        let listed = within(d, self.client.clone().list_pod_sandbox(req)).await;
        let items = listed.map_err(|e| self.classify("list", "*", e, d))?.items;
        let mut out = HashMap::new();
        for p in items {
            let opted_in =
                Sandbox::from_labels(self.s.opt_in(), p.labels, p.annotations, p.metadata);
            let Some(mut sandbox) = opted_in else { continue };
            // An HTTP checkpoint method at `pod` is sent to the pod's IP: the listing has
            // none, its status does (one more call, for these pods only; empty on the host
            // network or when the sandbox is gone).
            if sandbox.checkpoint.as_deref().is_some_and(addresses_the_pod) {
                let ip = self.sandbox_status(&p.id).await?.and_then(|st| st.network).map(|n| n.ip);
                sandbox.resolve_pod_ip(&ip.unwrap_or_default());
            }
            out.insert(p.id, sandbox);
        }
        Ok(out)
    }

    /// The sandbox's status; `None` when it is gone.
    async fn sandbox_status(&self, id: &str) -> Result<Option<PodSandboxStatus>> {
        let req = PodSandboxStatusRequest { pod_sandbox_id: id.to_string(), verbose: false };
        let (req, d) = self.req(req);
        match within(d, self.client.clone().pod_sandbox_status(req)).await {
            Ok(r) => Ok(r.status),
            Err(st) if st.code() == tonic::Code::NotFound => Ok(None),
            Err(st) => Err(self.classify("inspect", id, st, d)),
        }
    }

    async fn sandbox(&self, id: &str) -> Result<Option<Sandbox>> {
        Ok(self.sandbox_status(id).await?.and_then(|st| {
            let ip = st.network.as_ref().map(|n| n.ip.clone()).unwrap_or_default();
            let mut sandbox =
                Sandbox::from_labels(self.s.opt_in(), st.labels, st.annotations, st.metadata)?;
            sandbox.resolve_pod_ip(&ip);
            Some(sandbox)
        }))
    }

    async fn containers(&self, filter: ContainerFilter) -> Result<Vec<CriContainer>> {
        let id = filter.id.clone();
        let (req, d) = self.req(ListContainersRequest { filter: Some(filter) });
        let listed = within(d, self.client.clone().list_containers(req)).await;
        Ok(listed.map_err(|e| self.classify("list", &id, e, d))?.containers)
    }

    /// The container's status (log path, host PID with `verbose`); `None` when it is gone.
    async fn status(&self, id: &str, verbose: bool) -> Result<Option<ContainerStatusResponse>> {
        let (req, d) = self.req(ContainerStatusRequest { container_id: id.to_string(), verbose });
        match within(d, self.client.clone().container_status(req)).await {
            Ok(r) => Ok(Some(r)),
            Err(st) if st.code() == tonic::Code::NotFound => Ok(None),
            Err(st) => Err(self.classify("inspect", id, st, d)),
        }
    }

    /// Whether `c` is a first attempt that exited with status 0: done, not a worker that
    /// stopped. NB: an init container that ran (its pod still starting) or a Job's worker that
    /// succeeded keeps its ready sandbox a while: listed as exited, each was an `exited` alert.
    /// A later attempt is never done (a worker in back-off after restarts, even one that saved
    /// and left cleanly on SIGTERM), nor one whose status cannot be read: a worker dropped from
    /// the listing has its pages resolved as gone. A running one asks nothing.
    async fn completed(&self, c: &CriContainer) -> bool {
        let first = c.metadata.as_ref().is_some_and(|m| m.attempt == 0);
        if c.state != ContainerState::ContainerExited as i32 || !first {
            return false;
        }
        let status = self.status(&c.id, false).await.ok().flatten().and_then(|r| r.status);
        status.is_some_and(|s| s.exit_code == 0)
    }

    /// `StopContainer` of container `id` with `stop_grace` (0: SIGKILL at once).
    async fn stop(&self, id: &str, stop_grace: Duration) -> Result<()> {
        let timeout = stop_grace.as_secs().min(i64::MAX as u64) as i64;
        let req = StopContainerRequest { container_id: id.to_string(), timeout };
        // NB: the stop takes the whole grace for a worker that ignores SIGTERM (then SIGKILL):
        // its deadline is the grace plus a call's time (at least `STOP_MARGIN`), never the call
        // deadline alone (the caller bounds the whole restart by `runtime.restart_timeout`).
        let d = stop_grace + self.s.call_timeout.max(STOP_MARGIN);
        if let Err(e) = within(d, self.client.clone().stop_container(request(req, d))).await {
            // NB: a worker that exits at once on SIGTERM can take its shim with it while
            // containerd is still in the kill (`ttrpc: closed`): the call fails, yet the container
            // stopped. What counts is the container's state, read again; kubelet's next attempt
            // follows as after any stop.
            let read = self.status(id, false).await.ok().flatten().and_then(|r| r.status);
            // A failed read, or a container gone, is not an exit.
            let exited = read.is_some_and(|s| s.state == ContainerState::ContainerExited as i32);
            if !exited {
                return Err(self.classify("restart", id, e, d));
            }
            tracing::debug!(container = %id, error = %e.message(), "the stop call failed but the container exited: the stop took effect");
        }
        Ok(())
    }
}

/// A request that tells the runtime its deadline (`grpc-timeout`).
fn request<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(deadline);
    r
}

/// A call bounded here too: `grpc-timeout` is the runtime's to honour, and a runtime that
/// accepts and never answers must not hold the agent.
async fn within<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    let Ok(answer) = tokio::time::timeout(deadline, call).await else {
        let waited = humantime::format_duration(deadline);
        return Err(Status::deadline_exceeded(format!("no answer within {waited}")));
    };
    answer.map(tonic::Response::into_inner)
}

/// The running containers of `sandbox`.
fn running_in(sandbox: &str) -> ContainerFilter {
    let state = Some(ContainerStateValue { state: ContainerState::ContainerRunning as i32 });
    ContainerFilter { pod_sandbox_id: sandbox.to_string(), state, ..Default::default() }
}

/// Of `listed`, what speaks for each container (sandbox and name) of a sandbox that `ready`
/// holds: its newest attempt (the highest `attempt`, then the latest created), whatever its
/// state, so a worker in kubelet's back-off is listed exited, not missing.
///
/// NB: a sandbox that is not ready is a deleted pod's: its containers are no workers that
/// exited. An attempt created and not started yet has never run: its predecessor still speaks
/// (a failed start is `EXITED`, not `CREATED`).
fn newest_attempts(listed: Vec<CriContainer>, ready: impl Fn(&str) -> bool) -> Vec<CriContainer> {
    let order = |c: &CriContainer| (c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at);
    let created = ContainerState::ContainerCreated as i32;
    let counts = |c: &CriContainer| c.state != created && ready(c.pod_sandbox_id.as_str());
    let mut newest: HashMap<(String, String), CriContainer> = HashMap::new();
    for c in listed.into_iter().filter(counts) {
        let name = c.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        let key = (c.pod_sandbox_id.clone(), name);
        if newest.get(&key).is_none_or(|kept| order(&c) > order(kept)) {
            newest.insert(key, c);
        }
    }
    newest.into_values().collect()
}

/// The last `LOG_TAIL_BYTES` of a file (from a line start), lossily decoded.
fn read_tail(path: &str) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let start = len.saturating_sub(LOG_TAIL_BYTES);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    f.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    Ok(match (start > 0, text.find('\n')) {
        // The first line was cut by the seek: drop it.
        (true, Some(nl)) => text[nl + 1..].to_string(),
        _ => text.into_owned(),
    })
}

/// The host PID of a container, from the verbose status's `info` (containerd and CRI-O both
/// put a JSON object with `pid` there).
///
/// NB: only a positive one: containerd says `pid: 0` for a container that exited, and `kill(0)`
/// would signal the agent's own process group (`kill(-1)`: every process it may signal).
fn host_pid(info: &HashMap<String, String>) -> Option<i32> {
    let v: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    v.get("pid")?.as_i64().and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0)
}

#[async_trait]
impl ContainerRuntime for CriRuntime {
    fn describe(&self) -> String {
        format!("cri at {}", self.s.socket)
    }

    async fn list_workers(&self) -> Result<Vec<Container>> {
        let sandboxes = self.opted_in_sandboxes().await?;
        if sandboxes.is_empty() {
            return Ok(Vec::new());
        }
        // NB: every state, as Docker's `all`: a worker whose container exited (kubelet's
        // back-off, a `Never` pod beside a sidecar that runs on) is reported exited, not gone.
        let listed = self.containers(ContainerFilter::default()).await?;
        let mut out = Vec::new();
        for c in newest_attempts(listed, |id| sandboxes.contains_key(id)) {
            let Some(sb) = sandboxes.get(&c.pod_sandbox_id) else { continue };
            let name = c.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
            if sb.selects(name) && !self.completed(&c).await {
                out.push(sb.container(&c, &c.pod_sandbox_id));
            }
        }
        self.fill_gpus(&mut out).await;
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn inspect(&self, id: &str) -> Result<Option<Container>> {
        let filter = ContainerFilter { id: id.to_string(), ..Default::default() };
        let Some(c) = self.containers(filter).await?.into_iter().next() else { return Ok(None) };
        let Some(sb) = self.sandbox(&c.pod_sandbox_id).await? else { return Ok(None) };
        let mut out = sb.container(&c, &c.pod_sandbox_id);
        self.fill_gpus(std::slice::from_mut(&mut out)).await;
        Ok(Some(out))
    }

    async fn logs(&self, id: &str, lines: usize) -> Result<String> {
        let refused = |why: &str| RuntimeError::refused(self, "logs", id, why);
        let Some(st) = self.status(id, false).await?.and_then(|r| r.status) else {
            return Err(refused("the container is gone"));
        };
        if st.log_path.is_empty() {
            return Err(refused("the runtime reports no log path"));
        }
        let path = st.log_path.clone();
        let read = tokio::task::spawn_blocking(move || read_tail(&path)).await;
        let text = read.map_err(|e| refused(&e.to_string()))?.map_err(|e| {
            refused(&format!(
                "cannot read {}: {e} (the DaemonSet mounts /var/log/pods read-only)",
                st.log_path
            ))
        })?;
        Ok(super::cri_log::tail(&text, lines))
    }

    async fn remediation(&self, c: &Container, stops: Stops) -> Remediation {
        self.remedies.of(c, stops).await
    }

    /// `StopContainer` with `grace` (0: SIGKILL, exit 137): the worker, then with `whole_pod`
    /// every other running container of its sandbox; no next attempt awaited.
    async fn fail(&self, target: &Container, grace: Duration, whole_pod: bool) -> Result<()> {
        self.stop(&target.id, grace).await?;
        let Some(p) = target.pod.as_ref().filter(|_| whole_pod) else { return Ok(()) };
        // NB: every one is asked, whatever one answers: a container left running keeps a
        // `Never` pod from failing, and its controller from replacing it.
        let mut first_error = None;
        for other in self.containers(running_in(&p.sandbox)).await? {
            if let Err(e) = self.stop(&other.id, grace).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// `StopContainer` with the stop grace, then wait for kubelet's next attempt (the caller
    /// bounds the whole call by `restart_timeout`).
    async fn restart(&self, target: &Container, stop_grace: Duration) -> Result<()> {
        self.stop(&target.id, stop_grace).await?;
        loop {
            match self.successor(target).await? {
                Some(next) if next.id != target.id && next.running => return Ok(()),
                _ => tokio::time::sleep(self.s.poll).await,
            }
        }
    }

    /// The newest attempt of the same pod and container name, `c`'s or a later one, running or
    /// not (as Docker's inspect: a next attempt that exited at once is no container gone).
    async fn successor(&self, c: &Container) -> Result<Option<Container>> {
        let Some(p) = &c.pod else { return self.inspect(&c.id).await };
        let all = ContainerFilter { pod_sandbox_id: p.sandbox.clone(), ..Default::default() };
        let listed = self.containers(all).await?;
        let newest = newest_attempts(listed, |_| true).into_iter().find(|x| {
            x.metadata.as_ref().is_some_and(|m| m.name == p.container && m.attempt >= p.attempt)
        });
        let Some(x) = newest else { return Ok(None) };
        let Some(sb) = self.sandbox(&p.sandbox).await? else { return Ok(None) };
        // NB: the same container of the same pod keeps its devices across attempts (kubelet
        // allocates them per pod); this is polled during a restart, so the kubelet is not asked.
        Ok(Some(Container { gpus: c.gpus.clone(), ..sb.container(&x, &p.sandbox) }))
    }

    /// The checkpoint signal, to the container's host PID (CRI has no kill).
    async fn kill(&self, id: &str, signal: &str) -> Result<()> {
        let refused = |why: &str| RuntimeError::refused(self, "kill", id, why);
        let Some(resp) = self.status(id, true).await? else {
            return Err(refused("the container is gone"));
        };
        let pid = host_pid(&resp.info)
            .ok_or_else(|| refused("the runtime's verbose status has no host PID"))?;
        let sig: nix::sys::signal::Signal =
            signal.parse().map_err(|_| refused(&format!("unknown signal {signal}")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).map_err(|e| {
            let why = format!("{signal} to host PID {pid}: {e} (signalling a CRI container needs the agent in the host PID namespace: hostPID: true)");
            refused(&why)
        })
    }

    async fn init_pid(&self, id: &str) -> Result<Option<i32>> {
        Ok(self.status(id, true).await?.and_then(|resp| host_pid(&resp.info)))
    }

    async fn ping(&self) -> Result<()> {
        let (req, d) = self.req(VersionRequest { version: "v1".into() });
        let answer = within(d, self.client.clone().version(req)).await;
        answer.map(drop).map_err(|e| self.classify("ping", "-", e, d))
    }
}

#[cfg(test)]
#[path = "cri_tests.rs"]
mod tests;
