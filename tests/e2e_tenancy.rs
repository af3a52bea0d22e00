//! End-to-end, a tenant speaks only for its own job (issue 41), tried as an attacker in another
//! namespace would on a Kubernetes node: a private real containerd (the test plays kubelet), a
//! JobSet `train` of two pods in namespace `ml` (its gang derived from the labels JobSet puts on
//! them), and a pod `imp` in namespace `research` whose worker writes its own record through the
//! worker API with its own bound token (TokenReview by the fake API server), naming ml's gang
//! and a size of 3, and beating `processing` all along. Three `vigil run` processes (three node
//! names) on one Redis.
//!
//! Before the fix the impostor joined ml's gang view: ml's two hung ranks were paged
//! `straggler`s and never restarted, a notice on the impostor's node opened a checkpoint round
//! for ml's job (asking ml's ranks, its budget the tightest of the three nodes), and the gang's
//! pages could be placed at the impostor. Now: both ranks restarted at once on one `hung` page
//! placed at an ml rank, the view holds ml's two members only, and the impostor's notice asks
//! only the impostor.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::containerd::{Containerd, Kubelet, Pod};
use common::e2e::{ConfigParts, Setup};
use common::fake_kube::FakeKube;
use common::fake_metadata::FakeMetadata;
use common::real::{
    beat, eventually, run_cli, shared_redis_url, unique, Receiver, VigilProcess, IGNORES_TERM,
};

use crate::e2e_gang::{cri_config, jobset_labels};

/// The impostor's node: the worker API with TokenReview, and a metadata server whose notice
/// the test sends. Its checkpoint budgets are the tightest of the three nodes.
fn imp_config(
    s: &Setup,
    socket: &Path,
    hook: &str,
    kube: &FakeKube,
    meta: &FakeMetadata,
) -> PathBuf {
    s.write_config(ConfigParts {
        runtime: &format!(
            "kind = \"cri\"\ncri_socket = \"{}\"\npod_resources_socket = \"\"",
            socket.display()
        ),
        policy: "cooldown = \"60s\"\nescalate_after = \"120s\"",
        tables: &format!(
            r#"[safety]
lock_ttl = "30s"
[alerts]
webhook_url = "{hook}"
attempts = 2
timeout = "2s"
[kubernetes]
enabled = "on"
api_url = "{kube}"
[gpu]
enabled = "off"
[metadata]
enabled = "on"
host = "{meta}"
timeout_sec = 2
settle = "1s"
[checkpoint]
preemption_budget = "2s"
maintenance_budget = "2s"
sigterm_budget = "2s"
"#,
            kube = kube.url,
            meta = meta.host,
        ),
        worker_api: &format!(
            "[worker_api]\nlisten = \"{}\"\nauth = \"kubernetes\"\naudience = \"vigil\"\nreview_cache = \"1m\"\n",
            s.worker_listen
        ),
        ..ConfigParts::default()
    })
}

fn hgetall(redis: &str, key: &str) -> String {
    run_cli("redis-cli", &["-u", redis, "hgetall", key], None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_of_another_namespace_cannot_join_block_or_misdirect_a_jobset_gang() {
    let redis = shared_redis_url();
    let hook = Receiver::start().await;
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = tokio_util::sync::CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let prefix = unique("tenancy");
    let jobset = unique("train-");
    let victim = format!("ml/jobset/{jobset}");
    let mut ranks: Vec<(Setup, PathBuf, Pod)> = Vec::new();
    for i in 0..2 {
        let mut s = Setup::new("tenancy");
        s.prefix = prefix.clone();
        s.worker = format!("rank-{i}");
        // A rank's agent: CRI, the Kubernetes API off (the pods' labels are all it knows).
        let cfg = cri_config(&s, &ctd.socket(), &hook.url);
        let labels = jobset_labels(&s, &jobset);
        let name = format!("{jobset}-workers-{i}");
        let pod = kubelet.run_pod_in("ml", &name, &labels, &[("main", IGNORES_TERM)]).await;
        ranks.push((s, cfg, pod));
    }
    // The impostor: its own namespace, its own node, its own pod and token.
    let mut imp = Setup::new("tenancy");
    imp.prefix = prefix.clone();
    imp.worker = "imp".into();
    let kube = FakeKube::start(&imp.node).await;
    let meta = FakeMetadata::start().await;
    let imp_cfg = imp_config(&imp, &ctd.socket(), &hook.url, &kube, &meta);
    let imp_pod = kubelet
        .run_pod_in("research", "imp", &[(imp.label.as_str(), "imp")], &[("main", IGNORES_TERM)])
        .await;
    let m = imp_pod.config.metadata.clone().unwrap();
    let token = kube.mint("research", Some((&m.name, &m.uid)), Some(&imp.node), &["vigil"]);
    let pods: Vec<Pod> = ranks.iter().map(|r| r.2.clone()).collect();
    let first = kubelet.running_ids(&pods, "main").await;
    // ml's ranks beat once (no gang in their records: the labels name it), rank 1 first.
    // NB: one after the other, so that rank 1's beat is the earlier (the `hung` page names the
    // first stopped); rank 0's, a process start later, is stale by the time rank 1 is confirmed
    // hung because `cri_config` gives the ranks a confirm_after of 1.5 s (else a straggler).
    for i in [1, 0] {
        let (s, cfg, _) = &ranks[i];
        let (code, out, err) =
            beat(cfg, &s.worker, "processing", &["--job", "train"], &[("REDIS_URL", &redis)]);
        assert_eq!(code, 0, "{out} {err}");
    }
    let mut agents: Vec<VigilProcess> = ranks
        .iter()
        .map(|(_, cfg, _)| VigilProcess::spawn(&["run"], cfg, &[("REDIS_URL", &redis)]))
        .collect();
    agents.push(VigilProcess::spawn(&["run"], &imp_cfg, &[("REDIS_URL", &redis)]));
    let logs = || agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n");
    let up = eventually(Duration::from_secs(20), || {
        std::net::TcpStream::connect(&imp.worker_listen).is_ok()
    })
    .await;
    assert!(up, "{}", logs());
    // The impostor names ml's gang and a size of 3 (a member "missing" would block), and beats
    // `processing` through the worker API, as a pod would, all along.
    let url = imp.worker_url("/v1/workers/imp/status");
    let put = |step: u64| {
        let body = format!(
            r#"{{"state":"processing","gang":"{victim}","gang_size":"3","progress":"{step}"}}"#
        );
        reqwest::Client::new()
            .put(&url)
            .bearer_auth(&token)
            .body(body)
            .timeout(Duration::from_secs(10))
            .send()
    };
    let first_answer = put(1).await.unwrap();
    assert_eq!(first_answer.status().as_u16(), 200);
    let answer: serde_json::Value = first_answer.json().await.unwrap();
    assert_eq!(
        answer["gang"],
        format!("research/{victim}"),
        "the agent knows the impostor by its own namespace's gang: {answer}"
    );
    let beating = stop.clone();
    let (url2, token2, victim2) = (url.clone(), token.clone(), victim.clone());
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        for step in 2.. {
            let body = format!(
                r#"{{"state":"processing","gang":"{victim2}","gang_size":"3","progress":"{step}"}}"#
            );
            let send = client.put(&url2).bearer_auth(&token2).body(body).send();
            tokio::select! {
                _ = beating.cancelled() => return,
                _ = send => {}
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });

    // ml's ranks hang together: both are restarted at once, whatever the impostor beats.
    let restarted = kubelet.all_restarted(&pods, "main", &first, Duration::from_secs(90)).await;
    assert!(restarted, "both ranks restarted (kinds {:?}):\n{}", hook.kinds(), logs());
    // Joining and blocking: ml's view holds ml's two members only; the impostor is in a gang of
    // its own namespace, alone.
    let view = hgetall(&redis, &format!("{prefix}:gang:{{{victim}#0}}:members"));
    assert!(view.contains("/rank-0") && view.contains("/rank-1"), "{view}");
    assert!(!view.contains("imp"), "the impostor joined ml's gang: {view}");
    let own = hgetall(&redis, &format!("{prefix}:gang:{{research/{victim}#0}}:members"));
    assert!(own.contains("/imp"), "{own}");
    // The pages: one `hung`, placed at an ml rank, naming ml's gang; no straggler, nothing
    // blocked by a missing third member.
    let bodies = hook.bodies.lock().unwrap().clone();
    let hung: Vec<&serde_json::Value> =
        bodies.iter().filter(|b| b["vigil"]["kind"] == "hung").collect();
    assert_eq!(hung.len(), 1, "{:?}", hook.kinds());
    assert_eq!(hung[0]["vigil"]["gang"], victim.as_str());
    assert_eq!(hung[0]["vigil"]["worker"], "rank-1", "{}", hung[0]);
    assert_eq!(hung[0]["vigil"]["node"], ranks[1].0.node.as_str());
    for kind in ["straggler", "gang-blocked"] {
        assert_eq!(hook.count(kind), 0, "{kind}: {:?}", hook.kinds());
    }
    assert!(!hung[0].to_string().contains("(0 members)"), "an unknown size says so: {}", hung[0]);

    // A termination notice on the impostor's node opens a round for its own gang only: ml's
    // ranks are not asked (and its 2 s budget is no member budget of ml's round).
    meta.set("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE").await;
    let status =
        |s: &Setup, w: &str| hgetall(&redis, &format!("{prefix}:{{{}}}:status:{w}", s.node));
    let asked =
        eventually(Duration::from_secs(30), || status(&imp, "imp").contains("checkpoint_request"))
            .await;
    assert!(asked, "the impostor's own round:\n{}", logs());
    for (s, _, _) in &ranks {
        let rec = status(s, &s.worker);
        assert!(
            !rec.contains("checkpoint_request"),
            "the impostor's notice asked ml's {}: {rec}",
            s.worker
        );
    }
    stop.cancel();
}
