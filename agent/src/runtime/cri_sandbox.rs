//! A pod sandbox as the CRI adapter reads it: the opt-in label and annotations kubelet copied
//! from the pod (which worker, which container, its checkpoint method, its gang), the container
//! of an attempt as Vigil's `Container`, and an HTTP checkpoint method addressed to the pod's IP.

use std::collections::HashMap;

use k8s_cri::v1::ContainerState;

use super::Container;
use crate::runtime::container::{alert_only, gang_of_pod, PodGang, PodIdentity, PodRef};
use crate::vocab::workload::keys;

/// The opt-in label's value that makes the pod's own name its worker id: pods of one
/// Deployment, Job or JobSet template share their labels, and would otherwise all be one
/// (ambiguous, never restarted) worker.
pub const POD_NAME_ID: &str = "pod-name";

/// The pod annotation that names the worker's container in a pod with several.
pub const WORKER_CONTAINER_ANNOTATION: &str = "vigil.dev/worker-container";

/// What Vigil reads from an opted-in pod sandbox.
#[derive(Debug, Clone)]
pub(super) struct Sandbox {
    pub(super) worker: String,
    /// The container named by `vigil.dev/worker-container`, when the pod says.
    pub(super) container: Option<String>,
    pub(super) checkpoint: Option<String>,
    pub(super) alert_only: bool,
    pub(super) gang: Option<PodGang>,
    pub(super) pod: PodIdentity,
    /// Its labels name a Job.
    pub(super) job: bool,
}

impl Sandbox {
    /// The sandbox of a pod opted in with `worker_label`, its checkpoint method in
    /// `checkpoint_annotation` (the adapter's settings); `None` for any other pod.
    pub(super) fn from_labels(
        (worker_label, checkpoint_annotation): (&str, &str),
        labels: HashMap<String, String>,
        annotations: HashMap<String, String>,
        meta: Option<k8s_cri::v1::PodSandboxMetadata>,
    ) -> Option<Sandbox> {
        // NB: a pod without the opt-in label is never a worker, whatever else it says.
        let worker = labels.get(worker_label).filter(|w| !w.is_empty())?;
        let meta = meta.unwrap_or_default();
        // Pods of one template share their labels: `pod-name` makes each its own worker.
        // NB: with its namespace (`<namespace>.<pod>`: a namespace holds no dot), so that
        // `dev/trainer-0` and `ml/trainer-0` on one node are two workers, not one ambiguous id.
        let (ns, name) = (&meta.namespace, &meta.name);
        let worker = if worker == POD_NAME_ID { format!("{ns}.{name}") } else { worker.clone() };
        Some(Sandbox {
            worker,
            container: annotations.get(WORKER_CONTAINER_ANNOTATION).cloned(),
            checkpoint: annotations.get(checkpoint_annotation).cloned(),
            alert_only: alert_only(&labels, worker_label),
            gang: gang_of_pod(Some(ns), &labels, &annotations, worker_label),
            job: labels.contains_key(keys::JOB_NAME) || labels.contains_key("job-name"),
            pod: PodIdentity { namespace: meta.namespace, name: meta.name, uid: meta.uid },
        })
    }

    /// An HTTP checkpoint method at the host `pod` goes to this pod's IP (the agent on the host
    /// network cannot reach a pod's 127.0.0.1); a host-network pod has no IP of its own and is
    /// reached on the node's loopback.
    pub(super) fn resolve_pod_ip(&mut self, ip: &str) {
        if let Some(method) = self.checkpoint.as_deref().filter(|m| addresses_the_pod(m)) {
            self.checkpoint = Some(at_pod_ip(method, ip));
        }
    }

    /// Whether `name` is this pod's worker container: the annotated one, or, without the
    /// annotation, every container (several make the worker ambiguous, and it is never
    /// restarted).
    pub(super) fn selects(&self, name: &str) -> bool {
        self.container.as_deref().is_none_or(|c| c == name)
    }

    pub(super) fn container(&self, c: &k8s_cri::v1::Container, sandbox_id: &str) -> Container {
        let meta = c.metadata.clone().unwrap_or_default();
        Container {
            id: c.id.clone(),
            name: format!("{}/{}/{}", self.pod.namespace, self.pod.name, meta.name),
            worker: self.worker.clone(),
            // NB: every attempt is a new container, so the incarnation is the id; the creation
            // time keeps the key the same shape as Docker's.
            started_at: format!("attempt-{}@{}", meta.attempt, c.created_at),
            running: c.state == ContainerState::ContainerRunning as i32,
            checkpoint: self.checkpoint.clone().map(Into::into),
            pod: Some(PodRef {
                pod: self.pod.clone(),
                sandbox: sandbox_id.to_string(),
                container: meta.name,
                attempt: meta.attempt,
                job: self.job,
            }),
            alert_only: self.alert_only,
            gang: self.gang.clone(),
            // Not paused; `gpus` are filled from the kubelet's PodResources API, when it is
            // wired in.
            ..Default::default()
        }
    }
}

/// The host that stands for the pod's own IP in an HTTP checkpoint method
/// (`http://pod:8080/checkpoint`).
pub(crate) const POD_HOST: &str = "pod";

pub(super) fn addresses_the_pod(method: &str) -> bool {
    reqwest::Url::parse(method)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str() == Some(POD_HOST))
}

/// `method` with the host `pod` replaced by `ip` (127.0.0.1 when the pod has none).
pub(super) fn at_pod_ip(method: &str, ip: &str) -> String {
    let Ok(mut url) = reqwest::Url::parse(method) else { return method.to_string() };
    let host = match ip {
        "" => "127.0.0.1".to_string(),
        v6 if v6.contains(':') => format!("[{v6}]"),
        v4 => v4.to_string(),
    };
    let Ok(()) = url.set_host(Some(&host)) else { return method.to_string() };
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_pod_stands_for_the_pod_s_ip() {
        let m = "http://pod:8080/checkpoint?x=1";
        assert!(addresses_the_pod(m));
        assert_eq!(at_pod_ip(m, "10.4.0.17"), "http://10.4.0.17:8080/checkpoint?x=1");
        assert_eq!(at_pod_ip(m, ""), "http://127.0.0.1:8080/checkpoint?x=1");
        assert_eq!(at_pod_ip(m, "fd00::17"), "http://[fd00::17]:8080/checkpoint?x=1");
        for other in ["http://podium:80/", "http://10.0.0.1/pod", "signal:SIGUSR1", "record"] {
            assert!(!addresses_the_pod(other), "{other}");
        }
    }
}
