use serde_json::json;

use super::*;
use crate::vocab::workload::{remediation, Remediation, Stops};

/// A JobSet's worker pod as the API serves it (the Job controller's owner reference, JobSet's
/// labels), `restartPolicy: Never` as JobSet's failure policy wants it.
fn jobset_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "train-workers-0-0-abcde", "namespace": "ml",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "train",
                "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                "jobset.sigs.k8s.io/restart-attempt": "1",
                "batch.kubernetes.io/controller-uid": "u-1"
            },
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train-workers-0", "uid": "u-1", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {"restartPolicy": "Never", "containers": [{"name": "trainer", "image": "t"}, {"name": "sidecar", "image": "s"}]},
        "status": {"phase": "Running"}
    })
}

fn job(backoff: Option<u32>, failed: Option<u32>) -> Value {
    let mut j = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": "train-workers-0", "namespace": "ml", "uid": "u-1",
            "labels": {"jobset.sigs.k8s.io/replicatedjob-name": "workers"},
            "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train", "uid": "js-1", "controller": true}]
        },
        "spec": {"parallelism": 4, "completions": 4, "completionMode": "Indexed"},
        "status": {"active": 4}
    });
    if let Some(b) = backoff {
        j["spec"]["backoffLimit"] = json!(b);
    }
    if let Some(f) = failed {
        j["status"]["failed"] = json!(f);
    }
    j
}

#[test]
fn the_common_jobset_shape_reads_into_one_member_failed() {
    let mut w = pod_facts(&jobset_pod(), "trainer").unwrap();
    assert_eq!(w.pod, "ml/train-workers-0-0-abcde");
    assert_eq!(w.policy, RestartPolicy::Never);
    let owner = |o: &Value, kind| controller(o, kind).map(|(name, uid)| format!("{name} {uid}"));
    assert_eq!(owner(&jobset_pod(), "Job").as_deref(), Some("train-workers-0 u-1"));
    let j = job(Some(0), None);
    assert!(same_uid(&j, "u-1") && !same_uid(&j, "u-0"), "the owner a reference names");
    w.job = Some(job_facts(&j, w.policy, &[]));
    assert_eq!(owner(&j, "JobSet").as_deref(), Some("train js-1"));
    let js = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"failurePolicy": {"maxRestarts": 3, "rules": [
            {"name": "driverFails", "action": "FailJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"], "targetReplicatedJobs": ["driver"]}
        ]}},
        "status": {"restarts": 2, "restartsCountTowardsMax": 1}
    });
    let facts = jobset_facts(&js, &label(&j, keys::REPLICATED_JOB).unwrap());
    assert_eq!(facts.max_restarts, Some(3));
    assert_eq!(facts.restarts, 1, "restartsCountTowardsMax, not restarts");
    assert_eq!(facts.rules[0].targets, ["driver"]);
    // Both counts are `omitempty`: four preemption restarts that did not count leave
    // restartsCountTowardsMax absent, which is 0, not the 4 of restarts.
    let preempted = json!({
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"failurePolicy": {"maxRestarts": 3, "rules": [
            {"action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"]}
        ]}},
        "status": {"restarts": 4}
    });
    assert_eq!(jobset_facts(&preempted, "workers").restarts, 0);
    // Without such a rule the two counts are one: an older controller's `restarts` is read.
    let older = json!({"metadata": {"name": "t"}, "spec": {"failurePolicy": {"maxRestarts": 3}}, "status": {"restarts": 2}});
    assert_eq!(jobset_facts(&older, "workers").restarts, 2);
    w.jobset = Some(facts);
    let r = rem(&w);
    assert!(matches!(r, Remediation::OneForAll { kill: true, .. }), "{r:?}");
}

/// The pod's uid as its kubelet knows it: `metadata.uid`, and for a static pod's mirror the
/// static pod's (the mirror annotation), which its sandbox carries.
#[test]
fn a_pod_is_known_by_its_kubelet_uid() {
    let mut pod = jobset_pod();
    assert_eq!(pod_facts(&pod, "trainer").unwrap().uid, None, "a read that does not say");
    pod["metadata"]["uid"] = json!("9b1d-api");
    assert_eq!(pod_facts(&pod, "trainer").unwrap().uid.as_deref(), Some("9b1d-api"));
    pod["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "6f0c-static"});
    assert_eq!(pod_facts(&pod, "trainer").unwrap().uid.as_deref(), Some("6f0c-static"));
}

#[test]
fn absent_fields_take_the_api_defaults() {
    let j = job(None, None);
    let f = job_facts(&j, RestartPolicy::Never, &[]);
    assert_eq!((f.backoff_limit, f.parallelism, f.retries), (6, 4, 0));
    let js = jobset_facts(&json!({"metadata": {"name": "t"}, "spec": {}}), "w");
    assert_eq!(js.max_restarts, None, "no failurePolicy");
    let js = jobset_facts(&json!({"metadata": {"name": "t"}, "spec": {"failurePolicy": {}}}), "w");
    assert_eq!(js.max_restarts, Some(0), "an empty failurePolicy: maxRestarts 0");
    assert_eq!(js.strategy, "Recreate");
    let lws =
        lws_facts(&json!({"metadata": {"name": "s"}, "spec": {"leaderWorkerTemplate": {}}}), "0");
    assert!(lws.recreate_group, "RecreateGroupOnPodRestart is the default");
    let lws = lws_facts(
        &json!({"metadata": {"name": "s"}, "spec": {"leaderWorkerTemplate": {"restartPolicy": "None"}}}),
        "0",
    );
    assert!(!lws.recreate_group);
}

#[test]
fn an_on_failure_jobs_retries_are_its_running_pods_container_restarts() {
    let pod = |phase: &str, restarts: u32| json!({"status": {"phase": phase, "containerStatuses": [{"name": "trainer", "restartCount": restarts}], "initContainerStatuses": [{"name": "init", "restartCount": 1}]}});
    let pods = [pod("Running", 2), pod("Pending", 0), pod("Failed", 5)];
    let f = job_facts(&job(Some(10), Some(1)), RestartPolicy::OnFailure, &pods);
    // 1 failed + (2 + 1) + (0 + 1); the Failed pod's restarts are not counted again.
    assert_eq!(f.retries, 5);
    let f = job_facts(&job(Some(10), Some(1)), RestartPolicy::Never, &pods);
    assert_eq!(f.retries, 1, "a Never pod's failures are status.failed");
}

#[test]
fn a_containers_rules_and_a_jobs_pod_failure_policy_are_read() {
    let mut pod = jobset_pod();
    pod["spec"]["containers"][0]["restartPolicy"] = json!("Never");
    pod["spec"]["containers"][0]["restartPolicyRules"] = json!([
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [137, 42]}}
    ]);
    let w = pod_facts(&pod, "trainer").unwrap();
    assert_eq!(w.container_policy, Some(RestartPolicy::Never));
    assert_eq!(w.rules.len(), 1);
    assert!(w.rules[0].exit_codes.as_ref().unwrap().matches(137));
    let other = pod_facts(&pod, "sidecar").unwrap();
    assert!(other.rules.is_empty(), "the rules are the worker container's");
    let mut j = job(Some(0), None);
    j["spec"]["podFailurePolicy"] = json!({"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "NotIn", "values": [0]}}
    ]});
    let f = job_facts(&j, RestartPolicy::Never, &[]);
    assert_eq!(f.pod_failure.len(), 1, "a rule on pod conditions is no exit-code rule");
    assert_eq!(f.pod_failure[0].action, "FailJob");
    assert!(f.pod_failure[0].exit_codes.matches(137));
}

#[test]
fn an_unknown_restart_policy_is_an_error_not_a_guess() {
    let mut pod = jobset_pod();
    pod["spec"]["restartPolicy"] = json!("Sometimes");
    assert!(matches!(pod_facts(&pod, "trainer"), Err(PodError::UnknownPolicy(_))));
}

#[test]
fn the_kubelets_unhealthy_devices_are_read_and_refuse_the_restart() {
    let mut pod = jobset_pod();
    pod["status"]["containerStatuses"] = json!([
        {"name": "sidecar", "allocatedResourcesStatus": [
            {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-side", "health": "Unhealthy"}]}
        ]},
        {"name": "trainer", "restartCount": 0, "allocatedResourcesStatus": [
            {"name": "nvidia.com/gpu", "resources": [
                {"resourceID": "GPU-aaa", "health": "Healthy"},
                {"resourceID": "GPU-bbb", "health": "Unhealthy"},
                {"resourceID": "GPU-ccc", "health": "Unknown"}
            ]}
        ]}
    ]);
    pod["spec"]["restartPolicy"] = json!("Always");
    let w = pod_facts(&pod, "trainer").unwrap();
    assert_eq!(w.unhealthy, ["nvidia.com/gpu GPU-bbb"], "the worker container's, Unhealthy only");
    let r = rem(&w);
    assert!(
        matches!(&r, Remediation::Refuse(why) if why.contains("nvidia.com/gpu GPU-bbb Unhealthy")),
        "a restart in place keeps the device: {r:?}"
    );
    // A pod its Job replaces gets another device: not refused for it.
    let mut replaced = w.clone();
    replaced.policy = RestartPolicy::Never;
    replaced.job = Some(job_facts(&job(Some(6), None), RestartPolicy::Never, &[]));
    let r = rem(&replaced);
    assert!(matches!(r, Remediation::Replace { .. }), "{r:?}");
    assert!(pod_facts(&jobset_pod(), "trainer").unwrap().unhealthy.is_empty());
}

fn rem(w: &crate::vocab::workload::Workload) -> Remediation {
    remediation(w, Stops::EveryPod)
}
