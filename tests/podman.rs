//! `runtime.kind = podman`: the Docker adapter against a real Podman's Docker-compatible API (a
//! private `podman system service`, see `common::podman`). Listing, logs, a restart that
//! outlasts its own call, the event stream that keeps the listing's inspect cache true, and the
//! `vigil` binary restarting a hung worker end to end.

use crate::common;

use std::time::{Duration, Instant};

use common::e2e::{decisions, ConfigParts, Setup};
use common::podman::Podman;
use common::real::IGNORES_TERM as STUBBORN;
use common::real::{beat, eventually, explain, poll, shared_redis_url, Receiver, VigilProcess};
use vigil::runtime::docker::DockerRuntime;
use vigil::runtime::{Container, ContainerRuntime, RuntimeError};

const LABEL: &str = "vigil.worker";

/// The runtime on `podman`, the restart call bounded by `restart_deadline`, every other call
/// by 5 s (shorter than the stop graces below: the workers ignore SIGTERM). NB: not less: the
/// suites run side by side, and a loaded machine can keep Podman's answer past 2 s.
async fn runtime(podman: &Podman, restart_deadline: Duration) -> DockerRuntime {
    let rt = DockerRuntime::new(
        &format!("unix://{}", podman.socket().display()),
        true,
        LABEL,
        "vigil.checkpoint",
        restart_deadline,
        CALL_TIMEOUT,
    );
    connected(&rt).await;
    rt
}

/// Once `rt` holds its connection: its first call negotiates the API version, which a loaded
/// machine (the suites run side by side) kept past the 5 s deadline now and then (CI failed
/// on it); the calls the tests time come after, on the connection kept.
async fn connected(rt: &DockerRuntime) {
    let mut last = None;
    for _ in 0..6 {
        match rt.ping().await {
            Ok(()) => return,
            Err(e) => last = Some(e),
        }
    }
    panic!("podman never answered within 6 tries: {last:?}");
}

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_finds_only_opted_in_workers_and_reads_their_logs() {
    let podman = Podman::start();
    let gpus = "NVIDIA_VISIBLE_DEVICES=1,3";
    let worker = podman.run(&["--label", "vigil.worker=trainer-0", "--env", gpus], STUBBORN);
    let other_label = podman.run(&["--label", "team.worker=x"], STUBBORN);
    let unlabelled = podman.run(&[], STUBBORN);
    let rt = runtime(&podman, Duration::from_secs(30)).await;
    assert_eq!(rt.describe(), format!("podman at unix://{}", podman.socket().display()));
    rt.ping().await.expect("ping");

    let listed = rt.list_workers().await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    let w = &listed[0];
    assert_eq!((w.id.as_str(), w.worker.as_str()), (worker.as_str(), "trainer-0"));
    assert!(w.running && !w.paused, "{w:?}");
    // Podman reports no Docker device requests: the GPUs come from the environment.
    assert_eq!(w.gpus, Some(vec!["1".to_string(), "3".to_string()]));
    assert_eq!(w.started_at, podman.started_at(&worker));
    for id in [&other_label, &unlabelled] {
        assert!(rt.inspect(id).await.unwrap().is_none(), "{id} is no worker");
    }
    assert!(rt.inspect("no-such-container").await.unwrap().is_none());

    assert!(
        eventually(Duration::from_secs(10), || podman.cli(&["logs", &worker]).contains("step 3"))
            .await
    );
    let logs = rt.logs(&worker, 2).await.expect("logs");
    let lines: Vec<&str> = logs.lines().collect();
    assert_eq!(lines.len(), 2, "the last two lines: {logs:?}");
    assert!(lines.iter().all(|l| l.starts_with("step ")), "{logs:?}");
    // A checkpoint request by signal reaches it (PID 1 without a handler ignores it).
    rt.kill(&worker, "SIGUSR1").await.expect("kill");
    assert!(rt.inspect(&worker).await.unwrap().expect("a worker").running);

    // Podman's socket where Docker's would be (`runtime.kind = docker`): recognised by its
    // `/version`, and named so.
    let as_docker = DockerRuntime::new(
        &format!("unix://{}", podman.socket().display()),
        false,
        LABEL,
        "vigil.checkpoint",
        Duration::from_secs(30),
        CALL_TIMEOUT,
    );
    connected(&as_docker).await;
    assert_eq!(as_docker.list_workers().await.unwrap().len(), 1);
    assert!(as_docker.describe().starts_with("podman at "), "{}", as_docker.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_ignores_sigterm_is_killed_after_the_grace_and_restarted_once() {
    let podman = Podman::start();
    let id = podman.run(&["--label", "vigil.worker=trainer-0"], STUBBORN);
    let rt = runtime(&podman, Duration::from_secs(20)).await;
    let c = rt.inspect(&id).await.unwrap().expect("a worker");

    // The stop grace is honoured, longer than every call's deadline: SIGTERM is ignored,
    // SIGKILL comes after 6 s.
    let t0 = Instant::now();
    rt.restart(&c, Duration::from_secs(6)).await.expect("restart");
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(5_900), "{took:?}");
    let after = rt.successor(&c).await.unwrap().expect("still there");
    assert_eq!(after.id, c.id, "restarted in place");
    assert!(after.running, "{after:?}");
    assert_ne!(after.started_at, c.started_at, "a new incarnation");

    // A stop grace longer than the call's own deadline: the call gives up, Podman finishes the
    // restart on its own (a client that went away does not cancel it), and only once.
    let short = runtime(&podman, Duration::from_secs(2)).await;
    let err = short.restart(&after, Duration::from_secs(7)).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Timeout { op: "restart", .. }), "{err}");
    let restarted =
        eventually(Duration::from_secs(30), || podman.started_at(&id) != after.started_at).await;
    assert!(restarted, "Podman did not finish the restart:\n{}", podman.log());
    let third = podman.started_at(&id);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(podman.started_at(&id), third, "restarted twice");
    let now = rt.inspect(&id).await.unwrap().expect("a worker");
    assert!(now.running, "{now:?}");
}

/// The listing inspects each container once per incarnation while the event stream runs, and
/// Podman's events make every change visible. NB: with the `label=key` event filter Docker
/// takes, Podman 4.3 sends no event at all and the restart below would never be seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_events_keep_the_listing_cache_true() {
    let podman = Podman::start();
    let id = podman.run(&["--label", "vigil.worker=trainer-0"], STUBBORN);
    // Past the one second of events the stream replays (its start would drop the entry).
    // NB: a least age, not a wait for something to happen, so a loaded machine cannot beat it:
    // the container's events are written before `podman run` returns, and the stream replays
    // from at most 2 s before the first listing (`since` is in whole seconds), which a slow
    // machine only makes later.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let rt = runtime(&podman, Duration::from_secs(30)).await;
    let first = rt.list_workers().await.unwrap();
    assert_eq!(first.len(), 1);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let again = rt.list_workers().await.unwrap();
        assert_eq!(again[0].started_at, first[0].started_at);
    }
    assert_eq!(rt.listing_inspects(), 1, "cached while nothing happened");

    // Someone else's restart: a new start time, seen through the events.
    podman.cli(&["restart", "--time", "0", &id]);
    let seen = listed_until(&rt, |w| w.started_at != first[0].started_at).await;
    let seen = seen.expect("the restart's events made the new incarnation visible");
    assert_eq!(seen[0].started_at, podman.started_at(&id));

    podman.cli(&["pause", &id]);
    assert!(listed_until(&rt, |w| w.paused).await.is_some(), "the pause was seen");
    podman.cli(&["unpause", &id]);
    assert!(listed_until(&rt, |w| w.running).await.is_some(), "the unpause was seen");
    assert!(rt.listing_inspects() <= 10, "{} inspects", rt.listing_inspects());
}

/// `rt`'s listing once `seen` holds of its first worker, polled for up to 30 s; None if never.
/// NB: a bound, not a speed: an event reaches the stream in well under a second, but each
/// listing is a Podman call, and those take seconds on a loaded 2-core machine. Had the event
/// been missed, the cached entry would hide the change however long this polls.
async fn listed_until(
    rt: &DockerRuntime,
    seen: impl Fn(&Container) -> bool,
) -> Option<Vec<Container>> {
    let seen = &seen;
    poll(Duration::from_secs(30), || async move {
        let now = rt.list_workers().await.unwrap();
        seen(&now[0]).then_some(now)
    })
    .await
}

/// The binary with `runtime.kind = podman`: a worker that stops beating (and ignores SIGTERM)
/// is restarted exactly once, with the `restarting` alert carrying its logs and the trail's
/// `restarted`.
#[tokio::test(flavor = "multi_thread")]
async fn vigil_restarts_a_hung_podman_worker_exactly_once() {
    let redis = shared_redis_url();
    let podman = Podman::start();
    let hook = Receiver::start().await;
    let s = Setup::new("e2e-podman");
    let runtime = format!(
        "kind = \"podman\"\npodman_socket = \"{}\"\nlog_lines = 20",
        podman.socket().display()
    );
    let cfg = s.write_config(ConfigParts {
        runtime: &runtime,
        policy: "cooldown = \"30s\"\nescalate_after = \"60s\"",
        tables: &format!(
            "[safety]\nlock_ttl = \"30s\"\n[alerts]\nwebhook_url = \"{}\"\nattempts = 2\ntimeout = \"2s\"\n",
            hook.url
        ),
        // NB: Podman's service answers a listing in seconds on a loaded 2-core CI machine (a
        // CI run saw every call past 2 s for 30 s: runtime-down, no restart); the restart call
        // has its own deadline (runtime.restart_timeout + 5 s).
        call_timeout: "10s",
        ..ConfigParts::default()
    });
    let opt_in = format!("{}={}", s.label, s.worker);
    let id = podman.run(&["--label", &opt_in], STUBBORN);
    let before = podman.started_at(&id);
    let (code, out, err) =
        beat(&cfg, &s.worker, "processing", &["--job", "job-7"], &[("REDIS_URL", &redis)]);
    assert_eq!(code, 0, "vigil beat failed: {out} {err}");
    let agent = VigilProcess::spawn(&["run"], &cfg, &[("REDIS_URL", &redis)]);

    // NB: stale after 2 s, confirmed 0.5 s later, restarted 2 s after that with a 3 s stop
    // grace: some 8 s, but every Podman call can take seconds on a loaded machine.
    let restarted = eventually(Duration::from_secs(90), || podman.started_at(&id) != before).await;
    assert!(restarted, "no restart; agent log:\n{}", agent.log_text());
    let after = podman.started_at(&id);
    // The booting container with its stale record is left alone (cooldown).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(podman.started_at(&id), after, "restarted twice:\n{}", agent.log_text());

    assert_eq!(hook.count("restarting"), 1, "{:?}", hook.kinds());
    let bodies = hook.bodies.lock().unwrap().clone();
    let restarting = bodies.iter().find(|b| b["vigil"]["kind"] == "restarting").unwrap();
    assert!(restarting["text"].as_str().unwrap().contains("step "), "logs attached: {restarting}");
    let (code, trail, err) = explain(&cfg, &s.node, &[], &[("REDIS_URL", &redis)]);
    assert_eq!(code, 0, "vigil explain failed: {err}");
    assert_eq!(decisions(&trail, "restarted"), 1, "{trail}");
    let log = agent.log_text();
    assert!(log.contains("runtime.kind = podman"), "{log}");
    assert!(log.contains("podman at unix://"), "{log}");
}
