//! A worker pod's controllers read over real HTTP from the fake API server (tests/common/
//! fake_kube.rs), the production client (`KubePods`, `vigil::kube::workloads`) and the
//! production table (`vigil::vocab::workload::remediation`): the common JobSet shape, a JobSet
//! whose restarts are spent, an OnFailure Job's counted retries (its pods, listed by label), a
//! LeaderWorkerSet group, a missing RBAC rule; and the fake's RBAC is the ClusterRole of
//! deploy/base/rbac.yaml, rule for rule.

use crate::common;

use common::fake_kube::{FakeKube, ROLE};
use serde_json::{json, Value};
use vigil::kube::pods::{KubePods, PodApi, PodError};
use vigil::vocab::workload::{remediation, Remediation, Stops};

/// A pod of Job `job` (its controller), labelled as the Job controller labels it.
fn job_pod(name: &str, job: &str, uid: &str, policy: &str, restarts: u32) -> Value {
    json!({
        "metadata": {
            "name": name, "namespace": "ml",
            "labels": {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": job,
                "jobset.sigs.k8s.io/jobset-name": "train",
                "jobset.sigs.k8s.io/restart-attempt": "0"
            },
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid, "controller": true}]
        },
        "spec": {"restartPolicy": policy, "nodeName": "gpu-0", "containers": [{"name": "trainer", "image": "t"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "trainer", "restartCount": restarts}]}
    })
}

/// Job `train-workers-0` of JobSet `train` (four pods, `backoffLimit`).
fn job(backoff_limit: u32) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": "train-workers-0", "namespace": "ml", "uid": "u-0",
            "labels": {"jobset.sigs.k8s.io/replicatedjob-name": "workers"},
            "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train", "uid": "js", "controller": true}]
        },
        "spec": {"backoffLimit": backoff_limit, "parallelism": 4, "completions": 4, "completionMode": "Indexed"},
        "status": {"active": 4}
    })
}

fn jobset(max_restarts: u32, restarts: u32) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "train", "namespace": "ml", "uid": "js"},
        "spec": {
            "failurePolicy": {"maxRestarts": max_restarts, "rules": [
                {"name": "driver", "action": "FailJobSet", "targetReplicatedJobs": ["driver"]}
            ]},
            "replicatedJobs": [{"name": "workers", "replicas": 1}]
        },
        "status": {"restarts": restarts, "restartsCountTowardsMax": restarts}
    })
}

/// The common JobSet shape in `kube`: pod `train-workers-0-0` (`Never`) of Job `train-workers-0`
/// (`backoffLimit: 0`) of JobSet `train` (`maxRestarts: 3`, `restarts` spent).
fn common_jobset(kube: &FakeKube, restarts: u32) {
    let pod = job_pod("train-workers-0-0", "train-workers-0", "u-0", "Never", 0);
    kube.put_pod(pod);
    kube.put_object("batch", "jobs", job(0));
    kube.put_object("jobset.x-k8s.io", "jobsets", jobset(3, restarts));
}

async fn read(kube: &FakeKube, pod: &str) -> Result<Remediation, PodError> {
    let api = KubePods::connect(&kube.url).await.unwrap();
    let w = api.workload("ml", pod, "trainer").await?.expect("the pod exists");
    Ok(rem(&w))
}

#[tokio::test]
async fn the_common_jobset_shape_is_read_over_the_api_into_one_member_failed() {
    let kube = FakeKube::start("gpu-0").await;
    common_jobset(&kube, 1);
    let r = read(&kube, "train-workers-0-0").await.unwrap();
    assert!(matches!(r, Remediation::OneForAll { kill: true, .. }), "{r:?}");
    assert!(
        r.how().contains("JobSet ml/train restarts on it (restart 2 of maxRestarts 3)"),
        "{}",
        r.how()
    );
    // What it asked: the pod, its Job, the JobSet; nothing else (a Never Job's failures are
    // its status: its pods are listed only for an OnFailure Job, below).
    let asked: Vec<String> =
        kube.requests().into_iter().map(|(m, p, _)| format!("{m} {p}")).collect();
    assert_eq!(
        asked,
        [
            "GET /api/v1/namespaces/ml/pods/train-workers-0-0",
            "GET /apis/batch/v1/namespaces/ml/jobs/train-workers-0",
            "GET /apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/train",
        ]
    );
    // Its restarts spent: refused, and why.
    kube.put_object("jobset.x-k8s.io", "jobsets", jobset(3, 3));
    let r = read(&kube, "train-workers-0-0").await.unwrap();
    assert!(
        matches!(&r, Remediation::Refuse(why) if why.contains("restarts are spent (3 of maxRestarts 3)")),
        "{r:?}"
    );
}

#[tokio::test]
async fn an_on_failure_jobs_retries_are_counted_from_its_pods_and_never_spent_unseen() {
    let kube = FakeKube::start("gpu-0").await;
    let mut j = job(6);
    j["metadata"]["ownerReferences"] = json!([]);
    kube.put_object("batch", "jobs", j);
    kube.put_pod(job_pod("p-0", "train-workers-0", "u-0", "OnFailure", 1));
    kube.put_pod(job_pod("p-1", "train-workers-0", "u-0", "OnFailure", 0));
    // Another Job's pod in the namespace: not counted.
    kube.put_pod(job_pod("other", "other", "u-9", "OnFailure", 5));
    let r = read(&kube, "p-0").await.unwrap();
    // 1 retry + 4 pods < 6: in place, by a kill.
    assert!(matches!(r, Remediation::InPlace { kill: true, .. }), "{r:?}");
    assert!(r.how().contains("1 of 6 used"), "{}", r.how());
    kube.put_pod(job_pod("p-1", "train-workers-0", "u-0", "OnFailure", 1));
    let r = read(&kube, "p-0").await.unwrap();
    assert!(
        matches!(&r, Remediation::Refuse(why) if why.contains("would fail it partway")),
        "2 + 4 reaches 6 (2 + 1 does not): refused: {r:?}"
    );
    kube.put_pod(job_pod("p-1", "train-workers-0", "u-0", "OnFailure", 4));
    let r = read(&kube, "p-0").await.unwrap();
    assert!(
        matches!(&r, Remediation::Refuse(why) if why.contains("a stop fails Job train-workers-0")),
        "5 + 1 reaches 6, and no JobSet: {r:?}"
    );
}

#[tokio::test]
async fn a_leaderworkerset_group_is_read_from_the_pods_labels() {
    let kube = FakeKube::start("gpu-0").await;
    kube.put_pod(json!({
        "metadata": {"name": "serve-0-1", "namespace": "ml", "labels": {
            "leaderworkerset.sigs.k8s.io/name": "serve", "leaderworkerset.sigs.k8s.io/group-index": "0"
        }},
        "spec": {"containers": [{"name": "trainer", "image": "t"}]}
    }));
    kube.put_object(
        "leaderworkerset.x-k8s.io",
        "leaderworkersets",
        json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
               "metadata": {"name": "serve", "namespace": "ml"},
               "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4}}}),
    );
    let r = read(&kube, "serve-0-1").await.unwrap();
    assert!(matches!(r, Remediation::OneForAll { kill: false, .. }), "{r:?}");
    assert!(r.how().contains("LeaderWorkerSet ml/serve"), "{}", r.how());
}

#[tokio::test]
async fn an_owner_the_api_does_not_have_is_a_refusal_not_an_in_place_stop() {
    let kube = FakeKube::start("gpu-0").await;
    kube.put_pod(job_pod("train-workers-0-0", "train-workers-0", "u-0", "Never", 0));
    kube.put_object("batch", "jobs", job(0));
    // The JobSet the Job names is not there (deleted, or its CRD missing).
    let r = read(&kube, "train-workers-0-0").await.unwrap();
    assert!(
        matches!(&r, Remediation::Refuse(why) if why.contains("JobSet ml/train (uid js), which the API does not have")),
        "{r:?}"
    );
    // A pod that names a LeaderWorkerSet the API does not have: the same.
    kube.put_pod(json!({
        "metadata": {"name": "serve-0", "namespace": "ml", "labels": {"leaderworkerset.sigs.k8s.io/name": "serve"}},
        "spec": {"containers": [{"name": "trainer", "image": "t"}]}
    }));
    let r = read(&kube, "serve-0").await.unwrap();
    assert!(matches!(r, Remediation::Refuse(_)), "{r:?}");
}

/// An owner deleted and created again under its name is another object — its own
/// `backoffLimit`, its own counts — not the pod's controller (the pod's reference names the old
/// uid until the garbage collector removes the pod): refused like an owner the API does not
/// have, for a Job and for a Job's JobSet.
#[tokio::test]
async fn an_owner_created_again_under_its_name_is_not_the_pods_controller() {
    let kube = FakeKube::start("gpu-0").await;
    common_jobset(&kube, 0);
    let r = read(&kube, "train-workers-0-0").await.unwrap();
    assert!(matches!(r, Remediation::OneForAll { .. }), "the owners as the pod names them: {r:?}");
    let mut again = jobset(3, 0);
    again["metadata"]["uid"] = json!("js-2");
    kube.put_object("jobset.x-k8s.io", "jobsets", again);
    let r = read(&kube, "train-workers-0-0").await.unwrap();
    assert!(
        matches!(&r, Remediation::Refuse(why) if why.contains("JobSet ml/train (uid js; the API's is uid js-2, created again under its name), which the API does not have")),
        "{r:?}"
    );
    let mut job_again = job(6);
    job_again["metadata"]["uid"] = json!("u-1");
    kube.put_object("batch", "jobs", job_again);
    let r = read(&kube, "train-workers-0-0").await.unwrap();
    assert!(
        matches!(&r, Remediation::Refuse(why) if why.contains("Job ml/train-workers-0 (uid u-0; the API's is uid u-1, created again under its name), which the API does not have")),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_missing_rbac_rule_is_named_and_nothing_is_guessed() {
    let kube = FakeKube::start("gpu-0").await;
    common_jobset(&kube, 0);
    kube.forbid("get jobsets");
    let err = read(&kube, "train-workers-0-0").await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, PodError::Forbidden { verb: "get", resource: "jobsets", .. })
            && text.contains("needs `get` on `jobsets`"),
        "{text}"
    );
}

/// The (group, resource, verb) triples of the ClusterRole in `path` (repository-relative).
fn granted(path: &str) -> Vec<(String, String, String)> {
    let path = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let role: serde_yaml_ng::Value = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .find(|d: &serde_yaml_ng::Value| d["kind"] == "ClusterRole")
        .unwrap();
    let mut out = Vec::new();
    for rule in role["rules"].as_sequence().unwrap() {
        let list = |k: &str| -> Vec<String> {
            rule[k].as_sequence().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
        };
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    out.push((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out.sort();
    out
}

fn triples(role: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut out: Vec<_> =
        role.iter().map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string())).collect();
    out.sort();
    out
}

/// The fake authorizes exactly what deploy/base/rbac.yaml grants, and with the DRA device
/// taints exactly what their component adds: a rule added to one and not the other fails here,
/// so the fake never allows what a cluster would refuse.
#[test]
fn the_fakes_role_is_the_deployed_cluster_role() {
    assert_eq!(granted("deploy/base/rbac.yaml"), triples(ROLE));
    assert_eq!(
        granted("deploy/components/dra-device-taints/rbac.yaml"),
        triples(common::fake_kube::DRA_ROLE)
    );
}

fn rem(w: &vigil::vocab::workload::Workload) -> Remediation {
    remediation(w, Stops::EveryPod)
}
