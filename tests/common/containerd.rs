//! A private containerd with its CRI plugin, owned by the test: its own root, state directory and
//! socket in a temp dir, a tiny busybox image imported as both the sandbox ("pause") image and the
//! workers' image, host-network sandboxes so no CNI is needed. And [`Kubelet`], which plays
//! kubelet's part over the real CRI API: sandboxes and containers with the labels kubelet sets,
//! and the next attempt of a container that stopped (restartPolicy Always).
//!
//! Everything on Vigil's side of the socket is the production adapter.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, LinuxContainerConfig, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListContainersRequest, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, RunPodSandboxRequest,
    StartContainerRequest, StopContainerRequest,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};

use super::real::{require, run_cli};

/// The image every sandbox and container runs (`docker.io/` is how containerd names it).
pub const CRI_IMAGE: &str = "docker.io/vigil-test/busybox:1";

/// A containerd process private to the test.
pub struct Containerd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// The pod network's bridge, deleted with the rig (CNI's DEL leaves it behind).
    bridge: String,
}

impl Containerd {
    /// Start it and import the test image. Panics with what to install when a binary is missing.
    pub fn start() -> Containerd {
        require(&["containerd", "runc", "ctr"], "the CRI tests (apt-get install containerd runc)");
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        for sub in ["cni-bin", "cni-conf", "pods"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let config = format!(
            r#"version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{root}/containerd.sock"
[ttrpc]
  address = "{root}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{CRI_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  # Sandboxes ask for oom_score_adj -998; a test machine (or CI container) may not allow
  # lowering it: keep the process's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{root}/cni-conf"
"#,
            root = d.display(),
            cni_bin = cni_bin(d).display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let bridge = pod_network(d);
        let mut c = Containerd { dir, child: None, bridge };
        c.spawn();
        c.import_image();
        c
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// Where pod log directories go (`/var/log/pods` on a node).
    pub fn pods_dir(&self) -> PathBuf {
        self.dir.path().join("pods")
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("containerd starts");
        self.child = Some(child);
        // NB: up to 30 s: a containerd starting beside other suites on a loaded 2-core machine
        // can take more than a few seconds to listen (one that fails says so in its log).
        for _ in 0..600 {
            if self.socket().exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("containerd did not create its socket; see {:?}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Kill it (as a crashed runtime); its containers' shims keep running, as on a node.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// Start it again on the same root and state.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    fn import_image(&self) {
        let tar = image_tarball();
        run_cli(
            "ctr",
            &[
                "-a",
                self.socket().to_str().unwrap(),
                "-n",
                "k8s.io",
                "images",
                "import",
                tar.to_str().unwrap(),
            ],
            None,
        );
    }

    /// Remove every sandbox and container, then stop.
    fn cleanup(&mut self) {
        if self.child.is_none() {
            return;
        }
        let sock = self.socket();
        let a = sock.to_str().unwrap();
        // Stop the tasks so no shim outlives the test; errors mean "already gone".
        let _ = Command::new("sh")
            .args([
                "-c",
                &format!(
                    "for t in $(ctr -a {a} -n k8s.io tasks ls -q); do ctr -a {a} -n k8s.io tasks kill -s KILL $t; done; sleep 0.3; for t in $(ctr -a {a} -n k8s.io tasks ls -q); do ctr -a {a} -n k8s.io tasks delete -f $t; done"
                ),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.stop();
        // The containers' overlay and shm mounts live under the temp dir: unmount before it goes.
        let root = self.dir.path();
        let _ = Command::new("sh")
            .args([
                "-c",
                &format!(
                    "grep -o ' {}[^ ]*' /proc/mounts | sort -r | xargs -r -n1 umount -l",
                    root.display()
                ),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["link", "delete", &self.bridge])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<_> = log.lines().rev().take(30).collect();
            eprintln!("containerd log (last lines, newest first):\n{}", tail.join("\n"));
        }
        self.cleanup();
    }
}

/// The busybox image as a `docker save` tarball, built once per test process with
/// `docker import` (no registry is reachable); the sandbox runs its default command, a sleep.
fn image_tarball() -> PathBuf {
    static TAR: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut guard = TAR.lock().unwrap();
    if let Some(p) = guard.as_ref() {
        return p.clone();
    }
    let dir = std::env::temp_dir().join(format!("vigil-cri-image-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("rootfs/bin")).unwrap();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("a static busybox is needed (apt-get install busybox-static)");
    let bin = dir.join("rootfs/bin");
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    for applet in ["sh", "sleep", "echo", "cat", "kill", "date", "true", "trap"] {
        let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
    }
    let rootfs = dir.join("rootfs.tar");
    run_cli(
        "tar",
        &["-C", dir.join("rootfs").to_str().unwrap(), "-cf", rootfs.to_str().unwrap(), "."],
        None,
    );
    let tag = CRI_IMAGE.trim_start_matches("docker.io/");
    run_cli(
        "docker",
        &["import", "-c", r#"CMD ["/bin/sleep","2147483647"]"#, rootfs.to_str().unwrap(), tag],
        None,
    );
    let tar = dir.join("image.tar");
    run_cli("docker", &["save", tag, "-o", tar.to_str().unwrap()], None);
    *guard = Some(tar.clone());
    tar
}

/// A pod as kubelet created it.
#[derive(Clone)]
pub struct Pod {
    pub sandbox: String,
    pub config: PodSandboxConfig,
    /// The command of each container, by name (for the next attempts).
    pub commands: HashMap<String, Vec<String>>,
}

impl Pod {
    /// The pod's uid, as its sandbox carries it (and the API's pod must, for the agent to act).
    pub fn uid(&self) -> &str {
        self.config.metadata.as_ref().map_or("", |m| m.uid.as_str())
    }
}

/// What kubelet does once a container of a pod has ended: the pod's `restartPolicy`, and the
/// container's restart rules (KEP-5307, `restartPolicyRules`: `Restart` on the exit codes
/// listed, which restarts it in place even in a `Never` pod).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Restarts {
    /// Restarted whatever its exit (`Always`): the stand-in's default.
    #[default]
    Always,
    /// Restarted unless it exited 0 (`OnFailure`): an exit 0 ends the container for good.
    OnFailure,
    /// Not restarted (`Never`: the pod ends Failed, or Succeeded on exit 0), unless a restart
    /// rule names its exit code.
    Never { rule_exit_codes: Vec<i32> },
}

impl Restarts {
    /// Whether kubelet starts the next attempt of a container that exited with `code`.
    pub fn restarts(&self, code: i32) -> bool {
        match self {
            Restarts::Always => true,
            Restarts::OnFailure => code != 0,
            Restarts::Never { rule_exit_codes } => rule_exit_codes.contains(&code),
        }
    }
}

/// Kubelet's part, over the real CRI API.
#[derive(Clone)]
pub struct Kubelet {
    client: RuntimeServiceClient<Channel>,
    pods_dir: PathBuf,
    pods: Arc<Mutex<Vec<Pod>>>,
    /// Each pod's [`Restarts`] by sandbox id ([`Restarts::Always`] where unset).
    restarts: Arc<Mutex<HashMap<String, Restarts>>>,
}

impl Kubelet {
    pub fn new(containerd: &Containerd) -> Kubelet {
        let path = containerd.socket();
        let channel = Endpoint::try_from("http://[::1]:50051")
            .unwrap()
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let s = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(s))
                }
            }));
        Kubelet {
            client: RuntimeServiceClient::new(channel),
            pods_dir: containerd.pods_dir(),
            pods: Arc::default(),
            restarts: Arc::default(),
        }
    }

    /// How [`Kubelet::restart_loop`] treats `pod`'s ended containers from now on.
    pub fn set_restarts(&self, pod: &Pod, r: Restarts) {
        self.restarts.lock().unwrap().insert(pod.sandbox.clone(), r);
    }

    /// A host-network pod with kubelet's labels plus `labels` and `annotations`, and its
    /// containers (name, shell script), each started as attempt 0.
    pub async fn run_pod(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        containers: &[(&str, &str)],
    ) -> Pod {
        self.run_pod_with("default", name, labels, annotations, containers, false).await
    }

    /// [`Kubelet::run_pod`] in namespace `ns` (tenants: issue 41).
    pub async fn run_pod_in(
        &self,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        containers: &[(&str, &str)],
    ) -> Pod {
        self.run_pod_with(ns, name, labels, &[], containers, false).await
    }

    /// [`Kubelet::run_pod`] on the pod network: its own network namespace and IP from the
    /// rig's CNI bridge (Debian's containernetworking-plugins), as a GKE pod has.
    pub async fn run_pod_on_pod_network(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        containers: &[(&str, &str)],
    ) -> Pod {
        self.run_pod_with("default", name, labels, annotations, containers, true).await
    }

    async fn run_pod_with(
        &self,
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        containers: &[(&str, &str)],
        pod_network: bool,
    ) -> Pod {
        let uid = format!("uid-{name}-{:06x}", rand::random::<u32>() >> 8);
        let mut all_labels: HashMap<String, String> =
            labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        all_labels.insert("io.kubernetes.pod.name".into(), name.into());
        all_labels.insert("io.kubernetes.pod.namespace".into(), ns.into());
        all_labels.insert("io.kubernetes.pod.uid".into(), uid.clone());
        let log_dir = self.pods_dir.join(format!("{ns}_{name}_{uid}"));
        std::fs::create_dir_all(&log_dir).unwrap();
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: uid.clone(),
                namespace: ns.into(),
                attempt: 0,
            }),
            // Host-network pods share the node's UTS namespace: kubelet sends no hostname.
            hostname: String::new(),
            log_directory: log_dir.to_str().unwrap().into(),
            labels: all_labels,
            annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    // NB: on the host network the sandbox needs no CNI plugin.
                    namespace_options: Some(namespaces(pod_network)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sandbox = self
            .client
            .clone()
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .expect("RunPodSandbox")
            .into_inner()
            .pod_sandbox_id;
        let mut pod = Pod { sandbox, config, commands: HashMap::new() };
        for (cname, script) in containers {
            let cmd = vec!["/bin/sh".to_string(), "-c".to_string(), script.to_string()];
            pod.commands.insert(cname.to_string(), cmd);
            self.start_attempt(&pod, cname, 0).await;
        }
        self.pods.lock().unwrap().push(pod.clone());
        pod
    }

    /// Create and start `attempt` of container `name` of `pod`, as kubelet does.
    pub async fn start_attempt(&self, pod: &Pod, name: &str, attempt: u32) -> String {
        self.try_start_attempt(pod, name, attempt)
            .await
            .expect("CreateContainer and StartContainer")
    }

    /// [`Kubelet::start_attempt`], or the runtime's error.
    pub async fn try_start_attempt(
        &self,
        pod: &Pod,
        name: &str,
        attempt: u32,
    ) -> Result<String, tonic::Status> {
        let meta = pod.config.metadata.clone().unwrap();
        let labels = HashMap::from([
            ("io.kubernetes.container.name".to_string(), name.to_string()),
            ("io.kubernetes.pod.name".to_string(), meta.name.clone()),
            ("io.kubernetes.pod.namespace".to_string(), meta.namespace.clone()),
            ("io.kubernetes.pod.uid".to_string(), meta.uid.clone()),
        ]);
        std::fs::create_dir_all(Path::new(&pod.config.log_directory).join(name)).unwrap();
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata { name: name.into(), attempt }),
            image: Some(ImageSpec { image: CRI_IMAGE.into(), ..Default::default() }),
            command: pod.commands[name].clone(),
            labels,
            log_path: format!("{name}/{attempt}.log"),
            // As kubelet sends them (no shareProcessNamespace): the container has its own PID
            // namespace, so its process is PID 1 there, and a shell as PID 1 ignores SIGTERM.
            // NB: without this, containerd puts the container in the sandbox's PID namespace
            // (the pause process is PID 1), and SIGTERM kills any shell at once.
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    // The sandbox's network, as kubelet sends it.
                    namespace_options: Some(namespaces(pod_is_networked(pod))),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut c = self.client.clone();
        let id = c
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.sandbox.clone(),
                config: Some(config),
                sandbox_config: Some(pod.config.clone()),
            })
            .await?
            .into_inner()
            .container_id;
        c.start_container(StartContainerRequest { container_id: id.clone() }).await?;
        Ok(id)
    }

    /// The containers of `pod`: (id, name, attempt, running).
    pub async fn containers(&self, pod: &Pod) -> Vec<(String, String, u32, bool)> {
        self.try_containers(pod).await.expect("ListContainers")
    }

    /// [`Kubelet::containers`], or the error while containerd is down (as kubelet rides out a
    /// runtime restart).
    pub async fn try_containers(
        &self,
        pod: &Pod,
    ) -> Result<Vec<(String, String, u32, bool)>, tonic::Status> {
        let list = self
            .client
            .clone()
            .list_containers(ListContainersRequest {
                filter: Some(ContainerFilter {
                    pod_sandbox_id: pod.sandbox.clone(),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .containers;
        let mut out: Vec<_> = list
            .into_iter()
            .map(|c| {
                let m = c.metadata.unwrap_or_default();
                let running = c.state == ContainerState::ContainerRunning as i32;
                (c.id, m.name, m.attempt, running)
            })
            .collect();
        out.sort_by(|a, b| (a.1.as_str(), a.2).cmp(&(b.1.as_str(), b.2)));
        Ok(out)
    }

    /// How a container ended, from its CRI status: (exit code, finished at, in ns since the
    /// epoch; 0 while it runs).
    pub async fn exit(&self, id: &str) -> (i32, i64) {
        let st = self
            .client
            .clone()
            .container_status(ContainerStatusRequest { container_id: id.into(), verbose: false })
            .await
            .expect("ContainerStatus")
            .into_inner()
            .status
            .expect("a status");
        (st.exit_code, st.finished_at)
    }

    /// The host PID of a running container's process (the verbose status's `info.pid`, as
    /// the CRI adapter reads it for a signal).
    pub async fn host_pid(&self, id: &str) -> i32 {
        let info = self
            .client
            .clone()
            .container_status(ContainerStatusRequest { container_id: id.into(), verbose: true })
            .await
            .expect("ContainerStatus")
            .into_inner()
            .info;
        let v: serde_json::Value = serde_json::from_str(&info["info"]).expect("info is JSON");
        v["pid"].as_i64().expect("info.pid") as i32
    }

    /// The running container `name` of `pod`: (id, attempt).
    pub async fn running(&self, pod: &Pod, name: &str) -> Option<(String, u32)> {
        self.containers(pod).await.into_iter().find(|c| c.1 == name && c.3).map(|c| (c.0, c.2))
    }

    /// The ids of container `name` of each of `pods` running now (`None` where it runs none).
    pub async fn running_ids(&self, pods: &[Pod], name: &str) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for pod in pods {
            out.push(self.running(pod, name).await.map(|(id, _)| id));
        }
        out
    }

    /// Whether, within `within`, container `name` of every one of `pods` runs an id other than
    /// its id in `first` (each pod's container restarted).
    pub async fn all_restarted(
        &self,
        pods: &[Pod],
        name: &str,
        first: &[Option<String>],
        within: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let now = self.running_ids(pods, name).await;
            if now.iter().zip(first).all(|(n, f)| n.is_some() && n != f) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Stop a container as something outside Vigil would (a crash, an operator).
    pub async fn stop(&self, id: &str) {
        self.client
            .clone()
            .stop_container(StopContainerRequest { container_id: id.into(), timeout: 0 })
            .await
            .expect("StopContainer");
    }

    /// Kubelet's restart loop: every 100 ms, a container of a known pod that has no running
    /// attempt gets the next one, if its pod's [`Restarts`] restarts its last attempt's exit
    /// code (`Always` unless [`Kubelet::set_restarts`] said otherwise). Runs until `stop`.
    pub fn restart_loop(&self, stop: CancellationToken) {
        let k = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                let pods = k.pods.lock().unwrap().clone();
                for pod in pods {
                    let policy =
                        k.restarts.lock().unwrap().get(&pod.sandbox).cloned().unwrap_or_default();
                    for name in pod.commands.keys() {
                        // NB: containerd may be down (restarted by the test): try again later,
                        // as kubelet does.
                        let Ok(all) = k.try_containers(&pod).await else {
                            continue;
                        };
                        let mine: Vec<_> = all.iter().filter(|c| &c.1 == name).collect();
                        let Some(last) = mine.iter().max_by_key(|c| c.2) else {
                            continue;
                        };
                        if mine.iter().any(|c| c.3) {
                            continue;
                        }
                        let Ok(code) = k.try_exit(&last.0).await else {
                            continue;
                        };
                        if policy.restarts(code) {
                            // An error (containerd going down) is retried next round.
                            let _ = k.try_start_attempt(&pod, name, last.2 + 1).await;
                        }
                    }
                }
            }
        });
    }

    /// A container's exit code, or the runtime's error.
    async fn try_exit(&self, id: &str) -> Result<i32, tonic::Status> {
        let st = self
            .client
            .clone()
            .container_status(ContainerStatusRequest { container_id: id.into(), verbose: false })
            .await?
            .into_inner()
            .status;
        // NB: no status is no answer, never a success (under OnFailure an exit 0 would hide a
        // container that is not restarted).
        st.map(|s| s.exit_code).ok_or_else(|| tonic::Status::not_found("no container status"))
    }
}

/// The namespaces of the test's pods and their containers: the node's network (the sandbox
/// needs no CNI plugin), a PID namespace per container (its process is PID 1 there, as kubelet
/// arranges without shareProcessNamespace), the pod's IPC.
fn namespaces(pod_network: bool) -> NamespaceOption {
    NamespaceOption {
        network: if pod_network { NamespaceMode::Pod as i32 } else { NamespaceMode::Node as i32 },
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// Whether `pod`'s sandbox has its own network namespace.
fn pod_is_networked(pod: &Pod) -> bool {
    pod.config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .is_some_and(|n| n.network == NamespaceMode::Pod as i32)
}

/// Debian's CNI plugins when installed (containernetworking-plugins), else the rig's empty
/// directory (host-network pods need none).
fn cni_bin(root: &Path) -> PathBuf {
    let debian = Path::new("/usr/lib/cni");
    if debian.join("bridge").exists() {
        debian.to_path_buf()
    } else {
        root.join("cni-bin")
    }
}

/// The pod network of this containerd: a bridge of its own and a /24 of its own (random, so
/// two rigs at once never share one), addresses from host-local IPAM under the rig's directory.
fn pod_network(root: &Path) -> String {
    let tag = rand::random::<u32>() & 0xff_ffff;
    let (b, c) = ((tag >> 8) & 0xff, tag & 0xff);
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "vigil-test",
        "plugins": [{
            "type": "bridge",
            "bridge": format!("vgl{tag:06x}"),
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": format!("10.{}.{}.0/24", 200 + b % 50, c)}]],
                "dataDir": root.join("ipam").display().to_string(),
            },
        }],
    });
    std::fs::write(root.join("cni-conf/10-vigil-test.conflist"), conf.to_string()).unwrap();
    format!("vgl{tag:06x}")
}
