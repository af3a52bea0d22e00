//! Docker Engine API adapter (bollard). The API version is negotiated with the daemon, so an
//! older engine (e.g. API 1.41) is spoken to in its own version.
//!
//! Podman's Docker-compatible API (`podman system service`) is served by the same adapter: list,
//! inspect, logs, restart with a stop timeout, kill and ping behave alike (checked against Debian's
//! Podman 4.3). One difference matters, the event filter: see [`DockerRuntime::follow_events`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::errors::Error as BollardError;
use bollard::models::ContainerInspectResponse as Inspection;
use bollard::query_parameters::{
    EventsOptions, InspectContainerOptions, KillContainerOptions, ListContainersOptions,
    LogsOptions, RestartContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::sync::Mutex;
use tokio_util::task::AbortOnDropHandle;

use super::{Container, ContainerRuntime, Result, RuntimeError};
use crate::runtime::container::{alert_only, gang_of_pod, visible_gpus, PodIdentity};

/// Inspect results of the listing by container id, trusted only while the daemon's event
/// stream for opted-in containers runs: any event of a container (start, restart, die, stop,
/// pause, unpause, destroy...) drops its entry, and the whole cache goes when the stream ends.
/// The decision a restart rests on never uses it: compare-and-restart inspects afresh.
#[derive(Default)]
struct InspectCache {
    entries: std::sync::Mutex<HashMap<String, Container>>,
    /// Bumped by every event: an inspect that began before an event is not cached.
    epoch: AtomicU64,
    /// The event stream runs (without it nothing is read from the cache).
    live: AtomicBool,
    /// Inspect calls made for the listing (for the benchmark and its test).
    inspects: AtomicU64,
}

impl InspectCache {
    fn get(&self, id: &str) -> Option<Container> {
        if !self.live.load(Ordering::SeqCst) {
            return None;
        }
        self.entries.lock().ok()?.get(id).cloned()
    }
    fn put(&self, epoch: u64, c: &Container) {
        if self.live.load(Ordering::SeqCst) && self.epoch.load(Ordering::SeqCst) == epoch {
            if let Ok(mut e) = self.entries.lock() {
                e.insert(c.id.clone(), c.clone());
            }
        }
    }
    fn forget(&self, id: Option<&str>) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let Ok(mut e) = self.entries.lock() else { return };
        match id {
            Some(id) => drop(e.remove(id)),
            None => e.clear(),
        }
    }
}

pub struct DockerRuntime {
    host: String,
    /// The daemon is Podman: configured (`runtime.kind = podman`), or named so by its `/version`
    /// (e.g. Podman's socket mounted where Docker's would be).
    podman: AtomicBool,
    label: String,
    checkpoint_label: String,
    /// The restart call's own deadline (it waits out the stop grace).
    timeout: Duration,
    /// Deadline of every call but the restart (`runtime.call_timeout`): a daemon that accepts
    /// and never answers is noticed in seconds, not after the restart's long timeout (and
    /// `/readyz` never waits on it that long).
    call_timeout: Duration,
    client: Mutex<Option<Docker>>,
    cache: Arc<InspectCache>,
    /// The task following the event stream (aborted when the runtime is dropped).
    events: std::sync::Mutex<Option<AbortOnDropHandle<()>>>,
}

impl DockerRuntime {
    /// No connection is made here: a daemon that is down at start-up is reported per cycle.
    /// `podman`: the daemon is configured as Podman (`runtime.kind = podman`, its unix socket
    /// as `host`).
    pub fn new(
        host: &str,
        podman: bool,
        label: &str,
        checkpoint_label: &str,
        timeout: Duration,
        call_timeout: Duration,
    ) -> Self {
        DockerRuntime {
            host: host.to_string(),
            podman: AtomicBool::new(podman),
            label: label.to_string(),
            checkpoint_label: checkpoint_label.to_string(),
            timeout,
            call_timeout,
            client: Mutex::new(None),
            cache: Arc::default(),
            events: std::sync::Mutex::new(None),
        }
    }

    /// Follow the daemon's events for opted-in containers, unless already following them. The
    /// stream starts one second in the past, so nothing between this call and the subscription
    /// is missed (a repeated event only drops an entry twice).
    ///
    /// NB: Podman (4.3) matches a `label` event filter only as `key=value`: the `label=key` that
    /// Docker understands as "carries the label" matches nothing there, and the cache would
    /// never hear of a restart. On Podman the stream is filtered by type alone and every
    /// container event drops that container's entry (only workers have entries; other
    /// containers' events cost an epoch bump). A daemon that keeps no events (Podman with
    /// `events_logger = "none"`) ends the stream at once, so nothing cached is trusted.
    fn follow_events(&self) {
        let Ok(mut slot) = self.events.lock() else { return };
        if slot.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        // NB: its own client: the calls' 10 s deadline would cut a stream that lives for days.
        let Ok(docker) = Docker::connect_with_host(&self.host) else { return };
        let docker = docker.with_timeout(Duration::from_secs(24 * 3600));
        let since = (jiff::Timestamp::now().as_second() - 1).to_string();
        let mut filters = HashMap::new();
        filters.insert("type".to_string(), vec!["container".to_string()]);
        if !self.podman.load(Ordering::Relaxed) {
            filters.insert("label".to_string(), vec![self.label.clone()]);
        }
        let opts = EventsOptions { since: Some(since), until: None, filters: Some(filters) };
        let cache = self.cache.clone();
        cache.forget(None);
        cache.live.store(true, Ordering::SeqCst);
        *slot = Some(AbortOnDropHandle::new(tokio::spawn(async move {
            let mut stream = Box::pin(docker.events(Some(opts)));
            while let Some(Ok(ev)) = stream.next().await {
                // An event that names no container drops every entry.
                cache.forget(ev.actor.and_then(|a| a.id).as_deref());
            }
            // The stream ended (daemon restarted, connection lost): trust nothing cached.
            cache.live.store(false, Ordering::SeqCst);
            cache.forget(None);
        })));
    }

    async fn client(&self) -> Result<Docker> {
        let mut guard = self.client.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let unreachable = |e: BollardError| RuntimeError::unreachable(self, e);
        let c = Docker::connect_with_host(&self.host).map_err(unreachable)?;
        let c = c.with_timeout(self.call_timeout).negotiate_version().await.map_err(unreachable)?;
        if !self.podman.load(Ordering::Relaxed) {
            // Podman names itself among the components of its version (`Podman Engine`).
            let components = c.version().await.ok().and_then(|v| v.components);
            if components.unwrap_or_default().iter().any(|k| k.name.starts_with("Podman")) {
                tracing::info!(host = %self.host, "the Docker API at this address is Podman's");
                self.podman.store(true, Ordering::Relaxed);
            }
        }
        *guard = Some(c.clone());
        Ok(c)
    }

    /// The daemon's inspect of container `id`; `None` when it does not exist.
    async fn inspect_raw(&self, id: &str) -> Result<Option<Inspection>> {
        let c = self.client().await?;
        match c.inspect_container(id, None::<InspectContainerOptions>).await {
            Err(BollardError::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            r => self.classify("inspect", id, r).await.map(Some),
        }
    }

    /// The answer of call `op` on container `id`, its bollard error mapped: transport problems
    /// mean the daemon is unreachable (and the cached client is dropped so the next call
    /// reconnects); API answers are refusals.
    async fn classify<T>(
        &self,
        op: &'static str,
        id: &str,
        answer: Result<T, BollardError>,
    ) -> Result<T> {
        Err(match answer {
            Ok(v) => return Ok(v),
            Err(BollardError::DockerResponseServerError { message, .. }) => {
                RuntimeError::refused(self, op, id, &message)
            }
            Err(BollardError::RequestTimeoutError) => {
                let timeout = if op == "restart" { self.timeout } else { self.call_timeout };
                RuntimeError::Timeout { op, container: id.to_string(), timeout }
            }
            Err(other) => {
                *self.client.lock().await = None;
                RuntimeError::unreachable(self, other)
            }
        })
    }
}

#[cfg(any(test, feature = "bench"))]
impl DockerRuntime {
    /// Inspect calls made for listings so far: the inspect cache's effect, for the tests.
    pub fn listing_inspects(&self) -> u64 {
        self.cache.inspects.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl ContainerRuntime for DockerRuntime {
    fn describe(&self) -> String {
        let kind = if self.podman.load(Ordering::Relaxed) { "podman" } else { "docker" };
        format!("{kind} at {}", self.host)
    }

    async fn list_workers(&self) -> Result<Vec<Container>> {
        let c = self.client().await?;
        let filters = Some(HashMap::from([("label".to_string(), vec![self.label.clone()])]));
        // NB: exited ones too (`all`), so a worker whose container exited is reported, not
        // forgotten (the agent prefers a running container of the same worker).
        let opts = ListContainersOptions { all: true, filters, ..Default::default() };
        let list = self.classify("list", "*", c.list_containers(Some(opts)).await).await?;
        self.follow_events();
        let mut out = Vec::new();
        for summary in list {
            let Some(id) = summary.id else { continue };
            // The listing has no start time: inspect each container, once per incarnation
            // (cached until the daemon reports an event of that container).
            if let Some(cached) = self.cache.get(&id) {
                out.push(cached);
                continue;
            }
            let epoch = self.cache.epoch.load(Ordering::SeqCst);
            self.cache.inspects.fetch_add(1, Ordering::Relaxed);
            if let Some(container) = self.inspect(&id).await? {
                self.cache.put(epoch, &container);
                out.push(container);
            }
        }
        Ok(out)
    }

    async fn inspect(&self, id: &str) -> Result<Option<Container>> {
        let Some(info) = self.inspect_raw(id).await? else { return Ok(None) };
        let labels = info.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
        // NB: a container without the opt-in label is never returned, whatever its status says.
        let Some(worker) = labels.get(&self.label).filter(|w| !w.is_empty()) else {
            return Ok(None);
        };
        let name = info.name.as_deref().unwrap_or_default().trim_start_matches('/').to_string();
        // Replicas of one Compose service share their labels: `container-name` makes each its own
        // worker.
        let worker = if worker == CONTAINER_NAME_ID { name.clone() } else { worker.clone() };
        let state = info.state.as_ref();
        let paused = state.and_then(|s| s.paused).unwrap_or(false);
        let kube_pod = kube_pod(&labels);
        // NB: under a kubelet (cri-dockerd) the pod's namespace scopes its gang, as on CRI.
        let ns = kube_pod.as_ref().map(|p| p.namespace.as_str());
        let gang = gang_of_pod(ns, &labels, &HashMap::new(), &self.label);
        Ok(Some(Container {
            id: info.id.clone().unwrap_or_else(|| id.to_string()),
            name,
            worker,
            started_at: state.and_then(|s| s.started_at.clone()).unwrap_or_default(),
            // NB: Docker says a paused container is running; for Vigil it is not (it must not be
            // restarted, and its stale heartbeat is no hang).
            running: state.and_then(|s| s.running).unwrap_or(false) && !paused,
            paused,
            checkpoint: labels.get(&self.checkpoint_label).map(|l| l.as_str().into()),
            gpus: gpus_of(&info),
            pod: None,
            kube_pod,
            alert_only: alert_only(&labels, &self.label),
            gang,
        }))
    }

    async fn logs(&self, id: &str, lines: usize) -> Result<String> {
        let c = self.client().await?;
        let tail = lines.to_string();
        let opts = LogsOptions { stdout: true, stderr: true, tail, ..Default::default() };
        let mut stream = c.logs(id, Some(opts));
        let mut out = String::new();
        while let Some(item) = stream.next().await {
            let chunk = self.classify("logs", id, item).await?;
            out.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
        Ok(out)
    }

    async fn restart(&self, target: &Container, stop_grace: Duration) -> Result<()> {
        let id = target.id.as_str();
        let c = self.client().await?.with_timeout(self.timeout);
        let secs = stop_grace.as_secs().min(i32::MAX as u64) as i32;
        let opts = RestartContainerOptions { t: Some(secs), ..Default::default() };
        self.classify("restart", id, c.restart_container(id, Some(opts)).await).await
    }

    async fn kill(&self, id: &str, signal: &str) -> Result<()> {
        let c = self.client().await?;
        let opts = KillContainerOptions { signal: signal.to_string() };
        self.classify("kill", id, c.kill_container(id, Some(opts)).await).await
    }

    async fn init_pid(&self, id: &str) -> Result<Option<i32>> {
        let state = self.inspect_raw(id).await?.and_then(|info| info.state);
        // Docker and Podman say pid 0 for a container that is not running.
        Ok(state.and_then(|s| s.pid).and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0))
    }

    async fn ping(&self) -> Result<()> {
        let c = self.client().await?;
        self.classify("ping", "-", c.ping().await).await.map(drop)
    }
}

/// The opt-in label's value that makes the container's own name its worker id.
pub const CONTAINER_NAME_ID: &str = "container-name";

/// The pod a kubelet (cri-dockerd) created a container for, from the labels it sets on it.
fn kube_pod(labels: &HashMap<String, String>) -> Option<PodIdentity> {
    let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
    Some(PodIdentity {
        namespace: get("io.kubernetes.pod.namespace")?,
        name: get("io.kubernetes.pod.name")?,
        uid: get("io.kubernetes.pod.uid")?,
    })
}

/// The GPUs a container was given: its device requests' ids, or its `NVIDIA_VISIBLE_DEVICES`.
fn gpus_of(info: &Inspection) -> Option<Vec<String>> {
    let ids: Option<Vec<String>> =
        info.host_config.as_ref().and_then(|h| h.device_requests.as_ref()).map(|reqs| {
            reqs.iter().flat_map(|r| r.device_ids.clone().unwrap_or_default()).collect()
        });
    let env = info.config.as_ref().and_then(|c| c.env.clone()).unwrap_or_default();
    visible_gpus(ids.as_deref(), &env)
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::Duration;

    use super::DockerRuntime;
    use crate::runtime::ContainerRuntime;

    const IMAGE: &str = "vigil-test-busybox:2";

    fn docker(args: &[&str]) -> String {
        let out = Command::new("docker").args(args).output().expect("docker");
        assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The machine's daemon, listing the containers labelled `label`.
    fn local(label: &str) -> DockerRuntime {
        let (timeout, call) = (Duration::from_secs(30), Duration::from_secs(10));
        DockerRuntime::new("unix:///var/run/docker.sock", false, label, "x", timeout, call)
    }

    /// The tests/ suites' tiny image (a static busybox, `docker import`ed), built if missing.
    fn ensure_image() {
        if Command::new("docker")
            .args(["image", "inspect", IMAGE])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return;
        }
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("a static busybox (apt-get install busybox-static)");
        let root = tempfile::tempdir().unwrap();
        let bin = root.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy(busybox, bin.join("busybox")).unwrap();
        for a in ["sh", "sleep", "echo", "cat", "kill", "date", "true", "wget"] {
            std::os::unix::fs::symlink("busybox", bin.join(a)).unwrap();
        }
        let tar = root.path().join("rootfs.tar");
        let dir = root.path().to_str().unwrap();
        let ok = Command::new("tar")
            .args(["-C", dir, "-cf", tar.to_str().unwrap(), "bin"])
            .status()
            .unwrap();
        assert!(ok.success());
        let _ = Command::new("docker").args(["import", tar.to_str().unwrap(), IMAGE]).output();
    }

    /// Against the real daemon: a listing inspects each container once per incarnation, and
    /// the daemon's events make every change visible — someone's restart (a new start time),
    /// a pause.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_listing_inspects_once_per_incarnation_and_events_invalidate() {
        ensure_image();
        let label = format!("vigil.unit.{}", std::process::id());
        let id = docker(&["run", "-d", "--label", &format!("{label}=w0"), IMAGE, "sleep", "300"]);
        // Past the one second of events the stream replays (its start would drop the entry).
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let rt = local(&label);
        let first = rt.list_workers().await.unwrap();
        assert_eq!(first.len(), 1);
        for _ in 0..3 {
            let again = rt.list_workers().await.unwrap();
            assert_eq!(again[0].started_at, first[0].started_at);
        }
        assert_eq!(rt.listing_inspects(), 1, "cached while nothing happened");

        docker(&["restart", "-t", "0", &id]);
        let mut seen = None;
        for _ in 0..50 {
            let now = rt.list_workers().await.unwrap();
            if now[0].started_at != first[0].started_at {
                seen = Some(now);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(seen.is_some(), "the restart's events made the new incarnation visible");

        docker(&["pause", &id]);
        let mut paused = false;
        for _ in 0..50 {
            if rt.list_workers().await.unwrap()[0].paused {
                paused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = Command::new("docker").args(["rm", "-f", &id]).output();
        assert!(paused, "the pause was seen");
        assert!(rt.listing_inspects() <= 6, "{} inspects", rt.listing_inspects());
    }

    /// A container the kubelet created through cri-dockerd (its `io.kubernetes.pod.*` labels,
    /// as the real daemon reports them) is never restarted through the Docker API: its pod's
    /// controllers own its restarts. A plain Docker container is restarted in place.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kubelet_s_container_is_refused_a_plain_one_restarted_in_place() {
        use crate::vocab::workload::{Remediation, Stops};
        ensure_image();
        let label = format!("vigil.kubelet.{}", std::process::id());
        let kubelet = [
            "io.kubernetes.pod.namespace=ml",
            "io.kubernetes.pod.name=train-0",
            "io.kubernetes.pod.uid=uid-0",
        ];
        let mut args = vec!["run", "-d", "--label"];
        let worker = format!("{label}=w0");
        args.push(&worker);
        for l in &kubelet {
            args.extend(["--label", l]);
        }
        args.extend([IMAGE, "sleep", "300"]);
        let pod = docker(&args);
        let plain =
            docker(&["run", "-d", "--label", &format!("{label}=w1"), IMAGE, "sleep", "300"]);
        let rt = local(&label);
        let listed = rt.list_workers().await;
        let _ = Command::new("docker").args(["rm", "-f", &pod, &plain]).output();
        let listed = listed.unwrap();
        let of = |w: &str| listed.iter().find(|c| c.worker == w).unwrap().clone();
        match rt.remediation(&of("w0"), Stops::One).await {
            Remediation::Refuse(why) => {
                assert!(why.contains("pod ml/train-0") && why.contains("runtime.kind"), "{why}")
            }
            other => panic!("a kubelet's container restarted through Docker: {other:?}"),
        }
        assert_eq!(rt.remediation(&of("w1"), Stops::One).await, Remediation::IN_PLACE);
    }
}
