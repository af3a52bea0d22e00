//! End-to-end on a Kubernetes node's runtime: the `vigil` binary as an operator runs it with
//! `runtime.kind = "cri"`, against a private real containerd (see `common::containerd`), the
//! test playing kubelet over the real CRI API, and the real Redis. Results are read the way an
//! operator reads them: the pod's container attempts, the webhook, `vigil explain`, the agent's
//! log, `/readyz`.
//!
//! The workers are really hung (issue 16): the stop grace (3 s) is longer than every per-call
//! deadline of the agent (`runtime.call_timeout` = 2 s), and two of the three workers only end
//! with the SIGKILL at the end of it.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::containerd::{Containerd, Kubelet, Pod};
use common::e2e::{worker_decisions, ConfigParts, Setup};
use common::fake_kube::FakeKube;
use common::real::{
    beat, eventually, explain, poll, run_cli, shared_redis_url, Receiver, VigilProcess,
    EXITS_ON_TERM, IGNORES_TERM,
};
use tokio_util::sync::CancellationToken;

/// The Setup's stop grace (`runtime.stop_grace`), longer than its `runtime.call_timeout` (2 s).
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Exit code of a process ended by SIGKILL.
const KILLED: i32 = 137;

impl Setup {
    /// The agent on the CRI socket `socket`, the Kubernetes API off (pods are replaced
    /// without reading their restartPolicy: kubelet here restarts every container), a breaker
    /// that would let a duplicate restart through (so a test sees it).
    fn cri_config(&self, socket: &Path, webhook: &str) -> PathBuf {
        self.write_config(ConfigParts {
            top: "",
            runtime: &format!(
                "kind = \"cri\"\ncri_socket = \"{}\"\nallow_pod_replacement = true\npod_resources_socket = \"\"\nlog_lines = 20",
                socket.display()
            ),
            policy: "cooldown = \"30s\"\nescalate_after = \"60s\"",
            tables: &format!(
                r#"[safety]
lock_ttl = "30s"
breaker_per_day = 5
[alerts]
webhook_url = "{webhook}"
attempts = 2
timeout = "2s"
[kubernetes]
enabled = "off"
[gpu]
enabled = "off"
[metadata]
enabled = "off"
"#
            ),
            ..ConfigParts::default()
        })
    }

    /// `vigil beat` for `worker`, once.
    fn beat_as(&self, config: &Path, redis: &str, worker: &str, state: &str) {
        let (code, out, err) =
            beat(config, worker, state, &["--job", "job-42"], &[("REDIS_URL", redis)]);
        assert_eq!(code, 0, "vigil beat failed: {out} {err}");
    }

    fn trail(&self, config: &Path, redis: &str) -> String {
        let (code, out, err) = explain(config, &self.node, &[], &[("REDIS_URL", redis)]);
        assert_eq!(code, 0, "vigil explain failed: {err}");
        out
    }
}

/// The worker's pod, opted in with the Setup's label.
async fn worker_pod(kubelet: &Kubelet, s: &Setup, pod: &str, worker: &str, script: &str) -> Pod {
    kubelet.run_pod(pod, &[(s.label.as_str(), worker)], &[], &[("main", script)]).await
}

/// (attempt, running) of each container of `pod`.
async fn attempts(kubelet: &Kubelet, pod: &Pod) -> Vec<(u32, bool)> {
    kubelet.containers(pod).await.iter().map(|c| (c.2, c.3)).collect()
}

/// The `restarting` alerts of `worker`.
fn restarting_alert(hook: &Receiver, worker: &str) -> Vec<serde_json::Value> {
    hook.bodies
        .lock()
        .unwrap()
        .iter()
        .filter(|b| b["vigil"]["kind"] == "restarting" && b["vigil"]["worker"] == worker)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_workers_on_containerd_are_each_restarted_exactly_once() {
    let redis = shared_redis_url();
    let hook = Receiver::start().await;
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let s = Setup::new("e2e-cri");
    let cfg = s.cri_config(&ctd.socket(), &hook.url);

    // (a) a shell as PID 1: SIGTERM is ignored (no handler), only SIGKILL ends it.
    // (b) a worker with a SIGTERM handler, frozen with SIGSTOP: the SIGTERM stays pending.
    // (c) a worker that exits at once on SIGTERM.
    let kinds = [("ignores", IGNORES_TERM), ("frozen", EXITS_ON_TERM), ("exits", EXITS_ON_TERM)];
    let mut workers = Vec::new();
    for (kind, script) in kinds {
        let worker = format!("{}-{kind}", s.worker);
        let pod = worker_pod(&kubelet, &s, &format!("pod-{kind}"), &worker, script).await;
        workers.push((kind, worker, pod));
    }
    // Let each write a few lines to its log file.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (first, _) = kubelet.running(&workers[1].2, "main").await.unwrap();
    let pid = kubelet.host_pid(&first).await;
    run_cli("kill", &["-STOP", &pid.to_string()], None);
    let first_ids: Vec<String> = {
        let mut ids = Vec::new();
        for (_, _, pod) in &workers {
            ids.push(kubelet.running(pod, "main").await.unwrap().0);
        }
        ids
    };

    // Each beats once, as processing, and never again: stale in 2 s, all three hung at once.
    for (_, worker, _) in &workers {
        s.beat_as(&cfg, &redis, worker, "processing");
    }
    let agent = VigilProcess::spawn(&["run"], &cfg, &[("REDIS_URL", &redis)]);

    for (kind, _, pod) in &workers {
        let mut seen = Vec::new();
        let restarted = poll(Duration::from_secs(90), || {
            let (k, p) = (kubelet.clone(), pod.clone());
            async move {
                let now = attempts(&k, &p).await;
                (now == vec![(0, false), (1, true)]).then_some(now)
            }
        })
        .await;
        if restarted.is_none() {
            seen = attempts(&kubelet, pod).await;
        }
        assert!(
            restarted.is_some(),
            "worker {kind}: attempt 0 stopped by Vigil and attempt 1 running, saw {seen:?}\nagent log:\n{}",
            agent.log_text()
        );
    }
    // Nothing more happens: the booting attempts are Vigil's own (cooldown), their records
    // still stale.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let log = agent.log_text();
    let trail = s.trail(&cfg, &redis);
    for (i, (kind, worker, pod)) in workers.iter().enumerate() {
        assert_eq!(
            attempts(&kubelet, pod).await,
            vec![(0, false), (1, true)],
            "worker {kind}: exactly one new attempt\n{trail}"
        );
        assert_eq!(
            worker_decisions(&trail, worker, "restarted"),
            1,
            "worker {kind}: one restarted entry\n{trail}"
        );
        let alerts = restarting_alert(&hook, worker);
        assert_eq!(alerts.len(), 1, "worker {kind}: {:?}", hook.kinds());
        let text = alerts[0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("step "), "worker {kind}: logs attached: {text}");
        assert_eq!(alerts[0]["vigil"]["container"], format!("default/pod-{kind}/main"));
        assert!(
            log.lines().any(|l| l.contains("restarted")
                && l.contains(worker.as_str())
                && l.contains("decision")),
            "worker {kind}: the agent's log says it restarted it:\n{log}"
        );

        // How attempt 0 ended: SIGKILL at the end of the grace for (a) and (b), its own exit
        // on SIGTERM for (c). A deadline cutting the stop short would have left it running.
        let (code, finished) = kubelet.exit(&first_ids[i]).await;
        match *kind {
            "exits" => assert_eq!(code, 0, "worker {kind} exited on SIGTERM"),
            _ => assert_eq!(code, KILLED, "worker {kind} ended by SIGKILL only"),
        }
        assert!(finished > 0, "worker {kind}: attempt 0 finished");
    }
    // (a) and (b) lived through the whole stop grace: they ended at least the grace after the
    // `restarting` alert, which is sent (and answered) before the stop begins. Load only makes
    // this longer.
    let alert_times = hook_times(&hook);
    for (i, (kind, worker, _)) in workers.iter().enumerate().take(2) {
        let (_, finished) = kubelet.exit(&first_ids[i]).await;
        let alerted = alert_times
            .iter()
            .find(|(w, _)| w == worker)
            .map(|(_, t)| *t)
            .unwrap_or_else(|| panic!("worker {kind}: no restarting alert time"));
        let lived = Duration::from_nanos(finished as u64).saturating_sub(alerted);
        assert!(
            lived >= STOP_GRACE - Duration::from_millis(500),
            "worker {kind} was killed {lived:?} after the restarting alert, before the stop grace ({STOP_GRACE:?})"
        );
    }
    assert_eq!(hook.count("restarting"), 3, "{:?}", hook.kinds());
    assert_eq!(hook.count("restart-failed"), 0, "{:?}", hook.kinds());
    assert_eq!(hook.count("breaker-open"), 0, "{:?}", hook.kinds());
    stop.cancel();
}

/// When each `restarting` alert arrived (since the epoch), by worker.
fn hook_times(hook: &Receiver) -> Vec<(String, Duration)> {
    let bodies = hook.bodies.lock().unwrap();
    let arrived = hook.arrived.lock().unwrap();
    bodies
        .iter()
        .zip(arrived.iter())
        .filter(|(b, _)| b["vigil"]["kind"] == "restarting")
        .filter_map(|(b, at)| {
            let w = b["vigil"]["worker"].as_str()?.to_string();
            Some((w, at.duration_since(SystemTime::UNIX_EPOCH).ok()?))
        })
        .collect()
}

/// A read-only bind mount of a directory (as a hostPath volume of type Directory with
/// `readOnly: true`), unmounted when dropped.
struct BindMount(PathBuf);

impl BindMount {
    fn read_only(src: &Path, dst: &Path) -> BindMount {
        std::fs::create_dir_all(dst).unwrap();
        let (src, dst_s) = (src.to_str().unwrap(), dst.to_str().unwrap());
        run_cli("mount", &["--bind", src, dst_s], None);
        let m = BindMount(dst.to_path_buf());
        run_cli("mount", &["-o", "remount,bind,ro", dst_s], None);
        m
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ =
            std::process::Command::new("umount").args(["-l", self.0.to_str().unwrap()]).status();
    }
}

/// `/readyz`'s status code and body, or None when the agent does not answer.
async fn readyz(s: &Setup) -> Option<(u16, String)> {
    let r = reqwest::get(s.url("/readyz")).await.ok()?;
    let code = r.status().as_u16();
    Some((code, r.text().await.unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containerd_restart_under_a_running_agent_is_survived() {
    let redis = shared_redis_url();
    let hook = Receiver::start().await;
    let mut ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let stop = CancellationToken::new();
    kubelet.restart_loop(stop.clone());
    let s = Setup::new("e2e-cri");
    // The agent reaches the socket as the DaemonSet's overlays mount it: its directory,
    // bind-mounted read-only (a restarted containerd makes a new socket file there; a mount of
    // the old file would keep the old, dead inode).
    let mounted = BindMount::read_only(ctd.socket().parent().unwrap(), &s.dir.path().join("run"));
    let cfg = s.cri_config(&mounted.0.join("containerd.sock"), &hook.url);
    let worker = s.worker.clone();
    let pod = worker_pod(&kubelet, &s, "pod-survivor", &worker, IGNORES_TERM).await;
    // Idle: never stale, until the test says it hangs.
    s.beat_as(&cfg, &redis, &worker, "idle");
    let mut agent = VigilProcess::spawn(&["run"], &cfg, &[("REDIS_URL", &redis)]);
    let pid = agent.child.id();

    let ready =
        poll(Duration::from_secs(20), || async { readyz(&s).await.filter(|r| r.0 == 200) }).await;
    assert!(ready.is_some(), "ready at first:\n{}", agent.log_text());

    // containerd dies (its containers' shims live on): the agent says the runtime is down.
    ctd.stop();
    let down =
        poll(Duration::from_secs(20), || async { readyz(&s).await.filter(|r| r.0 == 503) }).await;
    let (_, body) = down.unwrap_or_else(|| panic!("not ready while down:\n{}", agent.log_text()));
    assert!(body.contains("runtime:"), "{body}");
    let alerted = eventually(Duration::from_secs(20), || hook.count("runtime-down") == 1).await;
    assert!(alerted, "{:?}\n{}", hook.kinds(), agent.log_text());

    // It comes back on the same root and a new socket file: the same agent reconnects.
    ctd.restart();
    let back =
        poll(Duration::from_secs(30), || async { readyz(&s).await.filter(|r| r.0 == 200) }).await;
    assert!(
        back.is_some(),
        "ready again by itself: {:?}\n{}\ncontainerd:\n{}",
        readyz(&s).await,
        agent.log_text(),
        ctd.log()
    );
    assert!(agent.child.try_wait().unwrap().is_none(), "the agent never exited");
    assert_eq!(agent.child.id(), pid);
    assert_eq!(hook.count("runtime-down"), 1, "once per outage: {:?}", hook.kinds());
    let said = eventually(Duration::from_secs(10), || {
        agent.log_text().contains("container runtime reachable again")
    })
    .await;
    assert!(said, "the cycle saw it back:\n{}", agent.log_text());
    assert_eq!(attempts(&kubelet, &pod).await, vec![(0, true)], "untouched");

    // A hang after the restart is still restarted, once.
    s.beat_as(&cfg, &redis, &worker, "processing");
    let restarted = poll(Duration::from_secs(60), || {
        let (k, p) = (kubelet.clone(), pod.clone());
        async move { (attempts(&k, &p).await == vec![(0, false), (1, true)]).then_some(()) }
    })
    .await;
    assert!(
        restarted.is_some(),
        "restarted after the runtime came back: {:?}\n{}",
        attempts(&kubelet, &pod).await,
        agent.log_text()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(attempts(&kubelet, &pod).await, vec![(0, false), (1, true)], "exactly once");
    let trail = s.trail(&cfg, &redis);
    assert_eq!(worker_decisions(&trail, &worker, "restarted"), 1, "{trail}");
    assert_eq!(restarting_alert(&hook, &worker).len(), 1, "{:?}", hook.kinds());
    assert_eq!(hook.count("restart-failed"), 0, "{:?}", hook.kinds());
    stop.cancel();
}

/// `PUT` a status body to the worker API at `url`, with `token` as the bearer.
async fn put_status(url: &str, worker: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .put(format!("{url}/v1/workers/{worker}/status"))
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Issue 18 on a Kubernetes node: the `vigil` binary with `worker_api.auth = "kubernetes"`, the
/// fake API server reviewing tokens as the real one does, two worker pods on the private
/// containerd. Each pod's projected token (audience `vigil`, bound to it) writes its own worker
/// only; no token, a token for the API server's audience, a legacy token bound to no pod, a
/// revoked token and a token from another node are all refused; the metrics port takes no write;
/// and with the API server gone, a token not yet reviewed is refused with 503 (fail closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_worker_s_own_pod_may_write_its_status() {
    let redis = shared_redis_url();
    let ctd = Containerd::start();
    let kubelet = Kubelet::new(&ctd);
    let s = Setup::new("e2e-cri-auth");
    let kube = FakeKube::start(&s.node).await;
    let worker_api = format!(
        "[worker_api]\nlisten = \"{}\"\nauth = \"kubernetes\"\naudience = \"vigil\"\nreview_cache = \"1m\"\n",
        s.worker_listen
    );
    let cfg = s.write_config(ConfigParts {
        runtime: &format!(
            "kind = \"cri\"\ncri_socket = \"{}\"\npod_resources_socket = \"\"",
            ctd.socket().display()
        ),
        policy: "cooldown = \"30s\"\nescalate_after = \"60s\"",
        tables: &format!(
            "[safety]\nlock_ttl = \"90s\"\n[kubernetes]\nenabled = \"on\"\napi_url = \"{}\"\n[gpu]\nenabled = \"off\"\n[metadata]\nenabled = \"off\"\n",
            kube.url
        ),
        worker_api: &worker_api,
        ..ConfigParts::default()
    });
    let (a, b) = (format!("{}-a", s.worker), format!("{}-b", s.worker));
    let pod_a = worker_pod(&kubelet, &s, "pod-a", &a, IGNORES_TERM).await;
    let pod_b = worker_pod(&kubelet, &s, "pod-b", &b, IGNORES_TERM).await;
    let meta = |p: &Pod| {
        let m = p.config.metadata.clone().unwrap();
        (m.namespace, m.name, m.uid)
    };
    let ((ns, name_a, uid_a), (_, name_b, uid_b)) = (meta(&pod_a), meta(&pod_b));
    let token_a = kube.mint(&ns, Some((&name_a, &uid_a)), Some(&s.node), &["vigil"]);
    let token_b = kube.mint(&ns, Some((&name_b, &uid_b)), Some(&s.node), &["vigil"]);
    let api_audience = kube.mint(&ns, Some((&name_a, &uid_a)), Some(&s.node), &[]);
    let legacy = kube.mint(&ns, None, None, &["vigil"]);
    let elsewhere = kube.mint(&ns, Some((&name_a, &uid_a)), Some("another-node"), &["vigil"]);
    let revoked = kube.mint(&ns, Some((&name_a, &uid_a)), Some(&s.node), &["vigil"]);
    kube.revoke(&revoked);

    let agent = VigilProcess::spawn(&["run"], &cfg, &[("REDIS_URL", &redis)]);
    let url = s.worker_url("");
    let up = eventually(Duration::from_secs(20), || {
        std::net::TcpStream::connect(&s.worker_listen).is_ok()
    })
    .await;
    assert!(up, "{}", agent.log_text());
    let beating = r#"{"state":"processing","progress":"1"}"#;

    // The issue's two lines, on both listeners.
    for body in [r#"{"state":"error"}"#, r#"{"checkpoint_ack":"x"}"#] {
        let (code, text) = put_status(&url, &a, None, body).await;
        assert_eq!(code, 401, "{text}");
        let r = reqwest::Client::new()
            .put(s.url(&format!("/v1/workers/{a}/status")))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403);
    }
    // Each pod writes its own worker, and acknowledges for it.
    assert_eq!(put_status(&url, &a, Some(&token_a), beating).await.0, 200);
    assert_eq!(put_status(&url, &b, Some(&token_b), beating).await.0, 200);
    let ack = r#"{"checkpoint_ack":"req-1"}"#;
    assert_eq!(put_status(&url, &a, Some(&token_a), ack).await.0, 200);
    // ... and nobody else's.
    let (code, text) = put_status(&url, &b, Some(&token_a), r#"{"state":"error"}"#).await;
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("pod-b"), "{text}");
    for (what, token, want) in [
        ("the API server's audience", &api_audience, 401),
        ("a token bound to no pod", &legacy, 403),
        ("a token from another node", &elsewhere, 403),
        ("a revoked token", &revoked, 401),
        ("a made-up token", &"eyJhbGciOi.forged".to_string(), 401),
    ] {
        let (code, text) = put_status(&url, &a, Some(token), beating).await;
        assert_eq!(code, want, "{what}: {text}");
    }
    // `vigil beat` with the token file, as a shell worker would send it.
    let token_file = s.dir.path().join("token");
    std::fs::write(&token_file, &token_a).unwrap();
    let (code, out, err) = beat(
        &cfg,
        &a,
        "processing",
        &["--agent", &url, "--token-file", token_file.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    // The records hold what the workers wrote, and the refused writes changed nothing.
    let status = |w: &str| {
        run_cli(
            "redis-cli",
            &["-u", &redis, "hgetall", &format!("{}:{{{}}}:status:{w}", s.prefix, s.node)],
            None,
        )
    };
    let rec_a = status(&a);
    assert!(rec_a.contains("req-1") && rec_a.contains("processing"), "{rec_a}");
    assert!(!status(&b).contains("error"), "{}", status(&b));

    // The API server goes away: a token never reviewed is refused (503), never let through.
    let fresh = kube.mint(&ns, Some((&name_b, &uid_b)), Some(&s.node), &["vigil"]);
    drop(kube);
    let (code, text) = put_status(&url, &b, Some(&fresh), beating).await;
    assert_eq!(code, 503, "{text}");
    let metrics = s.metrics().await;
    for outcome in ["accepted", "unauthenticated", "forbidden", "unavailable"] {
        assert!(
            metrics.contains(&format!("listener=\"tcp\",outcome=\"{outcome}\"")),
            "{outcome}: {metrics}"
        );
    }
    assert!(!agent.log_text().contains(&token_a), "a token in the log");
}
