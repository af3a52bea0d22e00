//! The metadata watcher against the fake GCE metadata server, over real HTTP: the start-up read,
//! a scripted maintenance sequence seen in order through long-polls, faults that must never
//! crash the watcher or flip the phase, `preempted=FALSE` after a termination notice, the
//! watcher probing a server that is not there yet (with `metadata.enabled = on`, the start-up
//! read kept open meanwhile), and the fake's own fidelity (403s, ETags).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake_metadata::{upcoming_json, FakeMetadata, UnsetMode};
use common::real::free_port;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use vigil::maintenance::metadata::{
    watch_with, MetadataClient, MetadataError, WatchConfig, MAINTENANCE_EVENT_PATH,
    UPCOMING_MAINTENANCE_PATH,
};
use vigil::maintenance::policy::derive;
use vigil::metrics::Metrics;
use vigil::vocab::maintenance::{Phase, RawMetadata};

/// Short everything, so each test takes a few seconds at most.
fn cfg() -> WatchConfig {
    WatchConfig {
        timeout_sec: 1,
        unavailable_retry: (Duration::from_millis(20), Duration::from_millis(50)),
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        min_interval: Duration::from_millis(100),
        startup_attempts: 2,
        gce_known: false,
        warnings: None,
    }
}

const WITHIN: Duration = Duration::from_secs(5);

struct Running {
    rx: watch::Receiver<RawMetadata>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    /// Every distinct phase published, in order.
    phases: Arc<Mutex<Vec<Phase>>>,
}

fn client(host: &str) -> MetadataClient {
    MetadataClient::new(host, Duration::from_secs(2)).expect("client")
}

fn spawn_watch(host: &str) -> Running {
    spawn_watch_with(host, cfg())
}

fn spawn_watch_with(host: &str, cfg: WatchConfig) -> Running {
    let (tx, rx) = watch::channel(RawMetadata::default());
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(watch_with(client(host), tx, metrics.clone(), shutdown.clone(), cfg));
    let phases = Arc::new(Mutex::new(vec![Phase::None]));
    let (mut rec_rx, rec) = (rx.clone(), phases.clone());
    tokio::spawn(async move {
        while rec_rx.changed().await.is_ok() {
            let phase = derive(&rec_rx.borrow_and_update()).phase;
            let mut v = rec.lock().unwrap();
            if v.last() != Some(&phase) {
                v.push(phase);
            }
        }
    });
    Running { rx, metrics, shutdown, task, phases }
}

/// The fake server, and the watcher following it.
async fn started() -> (FakeMetadata, Running) {
    let fake = FakeMetadata::start().await;
    let w = spawn_watch(&fake.host);
    (fake, w)
}

/// [`started`], once the watcher has seen a pending maintenance.
async fn started_pending() -> (FakeMetadata, Running) {
    let (fake, mut w) = started().await;
    fake.set("upcoming-maintenance", &upcoming_json("PENDING", false)).await;
    w.until_phase(Phase::Pending).await;
    (fake, w)
}

impl Running {
    async fn until(&mut self, what: &str, f: impl FnMut(&RawMetadata) -> bool) {
        let seen = tokio::time::timeout(WITHIN, self.rx.wait_for(f)).await.map(|r| r.map(|_| ()));
        match seen {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("watch channel closed while waiting for {what}"),
            Err(_) => panic!("timed out waiting for {what}; now {:?}", *self.rx.borrow()),
        }
    }

    async fn until_phase(&mut self, phase: Phase) {
        self.until(phase.as_str(), |r| derive(r).phase == phase).await;
    }

    fn phase(&self) -> Phase {
        derive(&self.rx.borrow()).phase
    }

    fn phases(&self) -> Vec<Phase> {
        self.phases.lock().unwrap().clone()
    }

    fn errors(&self, key: &str, kind: &str) -> u64 {
        let text = self.metrics.encode();
        let needle = format!("{{key=\"{key}\",kind=\"{kind}\"}} ");
        text.lines()
            .find(|l| l.starts_with("vigil_metadata_errors_total") && l.contains(&needle))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(2), self.task)
            .await
            .expect("watcher stops promptly on shutdown")
            .expect("watcher task did not panic");
    }
}

#[tokio::test]
async fn startup_read_publishes_initial_values() {
    let (fake, mut w) = started().await;
    w.until("initial values", |r| {
        r.maintenance_event.map(|e| e.as_str()) == Some("NONE") && r.preempted == Some(false)
    })
    .await;
    assert!(fake.requests("maintenance-event").await >= 1);
    assert!(fake.requests("upcoming-maintenance").await >= 1);
    assert_eq!(w.rx.borrow().upcoming, None, "503 'no notifications' is nothing scheduled");
    assert_eq!(w.phase(), Phase::None);
    assert_eq!(fake.refused().await, 0, "the watcher always sends the header");
    w.stop().await;
}

#[tokio::test]
async fn scripted_sequence_is_seen_in_order_through_long_polls() {
    let (fake, mut w) = started().await;
    w.until("start-up read", |r| r.maintenance_event.is_some()).await;

    fake.set("upcoming-maintenance", &upcoming_json("PENDING", true)).await;
    w.until_phase(Phase::Pending).await;
    {
        let s = derive(&w.rx.borrow());
        assert!(s.can_reschedule, "can_reschedule arrives as the string \"true\"");
        assert_eq!(s.window_start.as_deref(), Some("2030-01-01T19:00:00Z"));
        assert_eq!(s.window_end.as_deref(), Some("2030-01-01T21:00:00Z"));
    }
    fake.set("upcoming-maintenance", &upcoming_json("ONGOING", false)).await;
    w.until_phase(Phase::Ongoing).await;
    fake.set("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE").await;
    w.until_phase(Phase::Terminating).await;
    assert_eq!(derive(&w.rx.borrow()).interruption.map(|i| i.as_str()), Some("host-maintenance"));
    fake.set("upcoming-maintenance", "").await;
    w.until("upcoming cleared", |r| r.upcoming.is_none()).await;
    assert_eq!(w.phase(), Phase::Terminating, "the event still stands");
    fake.set("maintenance-event", "NONE").await;
    w.until_phase(Phase::None).await;

    assert_eq!(
        w.phases(),
        vec![Phase::None, Phase::Pending, Phase::Ongoing, Phase::Terminating, Phase::None]
    );

    // Idle: long-polls with timeout_sec=1 are about one request per key per second, not a spin.
    let before = fake.total_requests().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = fake.total_requests().await - before;
    assert!(idle < 20, "{idle} requests in 3 s of idle: polling, not long-polling");
    assert!(idle >= 3, "{idle} requests in 3 s: the loops stopped polling");
    w.stop().await;
}

#[tokio::test]
async fn faults_never_crash_the_watcher_nor_flip_the_phase() {
    let (fake, mut w) = started_pending().await;

    for key in ["maintenance-event", "upcoming-maintenance", "preempted"] {
        fake.fault(key, "503", 5).await;
        fake.fault(key, "429", 2).await;
        fake.fault(key, "garbage", 3).await;
    }
    fake.fault("maintenance-event", "404", 1).await;
    fake.fault("preempted", "403", 1).await;

    // Every fault is consumed, then the watcher is still answering.
    tokio::time::timeout(WITHIN, async {
        while w.errors("upcoming-maintenance", "malformed") < 3
            || w.errors("maintenance-event", "not-found") < 1
            || w.errors("preempted", "forbidden") < 1
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("all faults seen");
    assert_eq!(w.phase(), Phase::Pending);
    {
        let raw = w.rx.borrow();
        assert_eq!(
            raw.maintenance_event.map(|e| e.as_str()),
            Some("NONE"),
            "BANANA never published"
        );
        assert_eq!(raw.preempted, Some(false), "MAYBE never published");
    }
    for key in ["maintenance-event", "upcoming-maintenance", "preempted"] {
        assert!(w.errors(key, "unavailable") >= 5, "{key} 503s counted");
        assert!(w.errors(key, "rate-limited") >= 2, "{key} 429s counted");
        assert!(w.errors(key, "malformed") >= 3, "{key} garbage counted");
    }
    assert_eq!(w.phases(), vec![Phase::None, Phase::Pending], "no false transition");

    // Still alive and listening.
    fake.set("upcoming-maintenance", &upcoming_json("ONGOING", false)).await;
    w.until_phase(Phase::Ongoing).await;
    assert!(!w.task.is_finished());
    w.stop().await;
}

#[tokio::test]
async fn preempted_false_after_terminate_keeps_terminating() {
    let (fake, mut w) = started().await;
    fake.set("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE").await;
    w.until_phase(Phase::Terminating).await;

    fake.set("preempted", "TRUE").await;
    w.until("preempted TRUE", |r| r.preempted == Some(true)).await;
    assert_eq!(derive(&w.rx.borrow()).interruption.map(|i| i.as_str()), Some("preemption"));

    fake.set("preempted", "FALSE").await;
    w.until("preempted FALSE", |r| r.preempted == Some(false)).await;
    let s = derive(&w.rx.borrow());
    assert_eq!(s.phase, Phase::Terminating, "FALSE must not clear the termination");
    assert_eq!(s.interruption.map(|i| i.as_str()), Some("host-maintenance"));
    assert_eq!(w.phases(), vec![Phase::None, Phase::Terminating]);
    w.stop().await;
}

#[tokio::test]
async fn upcoming_unset_in_either_form_and_404_mean_nothing_scheduled() {
    let (fake, mut w) = started_pending().await;

    fake.set_upcoming_unset_mode(UnsetMode::EmptyObject).await;
    fake.set("upcoming-maintenance", "").await;
    w.until_phase(Phase::None).await;

    fake.set("upcoming-maintenance", &upcoming_json("PENDING", false)).await;
    w.until_phase(Phase::Pending).await;
    // Two 404s in a row: nothing scheduled (one alone is a blip, see below).
    fake.fault("upcoming-maintenance", "404", 2).await;
    w.until_phase(Phase::None).await;
    assert_eq!(w.errors("upcoming-maintenance", "not-found"), 0, "404 is not an error here");
    w.stop().await;
}

/// The start-up read is over (`settled`) only once every key has answered — a 503 (sub-second
/// in host maintenance) or a 429 is no answer, its value may be the notice itself — or said it
/// is absent (404); and `settled` comes with the values, never before them.
#[tokio::test]
async fn the_start_up_read_settles_after_every_key_answered_never_on_a_503() {
    let fake = FakeMetadata::start().await;
    fake.set("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE").await;
    fake.fault("maintenance-event", "503", 3).await;
    fake.fault("preempted", "404", 1000).await;
    let mut w = spawn_watch(&fake.host);
    let mut seen = w.rx.clone();
    let early = tokio::time::timeout(WITHIN, async {
        loop {
            let raw = seen.borrow_and_update().clone();
            if raw.settled {
                return raw;
            }
            seen.changed().await.expect("the watcher runs");
        }
    })
    .await
    .expect("the start-up read settles");
    assert_eq!(
        early.maintenance_event.map(|e| e.as_str()),
        Some("MIGRATE_ON_HOST_MAINTENANCE"),
        "settled with the notice in, not on the 503s before it: {early:?}"
    );
    assert_eq!(early.preempted, None, "a 404 is absent, and read as such");
    assert!(w.errors("maintenance-event", "unavailable") >= 1);
    w.until("still settled", |r| r.settled).await;
    w.stop().await;
}

#[tokio::test]
async fn a_server_that_is_not_there_yet_is_probed_until_it_answers() {
    // A port that was just free: connection refused, as on a node whose network is not up yet
    // (or that is not on GCE at all).
    let port = free_port();
    let w = spawn_watch(&format!("127.0.0.1:{port}"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!w.task.is_finished(), "the watcher is not switched off");
    let not_on_gce = RawMetadata { settled: true, ..RawMetadata::default() };
    assert_eq!(
        *w.rx.borrow(),
        not_on_gce,
        "no values, and the start-up read over: restarts stop waiting for it"
    );
    let transport = {
        let text = w.metrics.encode();
        text.contains(r#"key="maintenance-event",kind="transport""#)
    };
    assert!(transport, "the failed start-up reads are counted");
    // The server comes up: the watcher finds it and watches.
    let fake =
        FakeMetadata::start_on(&format!("127.0.0.1:{port}")).await.expect("the port is still free");
    fake.set("preempted", "TRUE").await;
    let mut w = w;
    w.until("preempted seen", |r| r.preempted == Some(true)).await;
    w.stop().await;
}

/// A connect that hangs (a firewall that drops) is a server not reached, not one that did not
/// answer: it once ended as `Timeout`, since the connect's timeout was as long as a plain read's
/// deadline and the deadline fired first. Here the listener's accept queue is full, so the
/// kernel drops the SYN and the connect hangs, on loopback.
#[tokio::test]
async fn a_connect_that_hangs_is_unreachable_not_a_timeout() {
    use tokio::net::{TcpSocket, TcpStream};
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    // NB: never accepted: a backlog of 0 holds one connection (Linux), and the SYNs past the
    // queue's bound are dropped.
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    let connect = || tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr));
    while let Ok(Ok(stream)) = connect().await {
        queued.push(stream);
        assert!(queued.len() < 64, "the accept queue never filled");
    }
    let c = MetadataClient::new(&addr.to_string(), Duration::from_secs(1)).unwrap();
    let e = c.get(MAINTENANCE_EVENT_PATH, None).await.unwrap_err();
    assert!(matches!(e, MetadataError::Unreachable { .. }), "{e:?}");
    assert_eq!(e.kind(), "transport");
    assert!(e.to_string().contains("unreachable"), "{e}");
    drop((listener, queued));
}

/// `metadata.enabled = "on"`: the operator says this is GCE, so a server that cannot be reached
/// is late, not absent. Past the quick attempts it is probed with backoff and the start-up read
/// stays open (restarts keep waiting for it, up to `metadata.first_read_wait`); it ends once
/// every key has answered.
#[tokio::test]
async fn with_on_a_server_not_there_yet_never_ends_the_start_up_read_before_it_answers() {
    let port = free_port();
    let on = WatchConfig { startup_attempts: 2, ..cfg().enabled_on() };
    let mut w = spawn_watch_with(&format!("127.0.0.1:{port}"), on);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!w.task.is_finished(), "the watcher is not switched off");
    assert_eq!(*w.rx.borrow(), RawMetadata::default(), "no values, and the start-up read open");
    assert!(w.errors("maintenance-event", "transport") > 2, "probed on past the quick attempts");
    let fake =
        FakeMetadata::start_on(&format!("127.0.0.1:{port}")).await.expect("the port is still free");
    fake.set("preempted", "TRUE").await;
    w.until("every key read", |r| r.settled && r.preempted == Some(true)).await;
    w.stop().await;
}

#[tokio::test]
async fn shutdown_interrupts_a_held_long_poll() {
    let fake = FakeMetadata::start().await;
    let (tx, mut rx) = watch::channel(RawMetadata::default());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(watch_with(
        client(&fake.host),
        tx,
        Arc::new(Metrics::new()),
        shutdown.clone(),
        WatchConfig { timeout_sec: 30, ..cfg() },
    ));
    rx.wait_for(|r| r.preempted.is_some()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("stops without waiting out timeout_sec")
        .unwrap();
}

#[tokio::test]
async fn fake_refuses_requests_without_the_header_or_with_forwarded_for() {
    let fake = FakeMetadata::start().await;
    let url = format!("{}/computeMetadata/v1/{MAINTENANCE_EVENT_PATH}", fake.base_url());
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 403, "no Metadata-Flavor");
    let r = http
        .get(&url)
        .header("Metadata-Flavor", "Google")
        .header("X-Forwarded-For", "10.0.0.1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "X-Forwarded-For");
    assert_eq!(fake.refused().await, 2);
    assert_eq!(fake.requests("maintenance-event").await, 0);

    let r = http.get(&url).header("Metadata-Flavor", "Google").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["Metadata-Flavor"], "Google");
    assert!(r.headers().contains_key("ETag"));
    assert_eq!(r.text().await.unwrap(), "NONE");
}

#[tokio::test]
async fn client_long_poll_follows_etags() {
    let fake = FakeMetadata::start().await;
    let c = client(&fake.host);

    let first = c.get(MAINTENANCE_EVENT_PATH, None).await.unwrap();
    assert_eq!(first.value, "NONE");
    let etag = first.etag.clone().expect("ETag header");

    // A stale ETag returns at once with the current value.
    let t = tokio::time::Instant::now();
    let r = c.get(MAINTENANCE_EVENT_PATH, Some(("stale", 5))).await.unwrap();
    assert_eq!(r, first);
    assert!(t.elapsed() < Duration::from_secs(3));

    // The current ETag is held until timeout_sec, then the current value comes back.
    let t = tokio::time::Instant::now();
    let r = c.get(MAINTENANCE_EVENT_PATH, Some((&etag, 1))).await.unwrap();
    assert_eq!(r, first);
    assert!(t.elapsed() >= Duration::from_millis(900), "held for timeout_sec");

    // A change wakes the held request.
    let held = tokio::spawn({
        let c = c.clone();
        let etag = etag.clone();
        async move { c.get(MAINTENANCE_EVENT_PATH, Some((&etag, 10))).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    fake.set("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE").await;
    let r = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .expect("woken by the change")
        .unwrap()
        .unwrap();
    assert_eq!(r.value, "MIGRATE_ON_HOST_MAINTENANCE");
    assert_ne!(r.etag.as_deref(), Some(etag.as_str()));

    // Errors map to their kinds; unset upcoming is the recognisable 503.
    let e = c.get(UPCOMING_MAINTENANCE_PATH, None).await.unwrap_err();
    assert!(e.is_no_notifications_yet(), "{e}");
    fake.fault("preempted", "429", 1).await;
    let e = c.get("instance/preempted", None).await.unwrap_err();
    assert!(matches!(e, MetadataError::RateLimited { .. }), "{e}");
    assert_eq!(e.kind(), "rate-limited");
    let e = c.get("instance/no-such-key", None).await.unwrap_err();
    assert_eq!(e.kind(), "not-found");
}

/// The GKE metadata server of a Workload Identity pool answers, but has no maintenance-event:
/// that is blindness, not "no maintenance". It is said (for `/readyz`) while it lasts, with the
/// cause and the fix, and cleared when the key answers.
#[tokio::test]
async fn a_metadata_server_without_maintenance_event_is_a_standing_warning_not_no_maintenance() {
    let fake = FakeMetadata::start().await;
    // Eight answers in a row (a few seconds of backoff): long enough to be seen, then it ends.
    fake.fault("maintenance-event", "404", 8).await;
    let warnings = vigil::http::health::Warnings::default();
    let (tx, rx) = watch::channel(RawMetadata::default());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(watch_with(
        client(&fake.host),
        tx,
        Arc::new(Metrics::new()),
        shutdown.clone(),
        WatchConfig { warnings: Some(warnings.clone()), ..cfg() },
    ));
    let seen = common::real::eventually(WITHIN, || !warnings.lines().is_empty()).await;
    assert!(seen, "the 404 is reported");
    let line = warnings.lines().join("\n");
    assert!(
        line.contains("instance/maintenance-event (404)")
            && line.contains("Workload Identity")
            && line.contains("hostNetwork: true"),
        "{line}"
    );
    assert_eq!(rx.borrow().maintenance_event, None, "never read as NONE");
    // The faults run out (e.g. the pod now runs with the host network): the warning goes.
    let cleared =
        common::real::eventually(Duration::from_secs(10), || warnings.lines().is_empty()).await;
    assert!(cleared, "{:?}", warnings.lines());
    shutdown.cancel();
    let _ = task.await;
}

/// One empty answer between two PENDING answers (a blip) does not clear the notice: no
/// pending → none → pending flip. Two in a row do.
#[tokio::test]
async fn one_empty_answer_between_pending_answers_is_not_a_clearance() {
    let (fake, mut w) = started_pending().await;
    fake.set("upcoming-maintenance", "").await;
    fake.set("upcoming-maintenance", &upcoming_json("PENDING", false)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let phases = w.phases.lock().unwrap().clone();
    assert!(
        !phases.iter().skip_while(|p| **p != Phase::Pending).any(|p| *p == Phase::None),
        "no flip to none: {phases:?}"
    );
    // A real clearance: the key stays empty.
    fake.set("upcoming-maintenance", "").await;
    w.until_phase(Phase::None).await;
    w.stop().await;
}

/// The faults a metadata server shows besides error codes: a request held past the client's
/// timeout, an empty 200, an ETag the server forgot, and the server restarting (refusing
/// connections meanwhile, then answering with fresh ETags). Zero false maintenance transitions,
/// every fault counted, and the same watcher follows the next real change.
#[tokio::test]
async fn hangs_empty_answers_etag_resets_and_a_restart_never_flip_the_phase() {
    let (fake, mut w) = started_pending().await;
    for key in ["maintenance-event", "upcoming-maintenance", "preempted"] {
        fake.fault(key, "hang", 1).await;
        fake.fault(key, "reset-etag", 3).await;
    }
    fake.fault("maintenance-event", "empty", 2).await;
    fake.fault("preempted", "empty", 2).await;
    tokio::time::timeout(Duration::from_secs(15), async {
        while w.errors("maintenance-event", "timeout") < 1
            || w.errors("upcoming-maintenance", "timeout") < 1
            || w.errors("preempted", "timeout") < 1
            || w.errors("maintenance-event", "malformed") < 2
            || w.errors("preempted", "malformed") < 2
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("hangs time out and empty answers are counted as malformed");
    assert_eq!(w.phases(), vec![Phase::None, Phase::Pending]);

    // ETag resets: answered at once with the current value, no request storm.
    let before = fake.requests("preempted").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let polls = fake.requests("preempted").await - before;
    assert!(polls <= 10, "{polls} requests in 2 s with 1 s long polls: the watcher spins");

    // The server restarts on the same address: connections refused for a moment, then a fresh
    // server whose ETags are all new.
    let addr = fake.addr.to_string();
    drop(fake);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fake = FakeMetadata::start_on(&addr).await.expect("rebind");
    fake.set("upcoming-maintenance", &upcoming_json("PENDING", false)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        w.phases(),
        vec![Phase::None, Phase::Pending],
        "no false transition across the restart"
    );
    fake.set("upcoming-maintenance", &upcoming_json("ONGOING", false)).await;
    w.until_phase(Phase::Ongoing).await;
    assert!(!w.task.is_finished(), "recovered without restarting the agent");
    w.stop().await;
}
