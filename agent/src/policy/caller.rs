//! Who may write a worker's status record: only the worker itself. Pure: the caller's proven
//! identity and what the runtime says runs on this node in, a verdict out.
//!
//! A write moves a worker's fate — a fresh heartbeat keeps a hung worker alive, `error` pushes a
//! healthy one into a restart, a forged `checkpoint_ack` hands the node over before the job saved
//! — so the identity must be the worker's own: its pod (Kubernetes: a projected token the API
//! server vouched for) or its container (a unix-socket peer, by cgroup). The container that
//! carries the worker id is looked up afresh on every write, so a token or a connection never
//! outlives the container it was proven for.

use crate::model::container::Container;

/// Who is on the other end of a write, as far as it was proven.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A loopback connection with `worker_api.auth = "none"`: anyone on this host.
    Loopback,
    /// A pod, as a TokenReview of its bound ServiceAccount token described it.
    Pod {
        namespace: String,
        name: String,
        uid: String,
        /// The node the token was minted on, when the API server says (Kubernetes ≥ 1.30).
        node: Option<String>,
    },
    /// A process in a container of this host, by its cgroup.
    Container { id: String },
    /// A unix-socket peer that is in no container (a host process).
    HostProcess { pid: i32 },
}

impl Caller {
    /// How logs and refusals name it.
    pub fn describe(&self) -> String {
        match self {
            Caller::Loopback => "a loopback client".into(),
            Caller::Pod {
                namespace, name, ..
            } => format!("pod {namespace}/{name}"),
            Caller::Container { id } => format!("container {}", short(id)),
            Caller::HostProcess { pid } => format!("host process {pid} (in no container)"),
        }
    }
}

/// Why a write was refused (HTTP 403): said to the caller, who is authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

/// May `caller` write the record of `worker` on `node`? `containers` are the opted-in worker
/// containers the runtime lists on this node now.
pub fn authorize(
    caller: &Caller,
    worker: &str,
    node: &str,
    containers: &[Container],
) -> Result<(), Refusal> {
    let carriers: Vec<&Container> = containers.iter().filter(|c| c.worker == worker).collect();
    match caller {
        Caller::Loopback => Ok(()),
        Caller::HostProcess { .. } => Err(Refusal(format!(
            "{} may not write worker {worker}: on this socket only the worker's own container may",
            caller.describe()
        ))),
        _ if carriers.is_empty() => Err(Refusal(format!(
            "no container on node {node} carries worker id {worker}, so {} cannot be it",
            caller.describe()
        ))),
        Caller::Pod {
            namespace,
            name,
            uid,
            node: token_node,
        } => {
            if let Some(n) = token_node.as_deref().filter(|n| *n != node) {
                return Err(Refusal(format!(
                    "the token of pod {namespace}/{name} was issued on node {n}, not on {node}"
                )));
            }
            let own = carriers.iter().any(|c| {
                c.pod_identity()
                    .is_some_and(|p| p.uid == *uid && p.namespace == *namespace && p.name == *name)
            });
            if own {
                Ok(())
            } else {
                Err(Refusal(format!(
                    "worker {worker} is {}, not pod {namespace}/{name} (uid {uid})",
                    names(&carriers)
                )))
            }
        }
        Caller::Container { id } => {
            if carriers.iter().any(|c| same_container(&c.id, id)) {
                Ok(())
            } else {
                Err(Refusal(format!(
                    "worker {worker} is {}, not container {}",
                    names(&carriers),
                    short(id)
                )))
            }
        }
    }
}

/// Runtimes give full 64-hex ids; a short id (12) of the same container matches.
fn same_container(listed: &str, peer: &str) -> bool {
    listed.len() >= 12 && peer.len() >= 12 && (listed.starts_with(peer) || peer.starts_with(listed))
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

fn names(carriers: &[&Container]) -> String {
    let all: Vec<String> = carriers.iter().map(|c| c.display()).collect();
    all.join(", ")
}

#[cfg(test)]
mod tests {
    use super::{authorize, Caller};
    use crate::model::container::{Container, PodIdentity, PodRef};

    fn pod_container(id: &str, worker: &str, ns: &str, pod: &str, uid: &str) -> Container {
        Container {
            id: id.into(),
            name: format!("k8s_{pod}"),
            worker: worker.into(),
            running: true,
            pod: Some(PodRef {
                namespace: ns.into(),
                pod: pod.into(),
                uid: uid.into(),
                sandbox: "sb".into(),
                container: "main".into(),
                attempt: 0,
                log_path: None,
            }),
            ..Container::default()
        }
    }

    fn pod(ns: &str, name: &str, uid: &str, node: Option<&str>) -> Caller {
        Caller::Pod {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            node: node.map(str::to_string),
        }
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
        assert_eq!(authorize(&me, "trainer-0", "gpu-7", &listed), Ok(()));
        // Someone else's worker, a worker that is not here, a token from another node.
        let other = authorize(&me, "trainer-1", "gpu-7", &listed).unwrap_err();
        assert!(other.0.contains("ml/trainer-1/main"), "{other:?}");
        assert!(authorize(&me, "trainer-9", "gpu-7", &listed).is_err());
        let elsewhere = pod("ml", "trainer-0", "uid-0", Some("gpu-8"));
        assert!(authorize(&elsewhere, "trainer-0", "gpu-7", &listed).is_err());
        // A pod of the same name from before (another uid) or in another namespace is not it.
        assert!(authorize(
            &pod("ml", "trainer-0", "uid-old", None),
            "trainer-0",
            "gpu-7",
            &listed
        )
        .is_err());
        assert!(authorize(
            &pod("dev", "trainer-0", "uid-0", None),
            "trainer-0",
            "gpu-7",
            &listed
        )
        .is_err());
        // Without the node in the token, the local runtime's listing is the proof.
        assert!(authorize(
            &pod("ml", "trainer-0", "uid-0", None),
            "trainer-0",
            "gpu-7",
            &listed
        )
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
        let me = Caller::Container { id: A.into() };
        assert!(authorize(&me, "w0", "n", &listed).is_ok());
        assert!(authorize(
            &Caller::Container { id: A[..12].into() },
            "w0",
            "n",
            &listed
        )
        .is_ok());
        assert!(authorize(&Caller::Container { id: B.into() }, "w0", "n", &listed).is_err());
        assert!(authorize(&Caller::Container { id: "aaa".into() }, "w0", "n", &listed).is_err());
        assert!(authorize(&Caller::HostProcess { pid: 1 }, "w0", "n", &listed).is_err());
        // A pod token cannot pass for a plain Docker container (no pod to compare)...
        assert!(authorize(&pod("ml", "w0", "u", None), "w0", "n", &listed).is_err());
        // ... but speaks for one a kubelet created for that pod (cri-dockerd's labels).
        let mut kubelets = w.clone();
        kubelets.kube_pod = Some(PodIdentity {
            namespace: "ml".into(),
            name: "w0".into(),
            uid: "u".into(),
        });
        assert!(authorize(&pod("ml", "w0", "u", None), "w0", "n", &[kubelets.clone()]).is_ok());
        assert!(authorize(&pod("ml", "w0", "u2", None), "w0", "n", &[kubelets]).is_err());
        w.worker = "w1".into();
        assert!(authorize(&me, "w0", "n", &[w]).is_err());
    }

    #[test]
    fn loopback_is_trusted_as_configured() {
        assert!(authorize(&Caller::Loopback, "anything", "n", &[]).is_ok());
    }
}
