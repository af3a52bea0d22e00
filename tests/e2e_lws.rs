//! End to end, a LeaderWorkerSet group restarted its controller's way (issue 44): four `vigil
//! run` processes (four node names, one Redis), each reading its node's fake API server (the
//! group's pods and the LeaderWorkerSet, `restartPolicy` unset: `RecreateGroupOnPodRestart`), one
//! rank each on a private real containerd, a shell as PID 1 that ignores SIGTERM. The test plays
//! the LeaderWorkerSet controller: once a container of the group has ended, every pod of the
//! group is deleted and created again.
//!
//! What an operator sees: one member stopped as any stop goes (SIGTERM, the stop grace, then
//! SIGKILL: exit 137), the group recreated once, one `restarting` page for the group, the new
//! group beating and nobody stopped again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::containerd::{Containerd, Kubelet, Pod};
use crate::common::e2e::decisions;
use crate::common::real::{explain, poll, shared_redis_url, unique, Receiver, IGNORES_TERM};
use crate::e2e_jobset::{beat_all, logs_of, ranks, start_agents, Rank, KILLED, RANKS};
use serde_json::json;

/// The group as its controller keeps it, shared with the controller's task.
struct Group {
    lws: String,
    /// Times the group was recreated.
    generation: u32,
    pods: Vec<Pod>,
    /// (rank, generation, exit code) of every container the controller found ended.
    ended: Vec<(usize, u32, i32)>,
    /// When the first of them ended (CRI's `finished_at`, ns since the epoch).
    first_finished: Option<i64>,
}

/// The group's pods on containerd, one per rank, with the LeaderWorkerSet's labels and `size`.
async fn run_group(kubelet: &Kubelet, ranks: &[Rank], lws: &str) -> Vec<Pod> {
    let mut pods = Vec::new();
    for (i, r) in ranks.iter().enumerate() {
        let labels = [
            (r.s.label.as_str(), r.s.worker.as_str()),
            ("leaderworkerset.sigs.k8s.io/name", lws),
            ("leaderworkerset.sigs.k8s.io/group-index", "0"),
        ];
        let size = RANKS.to_string();
        let annotations = [("leaderworkerset.sigs.k8s.io/size", size.as_str())];
        let name = match i {
            0 => format!("{lws}-0"),
            _ => format!("{lws}-0-{i}"),
        };
        pods.push(kubelet.run_pod(&name, &labels, &annotations, &[("main", IGNORES_TERM)]).await);
    }
    pods
}

/// The group's pods and the LeaderWorkerSet, as every node's API server serves them.
fn publish(ranks: &[Rank], lws: &str, pods: &[Pod]) {
    for r in ranks {
        for (i, rank) in ranks.iter().enumerate() {
            let name = match i {
                0 => format!("{lws}-0"),
                _ => format!("{lws}-0-{i}"),
            };
            r.kube.put_pod(json!({
                "metadata": {
                    "name": name, "namespace": "default", "uid": pods[i].uid(),
                    "labels": {
                        rank.s.label.as_str(): rank.s.worker,
                        "leaderworkerset.sigs.k8s.io/name": lws,
                        "leaderworkerset.sigs.k8s.io/group-index": "0"
                    },
                    "annotations": {"leaderworkerset.sigs.k8s.io/size": RANKS.to_string()}
                },
                "spec": {"nodeName": rank.s.node, "containers": [{"name": "main", "image": "busybox"}]},
                "status": {"phase": "Running"}
            }));
        }
        r.kube.put_object(
            "leaderworkerset.x-k8s.io",
            "leaderworkersets",
            json!({
                "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                "metadata": {"name": lws, "namespace": "default"},
                "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": RANKS}}
            }),
        );
    }
}

/// The LeaderWorkerSet controller, every 200 ms: a container of the group that has ended (a pod
/// restart) recreates the whole group — every pod deleted, created again — once.
fn control(
    kubelet: Kubelet,
    ranks: Arc<Vec<Rank>>,
    g: Arc<Mutex<Group>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (pods, generation, lws) = {
                let g = g.lock().unwrap();
                (g.pods.clone(), g.generation, g.lws.clone())
            };
            let mut ended = None;
            for (i, pod) in pods.iter().enumerate() {
                if let Some(c) = kubelet.containers(pod).await.into_iter().find(|c| !c.3) {
                    ended = Some((i, kubelet.exit(&c.0).await));
                    break;
                }
            }
            let Some((i, (code, finished))) = ended else {
                continue;
            };
            {
                let mut g = g.lock().unwrap();
                g.ended.push((i, generation, code));
                g.first_finished.get_or_insert(finished);
            }
            if generation >= 1 {
                return;
            }
            for pod in &pods {
                for c in kubelet.containers(pod).await.into_iter().filter(|c| c.3) {
                    kubelet.stop(&c.0).await;
                }
            }
            let fresh = run_group(&kubelet, &ranks, &lws).await;
            publish(&ranks, &lws, &fresh);
            let mut g = g.lock().unwrap();
            g.pods = fresh;
            g.generation += 1;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_leaderworkerset_group_has_one_member_stopped_and_is_recreated() {
    let redis = shared_redis_url();
    let hook = Receiver::start().await;
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let ranks = Arc::new(ranks("lws-cri", &ctd, &hook.url).await);
    let lws = unique("serve-");
    let pods = run_group(&kubelet, &ranks, &lws).await;
    publish(&ranks, &lws, &pods);
    let g = Arc::new(Mutex::new(Group {
        lws: lws.clone(),
        generation: 0,
        pods,
        ended: Vec::new(),
        first_finished: None,
    }));
    let controller = control(kubelet.clone(), ranks.clone(), g.clone());
    beat_all(&ranks, &redis, "100").await;
    let agents = start_agents(&ranks, &redis);
    let logs = || logs_of(&agents);

    let recreated = poll(Duration::from_secs(90), || {
        let g = g.clone();
        async move { (g.lock().unwrap().generation >= 1).then_some(()) }
    })
    .await;
    assert!(recreated.is_some(), "the group was recreated:\n{}", logs());
    for step in ["101", "102", "103", "104", "105", "106"] {
        beat_all(&ranks, &redis, step).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
    }

    let ended = g.lock().unwrap().ended.clone();
    assert_eq!(
        ended,
        [(2, 0, KILLED)],
        "one member stopped (rank 2, the first to stop; SIGTERM ignored, so SIGKILL at the grace's end), nobody after:\n{}",
        logs()
    );
    assert_eq!(hook.count("restarting"), 1, "{:?}", hook.kinds());
    // The stop had its grace: the `restarting` page is sent (and answered) before the stop
    // begins, and the worker, which ignores SIGTERM, ended only with the SIGKILL at the
    // grace's end (3 s).
    let paged = {
        let bodies = hook.bodies.lock().unwrap();
        let i = bodies.iter().position(|b| b["vigil"]["kind"] == "restarting").unwrap();
        hook.arrived.lock().unwrap()[i]
    };
    let paged_ns = paged.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let finished = g.lock().unwrap().first_finished.unwrap();
    let waited = Duration::from_nanos((finished - paged_ns).max(0) as u64);
    assert!(
        waited >= Duration::from_millis(2_500),
        "the member ended {waited:?} after the page: SIGTERM and the stop grace first, not a kill"
    );
    let page = hook
        .bodies
        .lock()
        .unwrap()
        .iter()
        .find(|b| b["vigil"]["kind"] == "restarting")
        .cloned()
        .unwrap();
    assert_eq!(page["vigil"]["gang"], format!("default/lws/{lws}/0").as_str());
    assert_eq!(hook.count("gang-blocked"), 0, "{:?}", hook.kinds());
    let trails: String = ranks
        .iter()
        .map(|r| explain(&r.cfg, &r.s.node, &[], &[("REDIS_URL", &redis)]).1)
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(decisions(&trails, "gang-decided"), 1, "{trails}");
    assert_eq!(decisions(&trails, "restarted"), 1, "{trails}");
    controller.abort();
}
