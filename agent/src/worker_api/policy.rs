//! Who may write a worker's status record: only the worker itself. Pure: the caller's proven
//! identity and what the runtime says runs on this node in, a verdict out.
//!
//! A write moves a worker's fate — a fresh heartbeat keeps a hung worker alive, `error` pushes a
//! healthy one into a restart, a forged `checkpoint_ack` hands the node over before the job saved
//! — so the identity must be the worker's own: its pod (Kubernetes: a projected token the API
//! server vouched for) or its container (a unix-socket peer, by cgroup). The container that
//! carries the worker id is looked up afresh on every write, so a token or a connection never
//! outlives the container it was proven for.

use crate::runtime::container::{Container, PodIdentity};

/// Who is on the other end of a write, as far as it was proven.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A loopback connection with `worker_api.auth = "none"`: anyone on this host.
    Loopback,
    /// A pod, as a TokenReview of its bound ServiceAccount token described it, and the node the
    /// token was minted on, when the API server says (Kubernetes ≥ 1.30).
    Pod { pod: PodIdentity, node: Option<String> },
    /// A process whose cgroup is named after a container of this host: a claim, proven only
    /// once its cgroups (`cgroup`, the peer's `/proc/<pid>/cgroup`) are found at or below that
    /// container's init process's (`crate::worker_api::peer::within`).
    Container { id: String, cgroup: String },
    /// A unix-socket peer that is in no container (a host process).
    HostProcess { pid: i32 },
}

impl Caller {
    /// How logs and refusals name it.
    pub(crate) fn describe(&self) -> String {
        match self {
            Caller::Loopback => "a loopback client".into(),
            Caller::Pod { pod, .. } => format!("pod {}/{}", pod.namespace, pod.name),
            Caller::Container { id, .. } => format!("container {}", &id[..id.len().min(12)]),
            Caller::HostProcess { pid } => format!("host process {pid} (in no container)"),
        }
    }
}

/// Why a write was refused (HTTP 403): said to the caller, who is authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal(pub String);

/// A token minted on another node is refused before anything is asked of the runtime: a
/// replayed token costs this node no listing.
pub(crate) fn token_node(caller: &Caller, node: &str) -> Result<(), Refusal> {
    match caller {
        Caller::Pod { node: Some(n), .. } if n != node => Err(Refusal(format!(
            "the token of {} was issued on node {n}, not on {node}",
            caller.describe()
        ))),
        _ => Ok(()),
    }
}

/// May `caller` read or write the record of `worker` on `node`? `containers` are the opted-in
/// worker containers the runtime lists on this node now (exited ones included). The answer is
/// the container that carries the worker (`None` for loopback), which a container caller must
/// still prove to be in.
///
/// NB: a worker id that two live containers carry is ambiguous: the agent never restarts it,
/// and nobody may speak for it either — neither beat, read its checkpoint request nor
/// acknowledge one — since the second container may be an impostor that copied the label.
pub(crate) fn authorize<'a>(
    caller: &Caller,
    worker: &str,
    node: &str,
    containers: &'a [Container],
) -> Result<Option<&'a Container>, Refusal> {
    let carriers: Vec<&Container> = containers.iter().filter(|c| c.worker == worker).collect();
    let live: Vec<_> = carriers.iter().copied().filter(|c| c.running || c.paused).collect();
    match caller {
        Caller::Loopback => return Ok(None),
        Caller::HostProcess { .. } => return Err(Refusal(format!(
            "{} may not speak for worker {worker}: on this socket only the worker's own container may",
            caller.describe()
        ))),
        _ if carriers.is_empty() => return Err(Refusal(format!(
            "no container on node {node} carries worker id {worker}, so {} cannot be it",
            caller.describe()
        ))),
        _ if live.len() > 1 => return Err(Refusal(format!(
            "worker id {worker} is carried by {} containers ({}): ambiguous, so nobody may speak for it (and Vigil never restarts it) until one of them goes; give each worker its own id",
            live.len(),
            names(&live)
        ))),
        _ => {}
    }
    token_node(caller, node)?;
    // NB: a live carrier speaks for the worker; with none live, only a caller whose own every
    // carrier is. An exited container (CRI lists a pod's exited attempt) must not let its pod —
    // another namespace's copycat — write for the live worker, or for one in back-off.
    let own = match live.is_empty() {
        false => live.iter().copied().find(|c| is_caller(c, caller)),
        true => carriers
            .iter()
            .copied()
            .find(|c| is_caller(c, caller))
            .filter(|_| carriers.iter().all(|c| is_caller(c, caller))),
    };
    own.map(Some).ok_or_else(|| {
        let who = match caller {
            Caller::Pod { pod, .. } => format!("{} (uid {})", caller.describe(), pod.uid),
            _ => caller.describe(),
        };
        Refusal(format!("worker {worker} is {}, not {who}", names(&carriers)))
    })
}

/// Whether `c` is the caller's own container: its pod (namespace, name and uid), or its
/// container id.
fn is_caller(c: &Container, caller: &Caller) -> bool {
    match caller {
        Caller::Pod { pod, .. } => c.pod_identity().as_ref() == Some(pod),
        Caller::Container { id, .. } => same_container(&c.id, id),
        Caller::Loopback | Caller::HostProcess { .. } => false,
    }
}

/// Runtimes give full 64-hex ids; a short id (12) of the same container matches.
fn same_container(listed: &str, peer: &str) -> bool {
    listed.len() >= 12 && peer.len() >= 12 && (listed.starts_with(peer) || peer.starts_with(listed))
}

fn names(carriers: &[&Container]) -> String {
    carriers.iter().map(|c| c.display()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::{authorize, token_node, Caller};
    use crate::runtime::container::{Container, PodIdentity, PodRef};

    fn pod_container(id: &str, worker: &str, ns: &str, pod: &str, uid: &str) -> Container {
        Container {
            id: id.into(),
            name: format!("k8s_{pod}"),
            worker: worker.into(),
            running: true,
            pod: Some(PodRef {
                pod: PodIdentity { namespace: ns.into(), name: pod.into(), uid: uid.into() },
                sandbox: "sb".into(),
                container: "main".into(),
                attempt: 0,
                job: false,
            }),
            ..Container::default()
        }
    }

    fn pod(ns: &str, name: &str, uid: &str, node: Option<&str>) -> Caller {
        let pod = PodIdentity { namespace: ns.into(), name: name.into(), uid: uid.into() };
        Caller::Pod { pod, node: node.map(str::to_string) }
    }

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn a_pod_writes_its_own_worker_only() {
        let listed = [
            pod_container(A, "trainer-0", "ml", "trainer-0", "uid-0"),
            pod_container(B, "trainer-1", "ml", "trainer-1", "uid-1"),
        ];
        let me = pod("ml", "trainer-0", "uid-0", Some("gpu-7"));
        assert_eq!(authorize(&me, "trainer-0", "gpu-7", &listed), Ok(Some(&listed[0])));
        // Someone else's worker, a worker that is not here, a token from another node.
        let other = authorize(&me, "trainer-1", "gpu-7", &listed).unwrap_err();
        assert!(other.0.contains("ml/trainer-1/main"), "{other:?}");
        assert!(authorize(&me, "trainer-9", "gpu-7", &listed).is_err());
        let elsewhere = pod("ml", "trainer-0", "uid-0", Some("gpu-8"));
        assert!(authorize(&elsewhere, "trainer-0", "gpu-7", &listed).is_err());
        // A pod of the same name from before (another uid) or in another namespace is not it.
        assert!(authorize(&pod("ml", "trainer-0", "uid-old", None), "trainer-0", "gpu-7", &listed)
            .is_err());
        assert!(authorize(&pod("dev", "trainer-0", "uid-0", None), "trainer-0", "gpu-7", &listed)
            .is_err());
        // Without the node in the token, the local runtime's listing is the proof.
        assert!(authorize(&pod("ml", "trainer-0", "uid-0", None), "trainer-0", "gpu-7", &listed)
            .is_ok());
    }

    #[test]
    fn a_container_writes_its_own_worker_only() {
        let mut w = Container {
            id: A.into(),
            name: "w0".into(),
            worker: "w0".into(),
            ..Container::default()
        };
        let listed = [w.clone()];
        let me = container(A);
        assert!(authorize(&me, "w0", "n", &listed).is_ok());
        assert!(authorize(&container(&A[..12]), "w0", "n", &listed).is_ok());
        assert!(authorize(&container(B), "w0", "n", &listed).is_err());
        assert!(authorize(&container("aaa"), "w0", "n", &listed).is_err());
        assert!(authorize(&Caller::HostProcess { pid: 1 }, "w0", "n", &listed).is_err());
        // A pod token cannot pass for a plain Docker container (no pod to compare)...
        assert!(authorize(&pod("ml", "w0", "u", None), "w0", "n", &listed).is_err());
        // ... but speaks for one a kubelet created for that pod (cri-dockerd's labels).
        let mut kubelets = w.clone();
        kubelets.kube_pod =
            Some(PodIdentity { namespace: "ml".into(), name: "w0".into(), uid: "u".into() });
        assert!(authorize(&pod("ml", "w0", "u", None), "w0", "n", &[kubelets.clone()]).is_ok());
        assert!(authorize(&pod("ml", "w0", "u2", None), "w0", "n", &[kubelets]).is_err());
        w.worker = "w1".into();
        assert!(authorize(&me, "w0", "n", &[w]).is_err());
    }

    fn container(id: &str) -> Caller {
        Caller::Container { id: id.into(), cgroup: format!("0::/docker/{id}\n") }
    }

    #[test]
    fn loopback_is_trusted_as_configured() {
        assert!(authorize(&Caller::Loopback, "anything", "n", &[]).is_ok());
    }

    /// Issue 26: a second live container with the same worker id (an impostor that copied the
    /// label, or a second replica) leaves nobody who may speak for the worker, the original
    /// included; an exited one beside a live one is no ambiguity.
    #[test]
    fn an_ambiguous_worker_id_is_refused_to_everyone() {
        let mine = pod_container(A, "trainer-0", "ml", "trainer-0", "uid-0");
        let copy = pod_container(B, "trainer-0", "dev", "copycat", "uid-9");
        let me = pod("ml", "trainer-0", "uid-0", None);
        let both = [mine.clone(), copy.clone()];
        let refused = authorize(&me, "trainer-0", "gpu-7", &both).unwrap_err();
        assert!(refused.0.contains("ambiguous"), "{refused:?}");
        assert!(
            authorize(&pod("dev", "copycat", "uid-9", None), "trainer-0", "gpu-7", &both).is_err()
        );
        assert!(authorize(&container(A), "trainer-0", "gpu-7", &both).is_err());
        let mut gone = copy;
        gone.running = false;
        let one_live = [mine.clone(), gone.clone()];
        assert!(authorize(&me, "trainer-0", "gpu-7", &one_live).is_ok());
        // The copycat's exited container speaks for nobody: not beside the live worker, nor
        // while the worker is in back-off (both exited); the worker's own pod still may.
        let copycat = pod("dev", "copycat", "uid-9", None);
        assert!(authorize(&copycat, "trainer-0", "gpu-7", &one_live).is_err());
        let mut backoff = mine;
        backoff.running = false;
        let both_exited = [backoff.clone(), gone];
        assert!(authorize(&copycat, "trainer-0", "gpu-7", &both_exited).is_err());
        assert!(authorize(&me, "trainer-0", "gpu-7", &both_exited).is_err(), "who is it?");
        assert!(authorize(&me, "trainer-0", "gpu-7", &[backoff]).is_ok());
    }

    #[test]
    fn a_token_from_another_node_is_refused_before_any_listing() {
        let elsewhere = pod("ml", "trainer-0", "uid-0", Some("gpu-8"));
        assert!(token_node(&elsewhere, "gpu-7").unwrap_err().0.contains("gpu-8"));
        assert!(token_node(&pod("ml", "t", "u", Some("gpu-7")), "gpu-7").is_ok());
        assert!(token_node(&pod("ml", "t", "u", None), "gpu-7").is_ok());
        assert!(token_node(&container(A), "gpu-7").is_ok());
    }
}
