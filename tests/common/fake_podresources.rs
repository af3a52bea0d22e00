//! A faithful fake of the kubelet's PodResources API (v1): a gRPC server on a unix socket in a
//! temp dir, serving `List` from the same generated code the agent's client uses
//! (`vigil::kube::podresources::proto`), answering as the kubelet does:
//! - every pod on the node is listed, with every container of its spec — also the containers
//!   that were given no device (an empty `devices`);
//! - a container's devices come one entry per resource name, with the device plugin's ids and
//!   the NUMA topology it reported; `cpu_ids` is empty (no static CPU manager policy);
//! - the answer is the allocation as it stands: a pod removed from the node is gone from it.
//!
//! The test scripts the pods, and can make the kubelet hang (accept, never answer) or refuse.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use vigil::kube::podresources::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use vigil::kube::podresources::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    NumaNode, PodResources, TopologyInfo,
};

/// One container of a pod: its name and, per resource name, the device ids it was given.
pub type FakeContainer = (&'static str, Vec<(&'static str, Vec<String>)>);

#[derive(Default)]
struct State {
    /// (namespace, pod) -> containers, in spec order.
    pods: BTreeMap<(String, String), Vec<FakeContainer>>,
    hang: bool,
    refuse: bool,
}

#[derive(Clone, Default)]
struct Service {
    state: Arc<Mutex<State>>,
    calls: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl PodResourcesLister for Service {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (hang, refuse) = {
            let st = self.state.lock().unwrap();
            (st.hang, st.refuse)
        };
        if hang {
            std::future::pending::<()>().await;
        }
        if refuse {
            // What the kubelet answers when its pod resources provider is not ready.
            return Err(Status::unavailable("pod resources provider not ready"));
        }
        let st = self.state.lock().unwrap();
        let pod_resources = st
            .pods
            .iter()
            .map(|((namespace, name), containers)| PodResources {
                name: name.clone(),
                namespace: namespace.clone(),
                containers: containers
                    .iter()
                    .map(|(cname, devices)| ContainerResources {
                        name: cname.to_string(),
                        devices: devices
                            .iter()
                            .map(|(resource, ids)| ContainerDevices {
                                resource_name: resource.to_string(),
                                device_ids: ids.clone(),
                                topology: Some(TopologyInfo { nodes: vec![NumaNode { id: 0 }] }),
                            })
                            .collect(),
                        cpu_ids: vec![],
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }
}

/// The fake kubelet's PodResources endpoint; it stops when dropped.
pub struct FakePodResources {
    dir: tempfile::TempDir,
    service: Service,
    stop: CancellationToken,
}

impl FakePodResources {
    /// Serve on `<temp dir>/kubelet.sock`.
    pub async fn start() -> FakePodResources {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let service = Service::default();
        let stop = CancellationToken::new();
        let incoming = futures_util::stream::unfold(listener, |l| async move {
            let conn = l.accept().await.map(|(s, _)| s);
            Some((conn, l))
        });
        let server = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(service.clone()))
            .serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned());
        tokio::spawn(server);
        FakePodResources { dir, service, stop }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("kubelet.sock")
    }

    pub fn socket_str(&self) -> String {
        self.socket().to_str().unwrap().to_string()
    }

    /// Place a pod on the node with these containers and their devices.
    pub fn set_pod(&self, namespace: &str, pod: &str, containers: Vec<FakeContainer>) {
        let key = (namespace.to_string(), pod.to_string());
        self.service.state.lock().unwrap().pods.insert(key, containers);
    }

    /// A pod with one container given these GPUs (`nvidia.com/gpu`).
    pub fn set_gpu_pod(&self, namespace: &str, pod: &str, container: &'static str, ids: &[&str]) {
        let ids = ids.iter().map(|s| s.to_string()).collect();
        self.set_pod(namespace, pod, vec![(container, vec![("nvidia.com/gpu", ids)])]);
    }

    pub fn remove_pod(&self, namespace: &str, pod: &str) {
        let key = (namespace.to_string(), pod.to_string());
        self.service.state.lock().unwrap().pods.remove(&key);
    }

    /// Accept calls and never answer them.
    pub fn hang(&self, on: bool) {
        self.service.state.lock().unwrap().hang = on;
    }

    /// Answer every call with `Unavailable`.
    pub fn refuse(&self, on: bool) {
        self.service.state.lock().unwrap().refuse = on;
    }

    /// `List` calls received.
    pub fn calls(&self) -> usize {
        self.service.calls.load(Ordering::SeqCst)
    }
}

impl Drop for FakePodResources {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
