//! End to end, a pod restarted the way its kubelet restarts it (issue 44, item 3): one `vigil
//! run` on a private real containerd, reading its node's fake API server, which holds the pods;
//! the test plays kubelet as the pods' specs say (`common::containerd::Restarts`): a `Never`
//! pod's container stays ended unless a restart rule (KEP-5307) names its exit code, an
//! `OnFailure` pod's container is restarted unless it exited 0. Each worker hangs for real (a
//! shell as PID 1 that ignores SIGTERM, or one that exits 0 at SIGTERM, as a polite trainer's
//! handler does).
//!
//! What an operator sees:
//! - a `Never` pod whose restart rule restarts exit 137: killed (no grace: its worker ends with
//!   143 at SIGTERM, which the rule does not match) and restarted in place by the rule; one
//!   `restarting` page;
//! - an `OnFailure` pod whose worker exits 0 at SIGTERM: killed, not stopped politely (an exit
//!   0 is a success to the kubelet: the container would never come back); restarted in place;
//! - a `Never` pod whose rule restarts only exit 42: nothing stopped, a `not-restartable` page
//!   saying why;
//! - a pod whose name the API holds for another pod (another uid: deleted and created again):
//!   nothing stopped, a `not-restartable` page naming both uids.

use crate::common;

use std::time::Duration;

use crate::e2e_jobset::config;
use common::containerd::{Containerd, Kubelet, Pod, Restarts};
use common::e2e::{worker_decisions, Setup};
use common::fake_kube::FakeKube;
use common::real::{
    beat, explain, poll, shared_redis_url, Receiver, VigilProcess, EXITS_ON_TERM, IGNORES_TERM,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const KILLED: i32 = 137;

/// A worker that ends with 143 at SIGTERM (a trainer's handler that exits with the signal's
/// code): a restart rule on 137 matches only a kill.
const EXITS_143_ON_TERM: &str =
    "trap 'exit 143' TERM; i=0; while true; do i=$((i+1)); echo step $i; sleep 1; done";

/// One worker: its pod on containerd, as the API server holds it, and how kubelet treats it.
struct Case {
    kind: &'static str,
    worker: String,
    pod: Pod,
}

/// Run `kind`'s pod (worker `script`) on containerd and publish it with `restartPolicy` and
/// the `main` container's `rules` (`restartPolicyRules`, with the container's own
/// `restartPolicy` as KEP-5307 requires beside them).
#[allow(clippy::too_many_arguments)]
async fn case(
    kubelet: &Kubelet,
    kube: &FakeKube,
    s: &Setup,
    kind: &'static str,
    script: &str,
    policy: &str,
    rules: Option<Value>,
    restarts: Restarts,
) -> Case {
    let worker = format!("{}-{kind}", s.worker);
    let name = format!("pod-{kind}");
    let pod =
        kubelet.run_pod(&name, &[(s.label.as_str(), &worker)], &[], &[("main", script)]).await;
    kubelet.set_restarts(&pod, restarts);
    let mut main = json!({"name": "main", "image": "busybox"});
    if let Some(r) = rules {
        main["restartPolicy"] = json!(policy);
        main["restartPolicyRules"] = r;
    }
    kube.put_pod(json!({
        "metadata": {"name": name, "namespace": "default", "uid": pod.uid(), "labels": {s.label.as_str(): worker}},
        "spec": {"restartPolicy": policy, "nodeName": s.node, "containers": [main]},
        "status": {"phase": "Running"}
    }));
    Case { kind, worker, pod }
}

fn restart_on(codes: &[i32]) -> Value {
    json!([{"action": "Restart", "exitCodes": {"operator": "In", "values": codes}}])
}

/// (attempt, running) of each container of `pod`.
async fn attempts(kubelet: &Kubelet, pod: &Pod) -> Vec<(u32, bool)> {
    let mut all: Vec<(u32, bool)> =
        kubelet.containers(pod).await.iter().map(|c| (c.2, c.3)).collect();
    all.sort();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pod_is_restarted_the_way_its_kubelet_restarts_it_or_left_alone() {
    let redis = shared_redis_url();
    let hook = Receiver::start().await;
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let s = Setup::new("e2e-kubelet");
    let kube = FakeKube::start(&s.node).await;
    let cfg = config(&s, &ctd, &kube, &hook.url);

    let rule = case(
        &kubelet,
        &kube,
        &s,
        "rule",
        EXITS_143_ON_TERM,
        "Never",
        Some(restart_on(&[KILLED])),
        Restarts::Never { rule_exit_codes: vec![KILLED] },
    )
    .await;
    let polite =
        case(&kubelet, &kube, &s, "polite", EXITS_ON_TERM, "OnFailure", None, Restarts::OnFailure)
            .await;
    let other = case(
        &kubelet,
        &kube,
        &s,
        "other",
        IGNORES_TERM,
        "Never",
        Some(restart_on(&[42])),
        Restarts::Never { rule_exit_codes: vec![42] },
    )
    .await;
    // An Always pod — restarted in place, were it this pod — whose name the API now holds for
    // another pod: deleted and created again (an LWS group, a StatefulSet), this container
    // the old pod's, its kubelet's to end.
    let again =
        case(&kubelet, &kube, &s, "again", IGNORES_TERM, "Always", None, Restarts::OnFailure).await;
    kube.put_pod(json!({
        "metadata": {"name": "pod-again", "namespace": "default", "labels": {s.label.as_str(): again.worker.as_str()}},
        "spec": {"restartPolicy": "Always", "nodeName": s.node, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Pending"}
    }));
    let first = kubelet.running(&rule.pod, "main").await.unwrap().0;
    let first_polite = kubelet.running(&polite.pod, "main").await.unwrap().0;

    // Each beats once, as processing, and never again: stale in 2 s, all four hung.
    for c in [&rule, &polite, &other, &again] {
        let args = ["--job", "job-42"];
        let (code, out, err) = beat(&cfg, &c.worker, "processing", &args, &[("REDIS_URL", &redis)]);
        assert_eq!(code, 0, "{out} {err}");
    }
    let agent = VigilProcess::spawn(&["run"], &cfg, &[("REDIS_URL", &redis)]);

    for c in [&rule, &polite] {
        let restarted = poll(Duration::from_secs(90), || {
            let (k, p) = (kubelet.clone(), c.pod.clone());
            async move { (attempts(&k, &p).await == [(0, false), (1, true)]).then_some(()) }
        })
        .await;
        assert!(
            restarted.is_some(),
            "{}: attempt 0 stopped by Vigil and attempt 1 started by the kubelet, saw {:?}\nagent log:\n{}",
            c.kind,
            attempts(&kubelet, &c.pod).await,
            agent.log_text()
        );
    }
    let refused = poll(Duration::from_secs(30), || {
        let n = hook.count("not-restartable");
        async move { (n >= 2).then_some(()) }
    })
    .await;
    assert!(refused.is_some(), "{:?}\n{}", hook.kinds(), agent.log_text());
    // Nothing more: the restarted attempts boot within their cooldown.
    tokio::time::sleep(Duration::from_secs(4)).await;

    for (id, kind) in [(&first, "rule"), (&first_polite, "polite")] {
        assert_eq!(
            kubelet.exit(id).await.0,
            KILLED,
            "{kind}: killed, so that the kubelet restarts it"
        );
    }
    assert_eq!(attempts(&kubelet, &other.pod).await, [(0, true)], "other: nothing stopped");
    assert_eq!(attempts(&kubelet, &again.pod).await, [(0, true)], "again: nothing stopped");
    let (code, trail, err) = explain(&cfg, &s.node, &[], &[("REDIS_URL", &redis)]);
    assert_eq!(code, 0, "{err}");
    for c in [&rule, &polite] {
        assert_eq!(
            worker_decisions(&trail, &c.worker, "restarted"),
            1,
            "{}: one restart\n{trail}",
            c.kind
        );
        assert_eq!(attempts(&kubelet, &c.pod).await, [(0, false), (1, true)]);
    }
    assert_eq!(worker_decisions(&trail, &other.worker, "restarted"), 0);
    assert_eq!(worker_decisions(&trail, &again.worker, "restarted"), 0);
    assert!(trail.contains("has the restart rule Restart on exit code 137"), "{trail}");
    let pages = hook.bodies.lock().unwrap().clone();
    let refusal = |c: &Case| {
        let of = |b: &&Value| {
            b["vigil"]["kind"] == "not-restartable" && b["vigil"]["worker"] == c.worker.as_str()
        };
        let page = pages.iter().find(of).unwrap_or_else(|| panic!("{}: no refusal page", c.kind));
        page["text"].as_str().unwrap_or_default().to_string()
    };
    let text = refusal(&other);
    assert!(text.contains("restartPolicy Never"), "{text}");
    let text = refusal(&again);
    assert!(text.contains("created again under its name"), "{text}");
    assert!(text.contains(again.pod.uid()), "the old pod's uid: {text}");
    assert_eq!(
        pages.iter().filter(|b| b["vigil"]["kind"] == "restarting").count(),
        2,
        "{:?}",
        hook.kinds()
    );
    stop.cancel();
}
