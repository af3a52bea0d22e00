//! End-to-end, a JobSet restarted its controller's way (issue 44): four `vigil run` processes
//! (four node names, one Redis), each reading its node's Kubernetes API (the fake API server, one
//! per node, holding the same pods, Jobs and JobSet), one rank each on a private real
//! containerd, a shell as PID 1 that ignores SIGTERM. The test plays kubelet (a `Never` pod's
//! exited container stays exited; an `OnFailure` pod's is restarted in place unless it exited 0),
//! Job's controller (`backoffLimit: 0`: a failed `Never` pod, or one counted restart of an
//! `OnFailure` pod, fails the Job) and JobSet's as its failure policy documents it: with restarts
//! left, it deletes every pod and creates the next attempt (`restart-attempt` + 1).
//!
//! What an operator sees: one rank failed by Vigil (the one that stopped first, exit 137), one
//! JobSet restart, one `restarting` page saying so, the new attempt beating and nobody stopped
//! again.

use crate::common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::containerd::{Containerd, Kubelet, Pod};
use common::e2e::{decisions, ConfigParts, Setup};
use common::fake_kube::FakeKube;
use common::real::{
    beat, beat_first_then_together, explain, poll, shared_redis_url, unique, Receiver,
    VigilProcess, EXITS_ON_TERM, IGNORES_TERM,
};
use serde_json::json;

pub(crate) const RANKS: usize = 4;
pub(crate) const KILLED: i32 = 137;
/// The JobSet's `failurePolicy.maxRestarts`.
const MAX_RESTARTS: u32 = 3;

/// A rank: its node's setup, agent config and API server.
pub(crate) struct Rank {
    pub(crate) s: Setup,
    pub(crate) cfg: PathBuf,
    pub(crate) kube: FakeKube,
}

/// The JobSet as its controller keeps it, shared with the controller's task.
struct State {
    /// The pods' `restartPolicy`: `Never`, or `OnFailure` (kubelet restarts an exited container
    /// in place, and the Job counts the restart against `backoffLimit`).
    policy: &'static str,
    jobset: String,
    attempt: u32,
    /// `status.restarts` (= `restartsCountTowardsMax`: no rule ignores the max).
    restarts: u32,
    /// The current attempt's pods, by rank.
    pods: Vec<Pod>,
    /// (rank, attempt, container id, exit code) of every container the controller found exited.
    exited: Vec<(usize, u32, String, i32)>,
}

pub(crate) fn config(s: &Setup, ctd: &Containerd, kube: &FakeKube, hook: &str) -> PathBuf {
    s.write_config(ConfigParts {
        runtime: &format!(
            "kind = \"cri\"\ncri_socket = \"{}\"\npod_resources_socket = \"\"",
            ctd.socket().display()
        ),
        policy: "cooldown = \"60s\"\nescalate_after = \"120s\"",
        tables: &format!(
            "[safety]\nlock_ttl = \"30s\"\n[alerts]\nwebhook_url = \"{hook}\"\nattempts = 2\ntimeout = \"2s\"\n[kubernetes]\nenabled = \"on\"\napi_url = \"{}\"\n[gpu]\nenabled = \"off\"\n[metadata]\nenabled = \"off\"\n",
            kube.url
        ),
        ..ConfigParts::default()
    })
}

/// `RANKS` ranks (`rank-<i>`), each its own node name, agent config and API server, their
/// Redis keys under one prefix starting with `name`.
pub(crate) async fn ranks(name: &str, ctd: &Containerd, hook: &str) -> Vec<Rank> {
    let prefix = unique(name);
    let mut ranks = Vec::new();
    for i in 0..RANKS {
        let mut s = Setup::new(name);
        s.prefix = prefix.clone();
        s.worker = format!("rank-{i}");
        let kube = FakeKube::start(&s.node).await;
        let cfg = config(&s, ctd, &kube, hook);
        ranks.push(Rank { s, cfg, kube });
    }
    ranks
}

/// A `vigil run` per rank, on `redis`.
pub(crate) fn start_agents(ranks: &[Rank], redis: &str) -> Vec<VigilProcess> {
    ranks.iter().map(|r| VigilProcess::spawn(&["run"], &r.cfg, &[("REDIS_URL", redis)])).collect()
}

/// Every agent's log, one after the other.
pub(crate) fn logs_of(agents: &[VigilProcess]) -> String {
    agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n")
}

/// Rank `i`'s pod, Job and the JobSet of `attempt`, as the API serves them, in every node's API
/// server.
fn publish(ranks: &[Rank], st: &State, failed_rank: Option<usize>) {
    let js = &st.jobset;
    for r in ranks {
        for (i, rank) in ranks.iter().enumerate() {
            let job = format!("{js}-workers-{i}");
            let uid = format!("{job}-uid-{}", st.attempt);
            let failed = failed_rank == Some(i);
            let phase = match failed && st.policy == "Never" {
                true => "Failed",
                false => "Running",
            };
            // An OnFailure pod's container restarted in place by the kubelet: counted by the Job.
            let restarts = u32::from(failed && st.policy == "OnFailure");
            let mut labels = json!({
                "batch.kubernetes.io/controller-uid": uid,
                "jobset.sigs.k8s.io/jobset-name": js,
                "jobset.sigs.k8s.io/restart-attempt": st.attempt.to_string()
            });
            labels[rank.s.label.as_str()] = json!(rank.s.worker);
            r.kube.put_pod(json!({
                "metadata": {
                    "name": format!("{job}-0"), "namespace": "default", "uid": st.pods[i].uid(),
                    "labels": labels,
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid, "controller": true}]
                },
                "spec": {"restartPolicy": st.policy, "nodeName": rank.s.node, "containers": [{"name": "main", "image": "busybox"}]},
                "status": {"phase": phase, "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "", "ready": !failed, "restartCount": restarts}]}
            }));
            r.kube.put_object("batch", "jobs", json!({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {
                    "name": job, "namespace": "default", "uid": uid,
                    "labels": {"jobset.sigs.k8s.io/replicatedjob-name": "workers"},
                    "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": js, "uid": "js-uid", "controller": true}]
                },
                "spec": {"backoffLimit": 0, "parallelism": 1, "completions": 1, "completionMode": "Indexed"},
                "status": {"active": 1}
            }));
        }
        r.kube.put_object("jobset.x-k8s.io", "jobsets", json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": js, "namespace": "default", "uid": "js-uid"},
            "spec": {"failurePolicy": {"maxRestarts": MAX_RESTARTS}, "replicatedJobs": [{"name": "workers", "replicas": RANKS}]},
            "status": {"restarts": st.restarts, "restartsCountTowardsMax": st.restarts}
        }));
    }
}

/// The attempt's pods on containerd, one per rank, with JobSet's labels. `OnFailure` ranks exit
/// 0 at SIGTERM (a polite trainer's handler: to the kubelet, a success never restarted), so that
/// a stop other than a kill shows; `Never` ranks ignore it.
async fn run_pods(kubelet: &Kubelet, ranks: &[Rank], st: &State) -> Vec<Pod> {
    let script = match st.policy {
        "OnFailure" => EXITS_ON_TERM,
        _ => IGNORES_TERM,
    };
    let mut pods = Vec::new();
    let attempt = st.attempt.to_string();
    for (i, r) in ranks.iter().enumerate() {
        let labels = [
            (r.s.label.as_str(), r.s.worker.as_str()),
            ("jobset.sigs.k8s.io/jobset-name", st.jobset.as_str()),
            ("jobset.sigs.k8s.io/restart-attempt", attempt.as_str()),
            ("jobset.sigs.k8s.io/replicatedjob-name", "workers"),
        ];
        let name = format!("{}-workers-{i}-0", st.jobset);
        pods.push(kubelet.run_pod(&name, &labels, &[], &[("main", script)]).await);
    }
    pods
}

/// Every rank beats `processing`; rank 2 first, the others 200 ms later, together.
pub(crate) async fn beat_all(ranks: &[Rank], redis: &str, step: &str) {
    let beat_rank = |i: usize| {
        let r = &ranks[i];
        let args = ["--job", "train", "--progress", step];
        let (code, out, err) =
            beat(&r.cfg, &r.s.worker, "processing", &args, &[("REDIS_URL", redis)]);
        assert_eq!(code, 0, "{out} {err}");
    };
    beat_first_then_together(ranks.len(), 2, Duration::from_millis(200), beat_rank).await;
}

/// JobSet's controller, Job's and kubelet, every 200 ms: a rank whose container exited fails
/// its pod (`Never`) or is restarted in place by kubelet, which the Job counts (`OnFailure`:
/// with `backoffLimit: 0` the first restart fails it); its Job fails; the JobSet restarts
/// (every pod deleted, the next attempt created) while its restarts last.
fn control(
    kubelet: Kubelet,
    ranks: Arc<Vec<Rank>>,
    st: Arc<Mutex<State>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (pods, attempt) = {
                let s = st.lock().unwrap();
                (s.pods.clone(), s.attempt)
            };
            let mut failed = None;
            for (i, pod) in pods.iter().enumerate() {
                let all = kubelet.containers(pod).await;
                if let Some(c) = all.iter().find(|c| c.1 == "main" && !c.3) {
                    let (code, _) = kubelet.exit(&c.0).await;
                    if st.lock().unwrap().policy == "OnFailure" && code != 0 {
                        kubelet.start_attempt(pod, "main", c.2 + 1).await;
                    }
                    st.lock().unwrap().exited.push((i, attempt, c.0.clone(), code));
                    failed = Some(i);
                    break;
                }
            }
            let Some(i) = failed else { continue };
            {
                let s = st.lock().unwrap();
                publish(&ranks, &s, Some(i));
                if s.restarts >= MAX_RESTARTS {
                    return;
                }
            }
            // The JobSet restarts: its Jobs deleted (their pods with them), then recreated.
            for pod in &pods {
                for c in kubelet.containers(pod).await.into_iter().filter(|c| c.3) {
                    kubelet.stop(&c.0).await;
                }
            }
            let next = {
                let mut s = st.lock().unwrap();
                s.restarts += 1;
                s.attempt += 1;
                State {
                    policy: s.policy,
                    jobset: s.jobset.clone(),
                    attempt: s.attempt,
                    restarts: s.restarts,
                    pods: Vec::new(),
                    exited: Vec::new(),
                }
            };
            let new_pods = run_pods(&kubelet, &ranks, &next).await;
            let mut s = st.lock().unwrap();
            s.pods = new_pods;
            publish(&ranks, &s, None);
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_jobset_on_containerd_has_one_rank_failed_and_restarts_as_a_whole() {
    hung_jobset("Never", 0).await;
}

/// `backoffLimit: 0` with `OnFailure` pods: an in-place restart would fail the Job, so the
/// same single path — one rank killed (kubelet restarts it, the Job counts it and fails), one
/// JobSet restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_failure_jobset_with_no_backoff_left_takes_the_same_single_path() {
    hung_jobset("OnFailure", 0).await;
}

/// The JobSet's restarts are spent: failing a member would fail the JobSet. Nothing is stopped;
/// one `gang-blocked` page says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobset_whose_restarts_are_spent_is_left_alone_with_one_page() {
    hung_jobset("Never", MAX_RESTARTS).await;
}

/// A hung four-rank JobSet of `policy` pods that has restarted `restarts` times already.
async fn hung_jobset(policy: &'static str, restarts: u32) {
    let redis = shared_redis_url();
    let hook = Receiver::start().await;
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let ranks = Arc::new(ranks("jobset-cri", &ctd, &hook.url).await);
    let mut st = State {
        policy,
        jobset: unique("train-"),
        attempt: restarts,
        restarts,
        pods: Vec::new(),
        exited: Vec::new(),
    };
    st.pods = run_pods(&kubelet, &ranks, &st).await;
    publish(&ranks, &st, None);
    let gang = format!("default/jobset/{}", st.jobset);
    let st = Arc::new(Mutex::new(st));
    let controller = control(kubelet.clone(), ranks.clone(), st.clone());
    beat_all(&ranks, &redis, "100").await;
    let agents = start_agents(&ranks, &redis);
    let logs = || logs_of(&agents);

    if restarts >= MAX_RESTARTS {
        let blocked = poll(Duration::from_secs(90), || {
            let n = hook.count("gang-blocked");
            async move { (n >= 1).then_some(()) }
        })
        .await;
        assert!(blocked.is_some(), "{:?}\n{}", hook.kinds(), logs());
        // A few more cycles: nothing stopped, no second page.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let s = st.lock().unwrap();
        assert!(s.exited.is_empty(), "nothing stopped: {:?}", s.exited);
        assert_eq!(s.restarts, restarts, "no JobSet restart");
        drop(s);
        assert_eq!(hook.count("gang-blocked"), 1, "{:?}", hook.kinds());
        assert_eq!(hook.count("restarting"), 0, "{:?}", hook.kinds());
        let trails: String = ranks
            .iter()
            .map(|r| explain(&r.cfg, &r.s.node, &[], &[("REDIS_URL", &redis)]).1)
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(decisions(&trails, "restarted"), 0, "{trails}");
        let page = hook
            .bodies
            .lock()
            .unwrap()
            .iter()
            .find(|b| b["vigil"]["kind"] == "gang-blocked")
            .cloned()
            .unwrap();
        let text = page["text"].as_str().unwrap_or_default();
        assert!(text.contains("restarts are spent"), "{text}");
        controller.abort();
        return;
    }
    // The JobSet restarts once; the new attempt's ranks beat.
    let restarted = poll(Duration::from_secs(90), || {
        let st = st.clone();
        async move { (st.lock().unwrap().restarts >= 1).then_some(()) }
    })
    .await;
    assert!(restarted.is_some(), "the JobSet restarted:\n{}", logs());
    beat_all(&ranks, &redis, "101").await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        beat_all(&ranks, &redis, "102").await;
    }

    let s = st.lock().unwrap();
    assert_eq!(s.restarts, 1, "one JobSet restart:\n{}", logs());
    assert_eq!(
        s.exited.len(),
        1,
        "one rank's container exited before the JobSet acted: {:?}",
        s.exited
    );
    let (rank, attempt, _, code) = &s.exited[0];
    assert_eq!((*rank, *attempt, *code), (2, 0, KILLED), "rank 2 (first to stop), SIGKILL");
    drop(s);
    assert_eq!(hook.count("restarting"), 1, "{:?}", hook.kinds());
    let page = hook
        .bodies
        .lock()
        .unwrap()
        .iter()
        .find(|b| b["vigil"]["kind"] == "restarting")
        .cloned()
        .unwrap();
    assert_eq!(page["vigil"]["gang"], gang.as_str());
    let text = page["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("its controller restarts all 4 members") && text.contains("rank-2"),
        "{text}"
    );
    assert_eq!(hook.count("gang-blocked"), 0, "{:?}", hook.kinds());
    assert_eq!(hook.count("not-restartable"), 0, "{:?}", hook.kinds());
    let trails: String = ranks
        .iter()
        .map(|r| explain(&r.cfg, &r.s.node, &[], &[("REDIS_URL", &redis)]).1)
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(decisions(&trails, "gang-decided"), 1, "{trails}");
    assert_eq!(decisions(&trails, "restarted"), 1, "one rank failed by Vigil: {trails}");
    assert!(trails.contains("failed (SIGKILL, exit 137) for its controller"), "{trails}");
    controller.abort();
}
