//! Which GPUs each container on a Kubernetes node was given, from the kubelet's PodResources API
//! (v1 `List`, gRPC on `/var/lib/kubelet/pod-resources/kubelet.sock`).
//!
//! On a CRI node the container runtime does not say which GPUs a container has: the device
//! plugin's allocation lives in the kubelet. Without it a worker counts as using every GPU of the
//! node, so one failed GPU stands down every worker; with it, only the workers on that GPU.
//!
//! Map: [`PodResourcesClient`] is the one job, the kubelet's client (the tests serve the same
//! generated [`proto`] from a fake kubelet);
//! [`PodGpus::from_list`] turns the kubelet's answer into GPU ids the GPU policy matches
//! (`crate::accel::gpu::model::selects`):
//! - NVIDIA's device plugin names a GPU by its UUID, `GPU-…`: kept, matched by UUID;
//! - GKE's names it by its device file, `nvidia0`, `nvidia1`, …: kept, matched by the minor number
//!   NVML reports (the index where NVML gave none);
//! - a shared GPU's replica suffix is dropped (`GPU-…::3` time-slicing, `nvidia0/vgpu3` GKE
//!   sharing): the container is on that GPU;
//! - any other id under `nvidia.com/` (a MIG device `MIG-…`, an unknown scheme) cannot be placed
//!   on a GPU: that container's GPUs are unknown, which counts as every GPU (the safe side).
//!
//! A container the kubelet lists with no `nvidia.com/` device is also unknown, not GPU-free: it
//! may see GPUs some other way (a privileged container, `NVIDIA_VISIBLE_DEVICES=all`).
//!
//! The same answer also says which pods hold an accelerator at all ([`PodGpus::holders`]: any
//! `nvidia.com/*` or `google.com/tpu` device), which the opportunistic-maintenance idle check
//! reads (`crate::maintenance::policy_idle`).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// The kubelet's PodResources v1 API, generated from `agent/proto/podresources/v1/api.proto`
/// (client and server: the tests' fake kubelet serves it).
pub mod proto {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("v1");
}

use proto::pod_resources_lister_client::PodResourcesListerClient;
use proto::{ListPodResourcesRequest, ListPodResourcesResponse};

/// Resource names whose devices are GPUs: every NVIDIA resource (`nvidia.com/gpu`, its renamed
/// shared variants, MIG profiles).
const GPU_RESOURCE_PREFIX: &str = "nvidia.com/";

/// Cloud TPU chips, as GKE's TPU device plugin names them.
use crate::vocab::node_info::TPU_RESOURCE;

/// Whether a resource name is an accelerator: every NVIDIA resource (whole GPUs, shared GPUs,
/// MIG profiles) and Cloud TPU chips.
pub(crate) fn is_accelerator(resource: &str) -> bool {
    resource.starts_with(GPU_RESOURCE_PREFIX) || resource == TPU_RESOURCE
}

/// The kubelet's own client reads answers up to 16 MiB (a large node lists many pods).
const MAX_MESSAGE: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The socket is not there: not mounted, or the kubelet does not serve it.
    #[error("no PodResources socket at {socket}: mount /var/lib/kubelet/pod-resources read-only (deploy/overlays/gke does), or set runtime.pod_resources_socket = \"\"")]
    Absent { socket: String },
    /// The kubelet did not answer within the call's deadline.
    #[error("the kubelet's PodResources API at {socket} did not answer within {timeout:?}")]
    Timeout { socket: String, timeout: Duration },
    /// The call failed (connection refused, permission denied, an error status).
    #[error("the kubelet's PodResources API at {socket} failed: {detail}")]
    Failed { socket: String, detail: String },
}

/// The GPUs of the containers the kubelet placed GPUs on, keyed by (namespace, pod, container).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodGpus {
    by_container: HashMap<(String, String, String), Vec<String>>,
    /// (namespace, pod) of every pod with a container given an accelerator device.
    holders: BTreeSet<(String, String)>,
}

impl PodGpus {
    /// From the kubelet's `List` answer (see the module header for the id mapping).
    pub(crate) fn from_list(list: &ListPodResourcesResponse) -> PodGpus {
        let mut out = PodGpus::default();
        for pod in &list.pod_resources {
            for c in &pod.containers {
                // The devices it was given (a resource listed with no ids gives it nothing).
                let given = || c.devices.iter().filter(|d| !d.device_ids.is_empty());
                if given().any(|d| is_accelerator(&d.resource_name)) {
                    out.holders.insert((pod.namespace.clone(), pod.name.clone()));
                }
                // One id that names no GPU makes the whole container unknown (all GPUs), and so
                // does none.
                let nvidia = given().filter(|d| d.resource_name.starts_with(GPU_RESOURCE_PREFIX));
                let ids = nvidia.flat_map(|d| d.device_ids.iter().map(String::as_str));
                let gpus: Option<Vec<String>> = ids.map(gpu_id).collect();
                let Some(mut gpus) = gpus.filter(|g| !g.is_empty()) else { continue };
                gpus.sort();
                gpus.dedup();
                let key = (pod.namespace.clone(), pod.name.clone(), c.name.clone());
                out.by_container.insert(key, gpus);
            }
        }
        out
    }

    /// The pods (namespace, name) with a container given an accelerator device.
    pub(crate) fn holders(&self) -> &BTreeSet<(String, String)> {
        &self.holders
    }

    /// The GPUs of this container; `None` = unknown, which the GPU policy reads as every GPU.
    pub fn get(&self, namespace: &str, pod: &str, container: &str) -> Option<Vec<String>> {
        let key = (namespace.to_string(), pod.to_string(), container.to_string());
        self.by_container.get(&key).cloned()
    }

    /// How many containers have known GPUs.
    pub(crate) fn len(&self) -> usize {
        self.by_container.len()
    }
}

/// A device plugin's id for one GPU, as the GPU policy matches it; `None` when it names no whole
/// GPU Vigil can find (a MIG device, an unknown scheme).
pub(crate) fn gpu_id(device_id: &str) -> Option<String> {
    // NVIDIA's time-slicing replicas are `<id>::<n>`; GKE's shared GPUs `nvidia0/vgpu<n>`.
    let id = device_id.split("::").next().unwrap_or_default();
    let id = id.split('/').next().unwrap_or_default().trim();
    let uuid = id.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-")) && id.len() > 4;
    // `nvidia<N>` (a device file) or `<N>` (an index).
    let digits = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    (uuid || id.strip_prefix("nvidia").is_some_and(digits) || digits(id)).then(|| id.to_string())
}

/// A gRPC channel to the unix socket at `path`, connected lazily (at the first call), each
/// connection attempt bounded by `connect_timeout` when one is given. The URI is required by
/// tonic but unused: every connection goes to the socket.
pub(crate) fn unix_channel(path: &str, connect_timeout: Option<Duration>) -> Channel {
    let path = path.to_string();
    let mut endpoint = Endpoint::from_static("http://[::1]:50051");
    if let Some(t) = connect_timeout {
        endpoint = endpoint.connect_timeout(t);
    }
    endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
        }
    }))
}

/// What the CRI runtime asks, every container's GPUs, over the kubelet's PodResources socket.
pub struct PodResourcesClient {
    socket: String,
    timeout: Duration,
    client: PodResourcesListerClient<Channel>,
}

impl PodResourcesClient {
    /// No connection is made here; each call connects when needed and is bounded by `timeout`.
    pub fn new(socket: &str, timeout: Duration) -> PodResourcesClient {
        // NB: no channel-wide timeout: each call gets its own deadline (tokio's, below), which
        // also bounds the connection.
        let channel = unix_channel(socket, None);
        let client = PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
        PodResourcesClient { socket: socket.to_string(), timeout, client }
    }

    /// Where it reads from, for logs and `vigil doctor`.
    pub(crate) fn describe(&self) -> String {
        format!("kubelet PodResources at {}", self.socket)
    }

    /// The GPUs of every container on the node that has some, as the kubelet allocated them.
    pub(crate) async fn gpus(&self) -> Result<PodGpus, DeviceError> {
        if !Path::new(&self.socket).exists() {
            return Err(DeviceError::Absent { socket: self.socket.clone() });
        }
        let mut client = self.client.clone();
        match tokio::time::timeout(self.timeout, client.list(ListPodResourcesRequest {})).await {
            Err(_) => {
                Err(DeviceError::Timeout { socket: self.socket.clone(), timeout: self.timeout })
            }
            Ok(Err(st)) => Err(DeviceError::Failed {
                socket: self.socket.clone(),
                detail: format!("{:?}: {}", st.code(), st.message()),
            }),
            Ok(Ok(r)) => Ok(PodGpus::from_list(r.get_ref())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::proto::{ContainerDevices, ContainerResources, PodResources};
    use super::*;

    #[test]
    fn device_plugin_ids_become_gpu_ids() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "GPU-0f3c9a2e-1111-2222-3333-444455556666",
                Some("GPU-0f3c9a2e-1111-2222-3333-444455556666"),
            ),
            ("GPU-abc::2", Some("GPU-abc")),
            ("nvidia0", Some("nvidia0")),
            ("nvidia13", Some("nvidia13")),
            ("nvidia1/vgpu4", Some("nvidia1")),
            ("3", Some("3")),
            ("MIG-7e2b1c40-aaaa-bbbb-cccc-ddddeeeeffff", None),
            ("nvidia", None),
            ("nvidiactl", None),
            ("GPU-", None),
            ("", None),
        ];
        for (raw, want) in cases {
            assert_eq!(gpu_id(raw).as_deref(), *want, "{raw}");
        }
    }

    fn container(name: &str, devices: &[(&str, &[&str])]) -> ContainerResources {
        ContainerResources {
            name: name.into(),
            devices: devices
                .iter()
                .map(|(r, ids)| ContainerDevices {
                    resource_name: r.to_string(),
                    device_ids: ids.iter().map(|i| i.to_string()).collect(),
                    topology: None,
                })
                .collect(),
            cpu_ids: vec![],
        }
    }

    #[test]
    fn only_gpu_resources_count_and_an_unplaceable_id_means_unknown() {
        let list = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "trainer-0".into(),
                namespace: "ml".into(),
                containers: vec![
                    container(
                        "main",
                        &[("nvidia.com/gpu", &["GPU-b", "GPU-a"]), ("example.com/nic", &["eth1"])],
                    ),
                    container("sidecar", &[("example.com/nic", &["eth2"])]),
                    container("mig", &[("nvidia.com/mig-1g.10gb", &["MIG-1"])]),
                    container("shared", &[("nvidia.com/gpu", &["nvidia2/vgpu0", "nvidia2/vgpu1"])]),
                ],
            }],
        };
        let g = PodGpus::from_list(&list);
        assert_eq!(g.get("ml", "trainer-0", "main"), Some(vec!["GPU-a".into(), "GPU-b".into()]));
        assert_eq!(g.get("ml", "trainer-0", "sidecar"), None, "no GPU: unknown");
        assert_eq!(g.get("ml", "trainer-0", "mig"), None, "MIG: unknown");
        assert_eq!(g.get("ml", "trainer-0", "shared"), Some(vec!["nvidia2".into()]));
        assert_eq!(g.get("other", "trainer-0", "main"), None);
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn pods_holding_a_gpu_or_a_tpu_are_holders() {
        let pod = |ns: &str, name: &str, containers| PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers,
        };
        let list = ListPodResourcesResponse {
            pod_resources: vec![
                pod("ml", "gpu", vec![container("main", &[("nvidia.com/gpu", &["GPU-a"])])]),
                pod("ml", "mig", vec![container("m", &[("nvidia.com/mig-1g.10gb", &["MIG-1"])])]),
                pod("tpu", "slice-0", vec![container("t", &[("google.com/tpu", &["0", "1"])])]),
                pod("net", "nic", vec![container("n", &[("example.com/nic", &["eth1"])])]),
                pod("ml", "empty", vec![container("e", &[("nvidia.com/gpu", &[])])]),
                pod("web", "cpu", vec![container("c", &[])]),
            ],
        };
        let holders: Vec<_> =
            PodGpus::from_list(&list).holders().iter().map(|(ns, p)| format!("{ns}/{p}")).collect();
        assert_eq!(holders, vec!["ml/gpu", "ml/mig", "tpu/slice-0"]);
        assert!(is_accelerator("google.com/tpu"));
        assert!(!is_accelerator("google.com/tpu-v5"));
        assert!(is_accelerator("nvidia.com/gpu.shared"));
    }

    #[tokio::test]
    async fn an_absent_socket_is_named() {
        let c = PodResourcesClient::new("/nonexistent/kubelet.sock", Duration::from_secs(1));
        let e = c.gpus().await.unwrap_err();
        assert!(matches!(e, DeviceError::Absent { .. }), "{e}");
        assert!(e.to_string().contains("/var/lib/kubelet/pod-resources"), "{e}");
    }
}
