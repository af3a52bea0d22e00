//! A worker's pod and its owners from the Kubernetes API, as `crate::vocab::workload` reads
//! them: the pod (its `restartPolicy`, the worker container's own policy and restart rules), the
//! Job that controls it (its `backoffLimit`, `parallelism`, pod failure policy, and the retries
//! its controller has counted: failed pods, and the container restarts of its running pods when
//! they are `OnFailure`), the JobSet that controls that Job (its failure policy and restarts), or
//! the LeaderWorkerSet the pod's labels name (its restart policy); and the worker container's
//! devices the kubelet reports unhealthy (`allocatedResourcesStatus`).
//!
//! RBAC: `get` on `pods`, `jobs` (batch), `jobsets` (jobset.x-k8s.io) and `leaderworkersets`
//! (leaderworkerset.x-k8s.io); `list` on `pods` (a Job's pods, by its `controller-uid` label).
//! Read only while a worker is in trouble (suspect, hung or in error: for a gang member's entry
//! at most once a minute, `crate::runtime::cri_remediation`) and afresh right before its
//! restart, never for a healthy worker. The parsers are pure (JSON in, facts
//! out) and tested on the objects as the API serves them.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::Client;
use serde_json::Value;

use crate::kube::client::PodError;
use crate::vocab::workload::{
    keys, ExitCodes, FailureRule, JobFacts, JobSetFacts, LwsFacts, PodFailureRule, RestartPolicy,
    RestartRule, Workload,
};

/// The annotation of a static pod's mirror pod: the static pod's uid (its config hash).
const MIRROR: &str = "kubernetes.io/config.mirror";

/// The API server's default `backoffLimit`.
const DEFAULT_BACKOFF_LIMIT: u32 = 6;

/// What the API calls are about: group, version, kind and plural (the resource errors name).
struct Kind(&'static str, &'static str, &'static str, &'static str);

const PODS: Kind = Kind("", "v1", "Pod", "pods");
const JOBS: Kind = Kind("batch", "v1", "Job", "jobs");
const JOBSETS: Kind = Kind("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets");
const LWS: Kind = Kind("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets");

impl Kind {
    /// The objects of this kind in namespace `ns`.
    fn api(&self, client: &Client, ns: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(self.0, self.1, self.2);
        Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, self.3))
    }

    /// One object as JSON (`metadata`, `spec`, `status`); `None` when it does not exist.
    async fn get(&self, client: &Client, ns: &str, name: &str) -> Result<Option<Value>, PodError> {
        let o = PodError::bounded(self.api(client, ns).get_opt(name), "get", self.3).await?;
        Ok(o.and_then(|o| serde_json::to_value(o).ok()))
    }
}

/// A Job's pods, by its controller-uid label.
async fn job_pods(client: &Client, ns: &str, uid: &str) -> Result<Vec<Value>, PodError> {
    let params = ListParams::default().labels(&format!("{}={uid}", keys::JOB_UID));
    let list = PodError::bounded(PODS.api(client, ns).list(&params), "list", "pods").await?;
    Ok(list.items.into_iter().filter_map(|o| serde_json::to_value(o).ok()).collect())
}

/// The worker's pod and its owners; `None` when the pod is gone.
pub(crate) async fn read(
    client: &Client,
    ns: &str,
    name: &str,
    container: &str,
) -> Result<Option<Workload>, PodError> {
    let Some(pod) = PODS.get(client, ns, name).await? else { return Ok(None) };
    let mut w = pod_facts(&pod, container)?;
    if let Some(job_ref) = controller(&pod, "Job") {
        let Some(job) = owner(client, &JOBS, ns, &job_ref, "its Job", &mut w.missing).await? else {
            return Ok(Some(w));
        };
        // NB: only an OnFailure Job counts its pods' container restarts (a Never pod's
        // failures are the Job's status.failed): its pods are listed only then.
        let members = match w.policy {
            RestartPolicy::OnFailure => job_pods(client, ns, &job_ref.1).await?,
            _ => Vec::new(),
        };
        w.job = Some(job_facts(&job, w.policy, &members));
        if let Some(js_ref) = controller(&job, "JobSet") {
            let rj = label(&job, keys::REPLICATED_JOB).unwrap_or_default();
            let js = owner(client, &JOBSETS, ns, &js_ref, "its Job's JobSet", &mut w.missing);
            w.jobset = js.await?.map(|js| jobset_facts(&js, &rj));
        }
    }
    if let Some(lws_name) = label(&pod, keys::LWS_NAME) {
        let group = label(&pod, keys::LWS_GROUP).unwrap_or_default();
        match LWS.get(client, ns, &lws_name).await? {
            Some(lws) => w.lws = Some(lws_facts(&lws, &group)),
            None => w.missing = Some(format!("the LeaderWorkerSet {ns}/{lws_name}")),
        }
    }
    Ok(Some(w))
}

/// The name and uid of `o`'s controlling owner of `kind`.
fn controller(o: &Value, kind: &str) -> Option<(String, String)> {
    let refs = o["metadata"]["ownerReferences"].as_array()?;
    let r = refs.iter().find(|r| r["kind"] == kind && r["controller"] == true)?;
    Some((r["name"].as_str()?.to_string(), r["uid"].as_str().unwrap_or_default().to_string()))
}

/// The owner a reference names (`name`, `uid`), or `None`, `missing` then saying what the pod
/// names (`what`, its relation) that the API does not have: no object of that name, or another
/// one (its uid).
async fn owner(
    client: &Client,
    kind: &Kind,
    ns: &str,
    (name, uid): &(String, String),
    what: &str,
    missing: &mut Option<String>,
) -> Result<Option<Value>, PodError> {
    let found = kind.get(client, ns, name).await?;
    if found.as_ref().is_some_and(|o| same_uid(o, uid)) {
        return Ok(found);
    }
    *missing = Some(match found.as_ref().and_then(|o| o["metadata"]["uid"].as_str()) {
        Some(again) => format!(
            "{what} {ns}/{name} (uid {uid}; the API's is uid {again}, created again under its name)"
        ),
        None => format!("{what} {ns}/{name} (uid {uid})"),
    });
    Ok(None)
}

/// Whether `o` is the owner a reference names by `uid`: an owner deleted and created again
/// under its name is another object (its own limits and counts), not the pod's controller —
/// until the garbage collector removes the pod, the pod names an owner the API does not have.
fn same_uid(o: &Value, uid: &str) -> bool {
    o["metadata"]["uid"].as_str() == Some(uid)
}

/// `namespace/name` of an object.
fn qualified(o: &Value) -> String {
    let m = &o["metadata"];
    let (ns, name) = (m["namespace"].as_str(), m["name"].as_str());
    format!("{}/{}", ns.unwrap_or("default"), name.unwrap_or_default())
}

fn label(o: &Value, key: &str) -> Option<String> {
    o["metadata"]["labels"][key].as_str().map(str::to_string)
}

/// The elements of a JSON array; none when `v` is not one (absent, `null`).
fn items(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

fn strings(v: &Value) -> Vec<String> {
    items(v).filter_map(Value::as_str).map(str::to_string).collect()
}

/// A count as the API writes it, at most `u32::MAX`; `None` where it is absent (or no count).
fn count(v: &Value) -> Option<u32> {
    v.as_u64().map(|n| n.min(u64::from(u32::MAX)) as u32)
}

fn exit_codes(v: &Value) -> Option<ExitCodes> {
    let codes = v["values"].as_array()?.iter().filter_map(Value::as_i64);
    let values = codes.filter_map(|n| i32::try_from(n).ok()).collect();
    Some(ExitCodes { within: v["operator"] != "NotIn", values })
}

/// The pod's policy and the worker container's own policy and rules.
pub(crate) fn pod_facts(pod: &Value, container: &str) -> Result<Workload, PodError> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let raw = pod["spec"]["restartPolicy"].as_str();
    let policy =
        RestartPolicy::parse(raw).ok_or(PodError::UnknownPolicy(raw.map(str::to_string)))?;
    let mut w = Workload::bare(&format!("{ns}/{name}"), container, policy);
    // NB: a static pod's mirror in the API has a uid of its own; the kubelet (and the pod's
    // sandbox) knows the static pod by the uid the mirror annotation carries.
    let mirror = pod["metadata"]["annotations"][MIRROR].as_str();
    w.uid = mirror.or(pod["metadata"]["uid"].as_str()).map(str::to_string);
    if let Some(c) = items(&pod["spec"]["containers"]).find(|c| c["name"] == container) {
        w.container_policy =
            c["restartPolicy"].as_str().and_then(|p| RestartPolicy::parse(Some(p)));
        w.rules = items(&c["restartPolicyRules"])
            .map(|r| RestartRule {
                action: r["action"].as_str().unwrap_or_default().to_string(),
                exit_codes: exit_codes(&r["exitCodes"]),
            })
            .collect();
    }
    w.unhealthy = unhealthy_devices(pod, container);
    Ok(w)
}

/// The worker container's allocated devices the kubelet reports `Unhealthy` (KEP-4680:
/// `status.containerStatuses[].allocatedResourcesStatus[].resources[]`, beta in 1.36), each as
/// `<resource> <device>` (`nvidia.com/gpu GPU-…`, or `claim:<claim>/<request> <driver>/<pool>/<device>`
/// under DRA).
pub(crate) fn unhealthy_devices(pod: &Value, container: &str) -> Vec<String> {
    let status = items(&pod["status"]["containerStatuses"]).find(|c| c["name"] == container);
    let mut out = Vec::new();
    for res in status.into_iter().flat_map(|st| items(&st["allocatedResourcesStatus"])) {
        let name = res["name"].as_str().unwrap_or_default();
        for d in items(&res["resources"]).filter(|d| d["health"] == "Unhealthy") {
            out.push(format!("{name} {}", d["resourceID"].as_str().unwrap_or_default()));
        }
    }
    out
}

/// The Job's limits, pod failure policy and the retries its controller has counted, from the
/// Job and its pods.
pub(crate) fn job_facts(job: &Value, policy: RestartPolicy, pods: &[Value]) -> JobFacts {
    let spec = &job["spec"];
    // NB: the Job controller counts container restarts only of OnFailure pods still running or
    // pending; a Never pod's failure is in status.failed.
    let restarts: u32 = match policy {
        RestartPolicy::OnFailure => pods
            .iter()
            .filter(|p| matches!(p["status"]["phase"].as_str(), Some("Running" | "Pending")))
            .flat_map(|p| {
                [&p["status"]["containerStatuses"], &p["status"]["initContainerStatuses"]]
            })
            .flat_map(items)
            .map(|c| count(&c["restartCount"]).unwrap_or(0))
            .sum(),
        _ => 0,
    };
    let pod_failure = items(&spec["podFailurePolicy"]["rules"])
        .filter_map(|r| {
            let on = &r["onExitCodes"];
            Some(PodFailureRule {
                action: r["action"].as_str()?.to_string(),
                container: on["containerName"].as_str().map(str::to_string),
                exit_codes: exit_codes(on)?,
            })
        })
        .collect();
    JobFacts {
        name: job["metadata"]["name"].as_str().unwrap_or_default().to_string(),
        backoff_limit: count(&spec["backoffLimit"]).unwrap_or(DEFAULT_BACKOFF_LIMIT),
        parallelism: count(&spec["parallelism"]).unwrap_or(1),
        retries: count(&job["status"]["failed"]).unwrap_or(0).saturating_add(restarts),
        pod_failure,
        per_index: count(&spec["backoffLimitPerIndex"]),
    }
}

/// The JobSet failure policy's action that restarts it without counting against `maxRestarts`.
const IGNORES_MAX: &str = "RestartJobSetAndIgnoreMaxRestarts";

/// The JobSet's failure policy and the restarts it has spent.
pub(crate) fn jobset_facts(js: &Value, replicated_job: &str) -> JobSetFacts {
    let fp = &js["spec"]["failurePolicy"];
    let status = &js["status"];
    let rules: Vec<FailureRule> = items(&fp["rules"])
        .map(|r| FailureRule {
            name: r["name"].as_str().unwrap_or_default().to_string(),
            action: r["action"].as_str().unwrap_or_default().to_string(),
            reasons: strings(&r["onJobFailureReasons"]),
            targets: strings(&r["targetReplicatedJobs"]),
            on_message: !strings(&r["onJobFailureMessagePatterns"]).is_empty(),
        })
        .collect();
    // NB: restartsCountTowardsMax is what maxRestarts is checked against; an older
    // controller writes restarts only. Both are `omitempty`: absent is 0 where a rule
    // restarts without counting (that controller knows the field), else `restarts` (the
    // same count, or an older controller's): a preemption's restarts never spend the max.
    let restarts = match &status["restartsCountTowardsMax"] {
        Value::Null if rules.iter().any(|r| r.action == IGNORES_MAX) => 0,
        Value::Null => count(&status["restarts"]).unwrap_or(0),
        n => count(n).unwrap_or(0),
    };
    JobSetFacts {
        name: qualified(js),
        replicated_job: replicated_job.to_string(),
        max_restarts: fp.is_object().then(|| count(&fp["maxRestarts"]).unwrap_or(0)),
        rules,
        restarts,
        strategy: fp["restartStrategy"].as_str().unwrap_or("Recreate").to_string(),
    }
}

/// The LeaderWorkerSet's restart policy (`RecreateGroupOnPodRestart` where unset).
pub(crate) fn lws_facts(lws: &Value, group: &str) -> LwsFacts {
    let policy = lws["spec"]["leaderWorkerTemplate"]["restartPolicy"]
        .as_str()
        .unwrap_or("RecreateGroupOnPodRestart");
    let recreate_group = matches!(policy, "RecreateGroupOnPodRestart" | "RecreateGroupAfterStart");
    LwsFacts { name: qualified(lws), group: group.to_string(), recreate_group }
}

#[cfg(test)]
#[path = "workloads_tests.rs"]
mod tests;
