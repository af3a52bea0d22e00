//! The worker API over a real unix socket: the peer's container proved from the kernel's view
//! of the caller (its cgroup, its init pid), and a beat's answer carrying the pending checkpoint
//! request.

use super::*;

/// The real unix socket and the real kernel: this test process is the peer, in no container
/// (or, under a containerised CI, in its own container, which runs no worker): refused either
/// way, with a reason.
#[tokio::test]
async fn a_unix_peer_that_is_not_the_worker_s_container_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker.sock");
    let worker = Container {
        id: "f".repeat(64),
        worker: "w0".into(),
        running: true,
        ..Container::default()
    };
    let state = socket_state(Listing::of(vec![worker]), Procfs::default());
    let (code, text) = beat_over_socket(&path, state, Procfs::default()).await;
    assert_eq!(code, 403);
    assert!(text.contains("w0"), "{text}");
}

/// Issue 26, finding 1: a cgroup named after a worker's container is not that container. The
/// kernel's peer is this test process; what `/proc` says of it and of the container's init
/// process is staged (the e2e test does it with real cgroups and a real container).
#[tokio::test]
async fn a_peer_in_a_cgroup_named_like_a_worker_s_container_is_refused() {
    const ID: &str = "6ed37ba8ec9fec0ce7670fc23a565b1560810e0ca46f53ce7af946197185cf5f";
    const INIT: i32 = 4_000_000;
    let me = std::process::id() as i32;
    let dir = tempfile::tempdir().unwrap();
    let proc = dir.path().join("proc");
    let stage = |pid: i32, cgroup: &str| {
        std::fs::create_dir_all(proc.join(pid.to_string())).unwrap();
        std::fs::write(proc.join(pid.to_string()).join("cgroup"), cgroup).unwrap();
    };
    stage(INIT, &format!("0::/system.slice/docker-{ID}.scope\n"));
    let worker =
        Container { id: ID.into(), worker: "w0".into(), running: true, ..Container::default() };
    let procfs = Procfs::at(&proc);
    let listing = || Listing(vec![worker.clone()], vec![(ID.to_string(), INIT)]);
    let cases = [
        (
            format!("0::/user.slice/user-1000.slice/docker-{ID}.scope\n"),
            403,
            "a node user's scope named like it",
        ),
        (
            format!("0::/system.slice/docker-{}.scope/{ID}\n", "7".repeat(64)),
            403,
            "a child cgroup of another container",
        ),
        (format!("0::/system.slice/docker-{ID}.scope\n"), 200, "the container's own cgroup"),
        (format!("0::/system.slice/docker-{ID}.scope/worker\n"), 200, "below it"),
    ];
    for (i, (cgroup, code, what)) in cases.iter().enumerate() {
        stage(me, cgroup);
        let state = socket_state(listing(), procfs.clone());
        let path = dir.path().join(format!("w{i}.sock"));
        let (got, text) = beat_over_socket(&path, state, procfs.clone()).await;
        assert_eq!(got, *code, "{what}: {text}");
        if *code == 403 {
            assert!(text.contains("not where the runtime runs it"), "{what}: {text}");
        }
    }
    // A runtime that names no init process: the claim cannot be proven, so it is not taken.
    stage(me, &format!("0::/system.slice/docker-{ID}.scope\n"));
    let state = socket_state(Listing::of(vec![worker.clone()]), procfs.clone());
    let (got, text) = beat_over_socket(&dir.path().join("x.sock"), state, procfs).await;
    assert_eq!(got, 503, "{text}");
}

fn socket_state(listing: Listing, procfs: Procfs) -> WorkerApiState {
    WorkerApiState {
        coord: Arc::new(MemoryCoordinator::new(Arc::new(SystemClock))),
        keys: Keys::new("vigil", "node-a"),
        metrics: Arc::new(Metrics::new()),
        directory: Arc::new(listing),
        tcp_auth: WorkerAuth::Kubernetes,
        reviewer: None,
        procfs,
        max_grace: Duration::from_secs(3600),
        reviews: WorkerApiState::review_budget(),
    }
}

/// Serve `state` on a unix socket at `path` (peers read from `procfs`), send one beat for `w0`
/// from this process, stop; the answer.
async fn beat_over_socket(
    path: &std::path::Path,
    state: WorkerApiState,
    procfs: Procfs,
) -> (u16, String) {
    let stop = CancellationToken::new();
    let peers = UnixPeers { listener: bind_unix(path).unwrap(), procfs };
    tokio::spawn(serve_router(peers, router(state), stop.clone(), crate::worker_api::LIMITS));
    let client = reqwest::Client::builder().unix_socket(path.to_path_buf()).build().unwrap();
    let r = client
        .put("http://vigil/v1/workers/w0/status")
        .body(r#"{"state":"processing"}"#)
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    let text = r.text().await.unwrap();
    stop.cancel();
    (code, text)
}

/// A worker on the API transport learns of a checkpoint request from the answer to its beat (or
/// a GET of its record), until it acknowledges that request; nobody else reads its record.
#[tokio::test]
async fn a_beat_answers_with_the_pending_checkpoint_request() {
    let listed = vec![
        pod_worker("trainer-0", "trainer-0", "uid-0"),
        pod_worker("trainer-1", "trainer-1", "uid-1"),
    ];
    let reviews = FakeReviews {
        known: vec![("tok-0".into(), pod_of("trainer-0", "uid-0"))],
        ..FakeReviews::default()
    };
    let api = start(WorkerAuth::Kubernetes, listed, reviews).await;
    let key = Keys::new("vigil", "node-a").status("trainer-0");
    let beat = r#"{"state":"processing"}"#;
    let (_, text) = put(&api, "trainer-0", Some("tok-0"), beat).await;
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(answer["heartbeat_ms"].as_i64().unwrap() > 0);
    assert!(answer.get("checkpoint_request").is_none(), "{answer}");
    // The agent asks for a checkpoint (as the checkpoint round writes it).
    let ask = [
        ("checkpoint_request".to_string(), "req-7".to_string()),
        ("checkpoint_reason".to_string(), "preemption".to_string()),
    ];
    api.coord.hset(&key, &ask, None).await.unwrap();
    let (_, text) = put(&api, "trainer-0", Some("tok-0"), beat).await;
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["checkpoint_request"], "req-7", "{answer}");
    assert_eq!(answer["checkpoint_reason"], "preemption");
    assert!(answer.get("checkpoint_drill").is_none(), "a notice's request: {answer}");
    // A drill's request says so.
    let drill = [("checkpoint_drill".to_string(), "1".to_string())];
    api.coord.hset(&key, &drill, None).await.unwrap();
    let (_, text) = put(&api, "trainer-0", Some("tok-0"), beat).await;
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["checkpoint_drill"], "1", "{answer}");
    // GET: the whole record, for its own worker only.
    let get = |worker: &str, token: &str| {
        reqwest::Client::new()
            .get(format!("{}/v1/workers/{worker}/status", api.url))
            .bearer_auth(token.to_string())
            .send()
    };
    let r = get("trainer-0", "tok-0").await.unwrap();
    assert_eq!(r.status(), 200);
    let record: serde_json::Value = r.json().await.unwrap();
    assert_eq!(record["checkpoint_request"], "req-7");
    assert_eq!(record["state"], "processing");
    assert_eq!(get("trainer-1", "tok-0").await.unwrap().status(), 403);
    assert_eq!(get("trainer-0", "nope").await.unwrap().status(), 401);
    // Acknowledged: no longer pending.
    let (_, text) = put(&api, "trainer-0", Some("tok-0"), r#"{"checkpoint_ack":"req-7"}"#).await;
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(answer.get("checkpoint_request").is_none(), "{answer}");
}
