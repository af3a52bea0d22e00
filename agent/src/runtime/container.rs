//! A worker container as a runtime reports it, and the GPUs it was given.

use std::collections::HashMap;

use crate::vocab::workload::keys;

/// One opted-in worker container as the runtime sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub(crate) name: String,
    /// The worker id: the value of the opt-in label.
    pub worker: String,
    /// When the current incarnation started; a restart changes it (compare-and-restart key).
    pub started_at: String,
    /// Running, and not paused.
    pub running: bool,
    /// Paused by someone (`docker pause`): their decision, never restarted.
    pub paused: bool,
    /// The value of the checkpoint-method label, when the container has one: a secret (an
    /// `http(s)://` method may carry a token), shown redacted wherever the container is.
    pub checkpoint: Option<crate::redact::Secret<crate::redact::Urls>>,
    /// The GPUs it was given (indexes or UUIDs), from `--gpus device=...` or
    /// `NVIDIA_VISIBLE_DEVICES`; `None` when it has all of them or it is not known.
    pub gpus: Option<Vec<String>>,
    /// On a CRI runtime (Kubernetes nodes): the pod and container it belongs to. `None` on Docker.
    pub(crate) pod: Option<PodRef>,
    /// On Docker under a kubelet (cri-dockerd): the pod it was created for, from its
    /// `io.kubernetes.pod.*` labels: the worker API's proof that a pod's token speaks for this
    /// container, and a restart through the Docker API refused (its pod's controllers own its
    /// restarts: `ContainerRuntime::remediation`). `pod` stays `None` on Docker.
    pub(crate) kube_pod: Option<PodIdentity>,
    /// Its restarts belong to another controller (JobSet failure policy, Pathways, an
    /// operator): the opt-in label's companion `<label>.restarts = alert-only`. Vigil reports its
    /// hangs and never restarts it.
    pub alert_only: bool,
    /// The distributed job it is a rank of, from its pod's labels (JobSet, indexed Job,
    /// LeaderWorkerSet, or `<opt-in label>.gang`): its gang (an id valid as a gang id),
    /// whatever its record names. A record names the gang only where the labels name none,
    /// scoped to its namespace where it has one (`crate::hang::policy_membership`).
    pub(crate) gang: Option<PodGang>,
}

/// A gang as a pod's labels name it: a namespaced id and, when the labels say, its size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PodGang {
    pub(crate) id: String,
    pub(crate) size: Option<u32>,
    /// Which labels said so (`jobset`, `job`, `lws`, `label`), for the docs and the trail.
    pub(crate) source: &'static str,
    /// A JobSet's `restart-attempt`: the gang's incarnation. The gang is the JobSet, across its
    /// restarts (its breaker, its run of fruitless restarts, its time lost); the attempt tells
    /// the members of its last restart from those of the one before.
    pub(crate) attempt: Option<u32>,
    /// The JobSet's uid (its first 8 characters): attempts compare within one JobSet.
    pub(crate) jobset_uid: Option<String>,
}

/// The companion label of the opt-in label that names a worker's gang (`vigil.worker.gang`),
/// and its size (`vigil.worker.gang-size`).
pub(crate) const GANG_SUFFIX: &str = ".gang";
pub(crate) const GANG_SIZE_SUFFIX: &str = ".gang-size";

/// The gang a pod's labels (and annotations) name, namespaced (`namespace` `None`: a container
/// outside Kubernetes, whose explicit label is its gang id as it is): the explicit
/// `<opt-in label>.gang` first, then a JobSet (`<ns>/jobset/<name>`, the same gang across its
/// restarts, its `restart-attempt` the gang's incarnation), a LeaderWorkerSet group (`<ns>/lws/<name>/<group-index>`, its size
/// from the `size` annotation), an Indexed Job (`<ns>/job/<name>/<controller-uid prefix>`). A
/// plain non-indexed Job is no gang (its pods are not ranks of one collective). The id is checked
/// against the gang-id rule by the caller.
pub(crate) fn gang_of_pod(
    namespace: Option<&str>,
    labels: &HashMap<String, String>,
    annotations: &HashMap<String, String>,
    worker_label: &str,
) -> Option<PodGang> {
    let get = |k: &str| labels.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let size_of =
        |v: Option<&String>| v.and_then(|n| n.trim().parse::<u32>().ok()).filter(|n| *n > 0);
    let gang = |id, size, source| Some(PodGang { id, size, source, ..Default::default() });
    if let Some(g) = get(&format!("{worker_label}{GANG_SUFFIX}")) {
        let size = size_of(labels.get(&format!("{worker_label}{GANG_SIZE_SUFFIX}")));
        // NB: the same scoping as a record's gang (`hang::policy_membership`), so a label and a
        // record naming `ml/run-1` agree.
        let id = namespace.map_or_else(|| g.to_string(), |ns| scoped(ns, g));
        return gang(id, size, "label");
    }
    // NB: a container outside Kubernetes (plain Docker) names its gang with the label only.
    let ns = namespace?;
    let ns = if ns.is_empty() { "default" } else { ns };
    if let Some(name) = get(keys::JOBSET_NAME) {
        let attempt = get(keys::JOBSET_RESTART).and_then(|a| a.parse().ok());
        let jobset_uid = get(keys::JOBSET_UID).map(|u| u.chars().take(8).collect());
        let id = format!("{ns}/jobset/{name}");
        return Some(PodGang { id, size: None, source: "jobset", attempt, jobset_uid });
    }
    if let Some(name) = get(keys::LWS_NAME) {
        let group = get(keys::LWS_GROUP).unwrap_or("0");
        let size = size_of(annotations.get(keys::LWS_SIZE));
        return gang(format!("{ns}/lws/{name}/{group}"), size, "lws");
    }
    let indexed = labels.contains_key(keys::JOB_INDEX) || annotations.contains_key(keys::JOB_INDEX);
    if let (Some(name), true) = (get(keys::JOB_NAME), indexed) {
        let uid: String = get(keys::JOB_UID).unwrap_or("").chars().take(8).collect();
        return gang(format!("{ns}/job/{name}/{uid}"), None, "job");
    }
    None
}

/// `value` in namespace `ns` (`""` is Kubernetes' `default`): `<ns>/<value>`, or `value` itself
/// when it already is in `ns`. A namespace has no `/`, so the first segment is always `ns`.
pub(crate) fn scoped(ns: &str, value: &str) -> String {
    let ns = if ns.is_empty() { "default" } else { ns };
    match value.strip_prefix(ns).and_then(|rest| rest.strip_prefix('/')) {
        Some(rest) if !rest.is_empty() => value.to_string(),
        _ => format!("{ns}/{value}"),
    }
}

/// The companion label of the opt-in label that hands a worker's restarts to someone else, and
/// the value that does it (`vigil.worker.restarts: alert-only`).
pub(crate) const RESTARTS_SUFFIX: &str = ".restarts";
pub(crate) const ALERT_ONLY: &str = "alert-only";

/// Whether `labels` say the worker's restarts belong to someone else.
pub(crate) fn alert_only(labels: &HashMap<String, String>, worker_label: &str) -> bool {
    labels.get(&format!("{worker_label}{RESTARTS_SUFFIX}")).is_some_and(|v| v.trim() == ALERT_ONLY)
}

/// A pod by namespace, name and uid (a uid tells two incarnations of one name apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodIdentity {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
}

/// Where a CRI container sits: its pod, its name in the pod, and which attempt it is (kubelet
/// restarts a container by creating the next attempt, a new container id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodRef {
    pub(crate) pod: PodIdentity,
    /// The pod sandbox's id in the runtime.
    pub(crate) sandbox: String,
    /// The container's name in the pod spec.
    pub(crate) container: String,
    pub(crate) attempt: u32,
    /// The pod's labels name a Job (`batch.kubernetes.io/job-name`): a polite exit 0 would
    /// complete its index, so a stop that cannot ask the API is a SIGKILL.
    pub(crate) job: bool,
}

impl Container {
    /// When the current incarnation started, in ms since the epoch, when the runtime says in a
    /// form that reads as a time: Docker's and Podman's RFC 3339 `StartedAt`, the CRI runtime's
    /// `attempt-<n>@<created_at in ns>`. `None` for anything else (never guessed).
    pub(crate) fn started_ms(&self) -> Option<i64> {
        if let Some((_, ns)) = self.started_at.split_once('@') {
            return ns.parse::<i64>().ok().map(|ns| ns / 1_000_000);
        }
        let t: jiff::Timestamp = self.started_at.parse().ok()?;
        // Docker says 0001-01-01T00:00:00Z for a container that never started.
        Some(t.as_millisecond()).filter(|ms| *ms > 0)
    }

    /// The pod this container runs for, by either runtime's account.
    pub(crate) fn pod_identity(&self) -> Option<PodIdentity> {
        self.pod.as_ref().map(|p| p.pod.clone()).or_else(|| self.kube_pod.clone())
    }

    /// How alerts, the trail and `vigil status` name it: `namespace/pod/container` on Kubernetes
    /// nodes, the container name on Docker.
    pub fn display(&self) -> String {
        match &self.pod {
            Some(p) => format!("{}/{}/{}", p.pod.namespace, p.pod.name, p.container),
            None => self.name.clone(),
        }
    }
}

/// The GPUs a container sees, from its Docker device requests (`--gpus`) or, failing that, its
/// `NVIDIA_VISIBLE_DEVICES` environment variable. `None` = all GPUs, or unknown.
pub(crate) fn visible_gpus(device_ids: Option<&[String]>, env: &[String]) -> Option<Vec<String>> {
    if let Some(ids) = device_ids.filter(|ids| !ids.is_empty()) {
        return Some(ids.iter().flat_map(|i| split_ids(i)).collect());
    }
    let value = env.iter().find_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="))?;
    match value.trim() {
        "all" => None,
        // The NVIDIA runtime's "no GPU" values: a CPU-only worker is on no GPU at all.
        "" | "void" | "none" => Some(Vec::new()),
        v => Some(split_ids(v)),
    }
}

fn split_ids(v: &str) -> Vec<String> {
    v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

/// A container `c1` of pod `ml/train-0` (container `trainer`, attempt 0), its labels naming a
/// Job or not: the CRI tests' worker.
#[cfg(test)]
pub(crate) fn in_pod(job: bool) -> Container {
    Container {
        id: "c1".into(),
        pod: Some(PodRef {
            pod: PodIdentity { namespace: "ml".into(), name: "train-0".into(), uid: "u".into() },
            sandbox: "s".into(),
            container: "trainer".into(),
            attempt: 0,
            job,
        }),
        ..Container::default()
    }
}

#[cfg(test)]
mod tests {
    use super::{visible_gpus, Container};

    /// A checkpoint label may be an `http(s)://` method with a token: a container shown
    /// (`{:?}` in a log, a test's failure) shows it redacted; the method reads it whole.
    #[test]
    fn a_container_shows_its_checkpoint_label_redacted() {
        let label = "http://w:8080/ckpt?token=s3cret";
        let c = Container { checkpoint: Some(label.into()), ..Container::default() };
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret") && shown.contains("token=***"), "{shown}");
        assert_eq!(c.checkpoint.as_ref().map(|l| l.expose()), Some(label));
    }

    #[test]
    fn a_start_time_is_read_from_docker_and_cri_and_never_guessed() {
        let at = |s: &str| Container { started_at: s.into(), ..Container::default() }.started_ms();
        assert_eq!(at("2026-12-02T07:00:00.123456789Z"), Some(1_796_194_800_123));
        assert_eq!(at("attempt-2@1796194800123456789"), Some(1_796_194_800_123));
        assert_eq!(at("0001-01-01T00:00:00Z"), None, "Docker's never started");
        assert_eq!(at("gen-3"), None);
        assert_eq!(at(""), None);
    }

    #[test]
    fn gpus_come_from_device_requests_then_the_environment() {
        let env = vec!["PATH=/bin".to_string(), "NVIDIA_VISIBLE_DEVICES=2,3".to_string()];
        assert_eq!(visible_gpus(None, &env), Some(vec!["2".into(), "3".into()]));
        let ids = vec!["GPU-aaa".to_string()];
        assert_eq!(visible_gpus(Some(&ids), &env), Some(vec!["GPU-aaa".into()]));
        assert_eq!(visible_gpus(None, &["NVIDIA_VISIBLE_DEVICES=all".into()]), None);
        assert_eq!(visible_gpus(None, &[]), None);
        let none = ["NVIDIA_VISIBLE_DEVICES=none".to_string()];
        assert_eq!(visible_gpus(None, &none), Some(vec![]));
    }
}

#[cfg(test)]
mod gang_tests {
    use super::*;
    use std::collections::HashMap;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn each_controller_s_pod_labels_name_a_namespaced_gang() {
        let none = HashMap::new();
        let l = "vigil.worker";
        let jobset = map(&[
            (keys::JOBSET_NAME, "llama"),
            (keys::JOBSET_RESTART, "2"),
            (keys::JOB_NAME, "llama-w-0"),
            (keys::JOB_INDEX, "1"),
        ]);
        let g = gang_of_pod(Some("ml"), &jobset, &none, l).unwrap();
        assert_eq!(
            (g.id.as_str(), g.size, g.source, g.attempt),
            ("ml/jobset/llama", None, "jobset", Some(2)),
            "the JobSet across its restarts, the attempt its incarnation"
        );
        let lws = map(&[(keys::LWS_NAME, "serve"), (keys::LWS_GROUP, "3")]);
        let g = gang_of_pod(Some("ml"), &lws, &map(&[(keys::LWS_SIZE, "4")]), l).unwrap();
        assert_eq!((g.id.as_str(), g.size), ("ml/lws/serve/3", Some(4)));
        let job =
            map(&[(keys::JOB_NAME, "pt"), (keys::JOB_UID, "0123456789ab"), (keys::JOB_INDEX, "0")]);
        assert_eq!(gang_of_pod(Some(""), &job, &none, l).unwrap().id, "default/job/pt/01234567");
        let plain = map(&[(keys::JOB_NAME, "pt"), (keys::JOB_UID, "0123456789ab")]);
        assert_eq!(gang_of_pod(Some("ml"), &plain, &none, l), None, "a plain Job is no gang");
        let explicit = map(&[
            ("vigil.worker.gang", "run-7"),
            ("vigil.worker.gang-size", "16"),
            (keys::JOBSET_NAME, "x"),
        ]);
        let g = gang_of_pod(Some("ml"), &explicit, &none, l).unwrap();
        assert_eq!((g.id.as_str(), g.size, g.source), ("ml/run-7", Some(16), "label"));
        assert_eq!(gang_of_pod(Some("ml"), &none, &none, l), None);
        let docker = map(&[("vigil.worker.gang", "run-7"), (keys::JOBSET_NAME, "x")]);
        assert_eq!(gang_of_pod(None, &docker, &none, l).unwrap().id, "run-7");
        assert_eq!(gang_of_pod(None, &map(&[(keys::JOBSET_NAME, "x")]), &none, l), None);
    }
}
