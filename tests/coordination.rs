//! The coordination primitives, one suite run against both backends: the real Redis server and
//! the in-process coordinator. Any difference in semantics between them fails here.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::real::{free_port, run_cli, shared_redis_url, unique, wait_listening, RedisServer};
use common::redis_ha::{Cluster, Sentinel, SERVICE};
use vigil::clock::{Clock, FakeClock, SystemClock};
use vigil::coord::memory::MemoryCoordinator;
use vigil::coord::redis::RedisCoordinator;
use vigil::coord::Op;
use vigil::coord::{write_status, Coordinator, Keys};

/// How a backend lets time pass: the fake clock jumps, Redis really waits (briefly).
enum Time {
    Fake(FakeClock),
    Real,
}

impl Time {
    async fn pass(&self, d: Duration) {
        match self {
            Time::Fake(c) => c.advance(d),
            Time::Real => tokio::time::sleep(d).await,
        }
    }

    /// A TTL, a window or a step: `fake` ms on the fake clock, which is exact, `real` ms on a
    /// real server. NB: Redis counts from when each command lands, so on a loaded machine a slow
    /// round trip eats into a span the suite means to land inside: the real values leave it a
    /// second or more. A sleep that overshoots only lands later, past an expiry, as meant.
    fn ms(&self, fake: u64, real: u64) -> Duration {
        Duration::from_millis(match self {
            Time::Fake(_) => fake,
            Time::Real => real,
        })
    }
}

/// Add or refresh a member of a sorted-set index: a batch of one [`Op::IndexTouch`].
async fn index_touch(c: &dyn Coordinator, key: &str, member: &str, score: i64, prune_before: i64) {
    let op = Op::IndexTouch {
        key: key.to_string(),
        member: member.to_string(),
        score,
        prune_before: Some(prune_before),
    };
    c.batch(&[op]).await.unwrap();
}

async fn suite(c: &dyn Coordinator, time: Time, p: &str) {
    let k = |s: &str| format!("{p}:{{n}}:{s}");

    // Clock: the store's, in milliseconds since the epoch, near the real time.
    let t = c.time().await.unwrap();
    assert!(t > 1_700_000_000_000, "time is epoch ms: {t}");

    // SET NX: first writer wins, the value is never replaced.
    assert!(c.set_nx(&k("timer"), "100:a", Duration::from_secs(60)).await.unwrap());
    assert!(!c.set_nx(&k("timer"), "200:b", Duration::from_secs(60)).await.unwrap());
    assert_eq!(
        c.get_many(&[k("timer"), k("absent")]).await.unwrap(),
        vec![Some("100:a".to_string()), None]
    );

    // TTLs expire. NB: under a second on a real server too, as milliseconds: a TTL sent in
    // whole seconds would be `EX 0`, which Redis refuses.
    c.set(&k("short"), "x", time.ms(100, 700)).await.unwrap();
    assert!(c.get_many(&[k("short")]).await.unwrap()[0].is_some());
    time.pass(time.ms(250, 1_200)).await;
    assert!(c.get_many(&[k("short")]).await.unwrap()[0].is_none());
    assert!(
        c.set_nx(&k("short"), "y", Duration::from_secs(5)).await.unwrap(),
        "free again after expiry"
    );

    // The lock: owner TTL, compare-and-delete.
    assert!(c.set_nx(&k("lock"), "tok-1", Duration::from_secs(30)).await.unwrap());
    let ttl = c.owner_ttl(&k("lock"), "tok-1").await.unwrap().unwrap();
    assert!(ttl > 25_000 && ttl <= 30_000, "{ttl}");
    assert_eq!(c.owner_ttl(&k("lock"), "tok-2").await.unwrap(), None);
    assert!(!c.del_if_owner(&k("lock"), "tok-2").await.unwrap(), "never release another's lock");
    // Compare-and-renew: the owner's lease is renewed; another's token renews nothing.
    let ten = Duration::from_secs(10);
    assert!(!c.renew_if_owner(&k("lock"), "tok-2", ten).await.unwrap());
    let kept = c.owner_ttl(&k("lock"), "tok-1").await.unwrap().unwrap();
    assert!(kept > 10_000, "not shortened by another's renewal: {kept}");
    assert!(c.renew_if_owner(&k("lock"), "tok-1", ten).await.unwrap());
    let renewed = c.owner_ttl(&k("lock"), "tok-1").await.unwrap().unwrap();
    assert!(renewed > 5_000 && renewed <= 10_000, "{renewed}");
    assert!(!c.renew_if_owner(&k("absent"), "tok-1", ten).await.unwrap());
    assert!(c.get_many(&[k("absent")]).await.unwrap()[0].is_none());
    assert!(c.owner_ttl(&k("lock"), "tok-1").await.unwrap().is_some());
    assert!(c.del_if_owner(&k("lock"), "tok-1").await.unwrap());
    assert_eq!(c.owner_ttl(&k("lock"), "tok-1").await.unwrap(), None);

    // The capped counter (breaker, budget): exactly `cap` increments succeed.
    let breaker = k("breaker");
    let results: Vec<_> = futures_util::future::join_all(
        (0..5).map(|_| c.incr_capped(&breaker, 3, Duration::from_secs(60))),
    )
    .await
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    assert_eq!(results.iter().filter(|r| r.is_some()).count(), 3, "{results:?}");
    assert_eq!(c.counter(&k("breaker")).await.unwrap(), 3);
    c.decr(&k("breaker")).await.unwrap();
    assert_eq!(c.counter(&k("breaker")).await.unwrap(), 2);
    assert_eq!(c.incr_capped(&k("breaker"), 3, Duration::from_secs(60)).await.unwrap(), Some(3));
    c.decr(&k("never")).await.unwrap();
    assert_eq!(c.counter(&k("never")).await.unwrap(), 0, "never below zero");
    // The counter's TTL is set at creation and not extended by later increments: the second
    // increment lands well inside the window, the read after its end and before the end an
    // extended TTL would have (real: the window ends 2 s after the first increment, an extended
    // one 2.5 s after; the read comes at 2.2 s). NB: a read delayed past 2.5 s on a loaded
    // machine would miss an extension; the fake clock's run, exact, never does.
    let win = k("win");
    let incr_window = || c.incr_capped(&win, 10, time.ms(200, 2_000));
    assert!(incr_window().await.unwrap().is_some());
    time.pass(time.ms(120, 500)).await;
    assert!(incr_window().await.unwrap().is_some());
    time.pass(time.ms(150, 1_700)).await;
    assert_eq!(c.counter(&win).await.unwrap(), 0, "the window ended");

    // Hashes (status records) and the status writer's server-clock heartbeat.
    let keys = Keys::new(p, "n");
    let before = c.time().await.unwrap();
    write_status(c, &keys, "w1", &[("state".into(), "processing".into())], "heartbeat")
        .await
        .unwrap();
    let rec = c.hgetall(&keys.status("w1")).await.unwrap();
    assert_eq!(rec["state"], "processing");
    let hb: f64 = rec["heartbeat"].parse().unwrap();
    assert!((hb * 1000.0) as i64 >= before - 1, "heartbeat on the store clock");
    c.hset(&keys.status("w1"), &[("job".into(), "j".into())], None).await.unwrap();
    assert_eq!(c.hgetall(&keys.status("w1")).await.unwrap().len(), 3, "fields merge");
    assert!(c.hgetall(&k("nohash")).await.unwrap().is_empty());

    // The trail: bounded, newest first.
    for i in 0..30 {
        c.append(&k("trail"), &[("n".into(), i.to_string())], 10).await.unwrap();
    }
    let recent = c.read_recent(&k("trail"), 5).await.unwrap();
    assert_eq!(recent.len(), 5);
    assert_eq!(recent[0].1["n"], "29");
    assert_eq!(recent[4].1["n"], "25");
    let all = c.read_recent(&k("trail"), 1000).await.unwrap();
    assert_eq!(all.len(), 10, "bounded at max_len");

    // Records with a TTL, and the index that lists them without SCAN.
    c.hset(&k("rec"), &[("a".into(), "1".into())], Some(time.ms(150, 700))).await.unwrap();
    assert_eq!(c.hgetall(&k("rec")).await.unwrap()["a"], "1");
    // One field: the value, or nothing for a field or a hash that is not there.
    assert_eq!(c.hget(&k("rec"), "a").await.unwrap().as_deref(), Some("1"));
    assert_eq!(c.hget(&k("rec"), "b").await.unwrap(), None);
    assert_eq!(c.hget(&k("nohash"), "a").await.unwrap(), None);
    time.pass(time.ms(300, 1_200)).await;
    assert!(c.hgetall(&k("rec")).await.unwrap().is_empty(), "the record expired");
    index_touch(c, &k("idx"), "n1", 100, 0).await;
    index_touch(c, &k("idx"), "n2", 200, 0).await;
    index_touch(c, &k("idx"), "n1", 300, 0).await;
    assert_eq!(
        c.index_members(&k("idx")).await.unwrap(),
        vec![("n2".to_string(), 200), ("n1".to_string(), 300)]
    );
    index_touch(c, &k("idx"), "n3", 400, 250).await;
    assert_eq!(
        c.index_members(&k("idx")).await.unwrap(),
        vec![("n1".to_string(), 300), ("n3".to_string(), 400)],
        "members older than prune_before are dropped"
    );

    c.del(&[k("timer"), k("short")]).await.unwrap();
    assert_eq!(c.get_many(&[k("timer"), k("short")]).await.unwrap(), vec![None, None]);

    // A worker's clock, record and marks in one read; the node's writes in one batch.
    let before = c.time().await.unwrap();
    c.set(&k("m1"), "x", Duration::from_secs(60)).await.unwrap();
    c.hset(&k("status"), &[("state".into(), "processing".into())], None).await.unwrap();
    let read = c.read_worker(&k("status"), &[k("m1"), k("m2")]).await.unwrap();
    assert!(read.now >= before);
    assert_eq!(read.record.unwrap()["state"], "processing");
    assert_eq!(read.values, vec![Some("x".to_string()), None]);
    let empty = c.read_worker(&k("none"), &[k("m2")]).await.unwrap();
    assert_eq!(empty.record, Ok(Default::default()));

    // Issue 26: a record over the bounds (junk written with a worker's Redis credentials) is
    // that worker's problem: read as unreadable, its bytes never sent to the agent.
    let junk = "j".repeat(vigil::coord::MAX_RECORD_BYTES);
    c.hset(&k("fat"), &[("job".into(), junk)], None).await.unwrap();
    let many: Vec<(String, String)> =
        (0..=vigil::coord::MAX_RECORD_FIELDS).map(|i| (format!("f{i}"), "v".to_string())).collect();
    c.hset(&k("wide"), &many, None).await.unwrap();
    for key in ["fat", "wide"] {
        let read = c.read_worker(&k(key), &[k("m1")]).await.unwrap();
        let why = read.record.unwrap_err().to_string();
        assert!(why.contains("over the"), "{key}: {why}");
        assert_eq!(read.values, vec![Some("x".to_string())], "the marks still read");
    }

    // Issue 43: a node's every worker in one read (the cycle's one round trip): each worker's
    // record and marks in the order asked, a worker's unreadable record its own problem, and no
    // worker at all still the clock.
    let asked = |record: &str, marks: &[&str]| vigil::coord::WorkerKeys {
        record: k(record),
        keys: marks.iter().map(|m| k(m)).collect(),
    };
    let node = c
        .read_workers(&[
            asked("status", &["m2", "m1"]),
            asked("fat", &[]),
            asked("none", &["m1", "m1", "m2"]),
        ])
        .await
        .unwrap();
    assert!(node.now >= before);
    assert_eq!(node.workers.len(), 3);
    assert!(node.workers.iter().all(|w| w.now == node.now));
    assert_eq!(node.workers[0].record.as_ref().unwrap()["state"], "processing");
    assert_eq!(node.workers[0].values, vec![None, Some("x".to_string())]);
    let why = node.workers[1].record.as_ref().unwrap_err().to_string();
    assert!(why.contains("over the"), "{why}");
    assert!(node.workers[1].values.is_empty());
    assert_eq!(node.workers[2].record, Ok(Default::default()));
    let x = Some("x".to_string());
    assert_eq!(node.workers[2].values, vec![x.clone(), x, None]);
    let clock_only = c.read_workers(&[]).await.unwrap();
    assert!(clock_only.now >= node.now && clock_only.workers.is_empty());
    // A node of many workers: its marks are read in parts (Lua's unpack has a limit), each
    // value where it belongs across the parts' borders.
    let many: Vec<vigil::coord::WorkerKeys> = (0..3)
        .map(|w| vigil::coord::WorkerKeys {
            record: k(&format!("big{w}")),
            keys: (0..700).map(|i| k(&format!("big{w}:m{i}"))).collect(),
        })
        .collect();
    for (w, i) in [(0, 0), (1, 299), (1, 300), (2, 699)] {
        let key = k(&format!("big{w}:m{i}"));
        c.set(&key, &format!("{w}/{i}"), Duration::from_secs(60)).await.unwrap();
    }
    let big = c.read_workers(&many).await.unwrap();
    for (w, read) in big.workers.iter().enumerate() {
        assert_eq!(read.values.len(), 700);
        for (i, v) in read.values.iter().enumerate() {
            let set = matches!((w, i), (0, 0) | (1, 299) | (1, 300) | (2, 699));
            assert_eq!(v.clone(), set.then(|| format!("{w}/{i}")), "{w}/{i}");
        }
    }

    // A worker's own write lands in its record, stamped with the store's clock.
    let at = write_status(c, &keys, "w2", &[("state".into(), "processing".into())], "heartbeat")
        .await
        .unwrap();
    let read = c.read_worker(&keys.status("w2"), &[]).await.unwrap();
    let rec = read.record.unwrap();
    assert_eq!(rec["state"], "processing");
    assert_eq!(rec["heartbeat"], vigil::coord::heartbeat_value(at));
    c.set(&k("counter"), "3", Duration::from_secs(60)).await.unwrap();
    let counters = c
        .batch(&[
            Op::Set { key: k("b1"), value: "v".into(), ttl: Duration::from_secs(60) },
            Op::Hset {
                key: k("b2"),
                fields: vec![("f".into(), "1".into())],
                ttl: Some(Duration::from_secs(60)),
            },
            Op::Hset { key: k("b3"), fields: vec![("g".into(), "2".into())], ttl: None },
            Op::IndexTouch { key: k("bidx"), member: "n".into(), score: 5, prune_before: Some(0) },
            Op::Counter { key: k("counter") },
            // A fleet-wide key, in another hash slot (a cluster splits the batch per slot).
            Op::Hset {
                key: format!("{p}:fleet:b4"),
                fields: vec![("h".into(), "3".into())],
                ttl: None,
            },
            Op::Counter { key: k("absent") },
        ])
        .await
        .unwrap();
    assert_eq!(counters, vec![3, 0]);
    assert_eq!(c.get_many(&[k("b1")]).await.unwrap(), vec![Some("v".into())]);
    assert_eq!(c.hgetall(&k("b2")).await.unwrap()["f"], "1");
    assert_eq!(c.hgetall(&k("b3")).await.unwrap()["g"], "2");
    assert_eq!(c.hgetall(&format!("{p}:fleet:b4")).await.unwrap()["h"], "3");
    assert_eq!(c.index_members(&k("bidx")).await.unwrap(), vec![("n".to_string(), 5)]);
    let many =
        c.hgetall_many(&[k("b2"), k("absent"), format!("{p}:fleet:b4"), k("b3")]).await.unwrap();
    assert_eq!(many.len(), 4);
    assert_eq!(many[0]["f"], "1");
    assert!(many[1].is_empty());
    assert_eq!(many[2]["h"], "3");
    assert_eq!(many[3]["g"], "2");
    // HDEL: some fields, then the last one (the hash goes with it); absent ones are no error.
    c.hset(&k("hd"), &[("a".into(), "1".into()), ("b".into(), "2".into())], None).await.unwrap();
    let hdel = |fields: &[&str]| Op::Hdel {
        key: k("hd"),
        fields: fields.iter().map(|f| f.to_string()).collect(),
    };
    c.batch(&[hdel(&["a", "zz"])]).await.unwrap();
    assert_eq!(c.hgetall(&k("hd")).await.unwrap().len(), 1);
    c.batch(&[hdel(&["b"]), hdel(&[])]).await.unwrap();
    assert!(c.hgetall(&k("hd")).await.unwrap().is_empty());

    // Compare-and-delete of hash fields (a gang's view rid of departed members' entries): a
    // field goes only while it holds the value read; one rewritten since stays, an absent one
    // (or hash) is no error, and the hash goes with its last field.
    let pair = |f: &str, v: &str| (f.to_string(), v.to_string());
    let view = k("view");
    c.hset(&view, &[pair("a", "1"), pair("b", "2"), pair("c", "3")], None).await.unwrap();
    let read = [pair("a", "1"), pair("b", "2 as read"), pair("gone", "9")];
    assert_eq!(c.hdel_if_equal(&view, &read).await.unwrap(), 1);
    let left = c.hgetall(&view).await.unwrap();
    assert_eq!(left.get("a"), None, "equal: deleted");
    assert_eq!(left["b"], "2", "changed since it was read: kept");
    assert_eq!(left["c"], "3", "not asked: kept");
    assert_eq!(c.hdel_if_equal(&k("nohash"), &[pair("a", "1")]).await.unwrap(), 0);
    assert_eq!(c.hdel_if_equal(&view, &[]).await.unwrap(), 0);
    assert_eq!(c.hdel_if_equal(&view, &[pair("b", "2"), pair("c", "3")]).await.unwrap(), 2);
    assert!(c.hgetall(&view).await.unwrap().is_empty());
}

#[tokio::test]
async fn primitives_in_memory() {
    let clock = FakeClock::at(SystemClock.now());
    let c: Box<dyn Coordinator> = Box::new(MemoryCoordinator::new(Arc::new(clock.clone())));
    suite(&*c, Time::Fake(clock), "mem").await;
}

#[tokio::test]
async fn primitives_on_real_redis() {
    let c = RedisCoordinator::new(&shared_redis_url(), Duration::from_secs(2)).unwrap();
    suite(&c, Time::Real, &unique("t")).await;
}

#[tokio::test]
async fn unreachable_redis_is_a_clear_error_not_a_hang() {
    let port = free_port();
    let c: Box<dyn Coordinator> = Box::new(
        RedisCoordinator::new(&format!("redis://127.0.0.1:{port}"), Duration::from_millis(500))
            .unwrap(),
    );
    let err = c.time().await.unwrap_err().to_string();
    assert!(err.contains("restarts are paused"), "{err}");
    assert!(err.contains(&port.to_string()), "{err}");
}

/// A `single` Redis whose connection goes silent (its pod rescheduled behind a Service, the old
/// path black-holed) is reached afresh by the next call, not waited on until the kernel gives the
/// socket up (~15 min; meanwhile every agent fails closed). A proxy in front of the real Redis
/// holds its first connection open and never answers it, and forwards every later one: the first
/// call times out, the second (on a fresh connection) is answered.
#[tokio::test]
async fn a_single_redis_gone_silent_is_reached_on_a_fresh_connection() {
    use tokio::net::{TcpListener, TcpStream};
    let url = shared_redis_url();
    let info = redis::IntoConnectionInfo::into_connection_info(url.as_str()).unwrap();
    let redis::ConnectionAddr::Tcp(host, port) = info.addr else { panic!("a TCP URL: {url}") };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    // The same URL (password, database) with the proxy in the server's place.
    let proxied = url.replacen(&format!("{host}:{port}"), &format!("127.0.0.1:{proxy_port}"), 1);
    assert_ne!(proxied, url, "the URL names its host and port");
    let proxy = tokio::spawn(async move {
        // NB: bound (not `_`) so the silent connection stays open while the proxy runs.
        let Ok((_silent, _)) = listener.accept().await else { return };
        loop {
            let Ok((mut client, _)) = listener.accept().await else { return };
            let Ok(mut server) = TcpStream::connect((host.as_str(), port)).await else { continue };
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    let c: Box<dyn Coordinator> =
        Box::new(RedisCoordinator::new(&proxied, Duration::from_secs(1)).unwrap());
    let err = c.time().await.unwrap_err().to_string();
    assert!(err.contains("restarts are paused"), "{err}");
    let t = c.time().await.unwrap();
    assert!(t > 1_700_000_000_000, "time is epoch ms: {t}");
    proxy.abort();
}

/// A `single` Redis that refused a reconnection at AUTH (a password rotated on the server, then
/// rolled back; a Redis at `maxclients` as a restart brings the whole fleet back at once) is
/// reached again once it takes the password: the `redis` crate's connection manager keeps such a
/// refusal and answers it to every later call without trying again, so the coordinator drops it.
#[tokio::test]
async fn a_single_redis_that_refused_a_reconnection_at_auth_is_reached_again() {
    let server = RedisServer::start();
    let port = server.port.to_string();
    let cli = |args: &[&str]| {
        let all = [&["-p", port.as_str(), "--no-auth-warning"][..], args].concat();
        run_cli("redis-cli", &all, None)
    };
    assert_eq!(cli(&["CONFIG", "SET", "requirepass", "old"]), "OK");
    let url = format!("redis://:old@127.0.0.1:{port}");
    let c: Box<dyn Coordinator> =
        Box::new(RedisCoordinator::new(&url, Duration::from_secs(5)).unwrap());
    c.time().await.unwrap();
    assert_eq!(cli(&["-a", "old", "CONFIG", "SET", "requirepass", "new"]), "OK");
    assert_eq!(cli(&["-a", "new", "CLIENT", "KILL", "TYPE", "normal"]), "1", "the agent's");
    // The first call finds its connection gone (the manager reconnects behind it); the next
    // waits for that reconnection, refused at AUTH well within the timeout (a timeout would
    // replace the connection by itself).
    assert!(c.time().await.is_err(), "the connection was killed");
    let refused = c.time().await.unwrap_err().to_string();
    assert!(refused.contains("authentication failed"), "refused at AUTH: {refused}");
    assert_eq!(cli(&["-a", "new", "CONFIG", "SET", "requirepass", "old"]), "OK");
    let t = c.time().await.expect("reached again once Redis takes the password");
    assert!(t > 1_700_000_000_000, "time is epoch ms: {t}");
}

#[tokio::test]
async fn keys_of_one_node_hash_to_one_cluster_slot() {
    // The Lua scripts and MGET touch one node's keys only: they must share a slot.
    let c: Box<dyn Coordinator> =
        Box::new(RedisCoordinator::new(&shared_redis_url(), Duration::from_secs(2)).unwrap());
    let keys = Keys::new("vigil", "gpu-7");
    let mut conn = redis::Client::open(shared_redis_url().as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut slots = std::collections::HashSet::new();
    for key in [
        keys.lock(),
        keys.incident("w"),
        keys.breaker("2026-11-30"),
        keys.trail(),
        keys.status("w"),
    ] {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|_| crc16_slot(&key));
        slots.insert(slot);
    }
    assert_eq!(slots.len(), 1, "{slots:?}");
    drop(c);
}

/// Redis Cluster's slot function, for servers started without cluster mode (where CLUSTER
/// KEYSLOT is refused).
fn crc16_slot(key: &str) -> i64 {
    let bytes = key.as_bytes();
    let tagged = match (key.find('{'), key.find('}')) {
        (Some(s), Some(e)) if e > s + 1 => &bytes[s + 1..e],
        _ => bytes,
    };
    let mut crc: u16 = 0;
    for b in tagged {
        crc ^= (*b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    i64::from(crc % 16384)
}

/// A CA and a server certificate for 127.0.0.1, made with the openssl CLI.
fn make_certs(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        run_cli("openssl", args, Some(dir));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=vigil-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
}

#[tokio::test]
async fn rediss_with_a_configured_ca_works_and_without_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let port = free_port();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let server = std::process::Command::new("redis-server")
        .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--tls-cert-file", &p("server.pem"), "--tls-key-file", &p("server.key")])
        .args(["--tls-ca-cert-file", &p("ca.pem"), "--tls-auth-clients", "no"])
        .args(["--save", "", "--appendonly", "no", "--dir", &p("")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server");
    let server = common::real::KillOnDrop(server);
    wait_listening(port);
    let url = format!("rediss://127.0.0.1:{port}");
    let ca = p("ca.pem");
    let trusted = RedisCoordinator::with_ca(&url, Some(&ca), Duration::from_secs(3)).unwrap();
    let t = (&trusted as &dyn Coordinator).time().await;
    let untrusted = RedisCoordinator::new(&url, Duration::from_secs(3)).unwrap();
    let refused = (&untrusted as &dyn Coordinator).time().await;
    drop(server);
    assert!(t.is_ok(), "TLS with the CA: {t:?}");
    let err = refused.unwrap_err().to_string();
    assert!(err.contains("restarts are paused"), "an untrusted server is refused: {err}");
}

/// One bad record — a key of the wrong Redis type where a worker's hash belongs, or bytes that
/// are not UTF-8, read in the cycle's one read of the node with the others — is that worker's
/// problem only: it is unreachable with one alert naming the key
/// and the problem, the other workers are judged as usual, and Redis is not "down".
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_record_is_that_workers_problem_only() {
    use common::fakes::{FakeRuntime, RecordingSink};
    use vigil::alerts::{AlertKind, Notifier};
    use vigil::config::Config;
    use vigil::cycle::agent::Agent;
    use vigil::metrics::Metrics;
    let url = shared_redis_url();
    let prefix = unique("badrec");
    let mut cfg = Config { node_name: "n1".into(), ..Config::default() };
    cfg.redis.url = url.clone().into();
    cfg.redis.key_prefix = prefix.clone();
    let coord: Arc<dyn Coordinator> =
        Arc::new(RedisCoordinator::new(&url, Duration::from_secs(2)).unwrap());
    let keys = Keys::new(&prefix, "n1");
    let runtime = FakeRuntime::default();
    runtime.add("c-a", "a-wrong-type");
    runtime.add("c-b", "b-not-utf8");
    runtime.add("c-c", "c-fine");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(keys.status("a-wrong-type"))
        .arg("not a hash")
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(keys.status("b-not-utf8"))
        .arg("state")
        .arg(&b"processing\xff\xfe"[..])
        .query_async(&mut raw)
        .await
        .unwrap();
    write_status(
        coord.as_ref(),
        &keys,
        "c-fine",
        &[("state".to_string(), "idle".to_string())],
        "heartbeat",
    )
    .await
    .unwrap();
    let sink = RecordingSink::default();
    let metrics = Arc::new(Metrics::new());
    let notifier = Notifier::new(Some(Arc::new(sink.clone())), metrics.clone());
    let mut agent = Agent::new(cfg, coord, Arc::new(runtime), notifier, metrics.clone());
    for _ in 0..5 {
        let report = agent.cycle().await;
        assert!(report.coordinator_error.is_none(), "{report:?}");
        assert_eq!(report.verdicts.len(), 3, "every worker judged: {report:?}");
    }
    let unreachable = sink.of(AlertKind::Unreachable);
    assert_eq!(unreachable.len(), 2, "one per bad record: {unreachable:?}");
    assert!(
        unreachable
            .iter()
            .any(|a| a.detail.contains(&keys.status("a-wrong-type"))
                && a.detail.contains("WRONGTYPE"))
    );
    assert!(unreachable.iter().any(|a| a.detail.contains(&keys.status("b-not-utf8"))));
    assert_eq!(sink.count(AlertKind::CoordinatorDown), 0, "Redis is fine");
    assert!(common::has_sample(&metrics.encode(), "vigil_coordinator_up 1"));
}

/// The same primitives on a real Redis Cluster of three masters: every script and multi-key
/// command stays in one hash slot, and the node's batch and the fleet read are split per slot.
#[tokio::test]
async fn primitives_on_a_redis_cluster() {
    let cluster = Cluster::start();
    let c = RedisCoordinator::cluster(&cluster.url(), None, Duration::from_secs(2)).unwrap();
    suite(&c, Time::Real, &unique("t")).await;
}

/// A cluster has one clock: every `TIME` the coordinator reads (its own, and the clock of a
/// node's workers read) goes to one master, so heartbeats stamped by one master's clock are never
/// judged by another's (their clocks differ by whatever NTP left between them). Nodes whose keys
/// live on every master read their workers: the `TIME` calls of exactly one master rise.
#[tokio::test]
async fn a_redis_cluster_has_one_clock() {
    let cluster = Cluster::start();
    let c: Box<dyn Coordinator> =
        Box::new(RedisCoordinator::cluster(&cluster.url(), None, Duration::from_secs(2)).unwrap());
    let p = unique("clock");
    let before = cluster.time_calls();
    for n in 0..30 {
        let keys = Keys::new(&p, &format!("n{n}"));
        let now = c.time().await.unwrap();
        let read = c.read_worker(&keys.status("w"), &[]).await.unwrap();
        assert!(read.now >= now, "the workers read on the same clock: {} < {now}", read.now);
    }
    let rose: Vec<u64> =
        cluster.time_calls().iter().zip(&before).map(|(after, before)| after - before).collect();
    assert_eq!(rose.iter().filter(|&&n| n > 0).count(), 1, "TIME calls per master: {rose:?}");
    assert_eq!(rose.iter().sum::<u64>(), 60, "one TIME per read, none in the script: {rose:?}");
}

/// The same primitives through Sentinel, then a failover in the middle of a run: calls fail
/// closed (an error, never a panic or a hang) while the master switches; afterwards the
/// coordinator writes to the new master, and the node lock taken before the switch is still
/// held by its owner and refused to anyone else.
#[tokio::test]
async fn primitives_through_sentinel_and_across_a_failover() {
    let s = Sentinel::start();
    let c: Box<dyn Coordinator> =
        Box::new(RedisCoordinator::sentinel(&s.url(), SERVICE, Duration::from_secs(2)).unwrap());
    suite(&*c, Time::Real, &unique("t")).await;

    let p = unique("f");
    let lock = format!("{p}:{{n}}:lock");
    assert!(c.set_nx(&lock, "token-a", Duration::from_secs(120)).await.unwrap());
    s.sync();
    s.failover();
    let after = format!("{p}:{{n}}:after");
    let started = std::time::Instant::now();
    let mut failed = 0;
    loop {
        match c.set(&after, "1", Duration::from_secs(60)).await {
            Ok(()) => break,
            Err(e) => {
                failed += 1;
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "no write after the failover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(s.get(s.replica, &after), "1", "the write went to the new master");
    assert!(
        failed >= 1,
        "the demoted master's READONLY was an error (fail closed), then the agent reconnected"
    );
    assert!(
        !c.set_nx(&lock, "token-b", Duration::from_secs(60)).await.unwrap(),
        "the lock came across: nobody else takes it"
    );
    assert!(c.owner_ttl(&lock, "token-a").await.unwrap().is_some());
}

/// The agent itself across a Sentinel failover in the middle of an incident: no restart while
/// the master switches (fail closed), and afterwards the same incident — its timer came across
/// with the data — ends in exactly one restart, under the lock, recorded with its incident id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_survives_a_sentinel_failover_and_ends_in_one_restart() {
    use common::fakes::{FakeRuntime, RecordingSink};
    use vigil::alerts::Notifier;
    use vigil::config::{Config, RedisMode};
    use vigil::cycle::agent::Agent;
    use vigil::metrics::Metrics;
    let s = Sentinel::start();
    let prefix = unique("fo");
    let mut cfg = Config { node_name: "n1".into(), ..Config::default() };
    cfg.redis.url = s.url().into();
    cfg.redis.mode = RedisMode::Sentinel;
    cfg.redis.sentinel_service = SERVICE.into();
    cfg.redis.key_prefix = prefix.clone();
    cfg.policy.stale_after = Duration::from_secs(2);
    cfg.policy.confirm_after = Duration::from_millis(500);
    // Long enough for the failover (promotion, then the old master demoted: about 10–12 s on
    // Sentinel's own timers) to end first, with room to spare on a loaded machine.
    cfg.policy.restart_delay = Duration::from_secs(25);
    cfg.validate().unwrap();
    let coord: Arc<dyn Coordinator> =
        Arc::new(RedisCoordinator::sentinel(&s.url(), SERVICE, Duration::from_secs(2)).unwrap());
    let keys = Keys::new(&prefix, "n1");
    let runtime = FakeRuntime::default();
    runtime.add("c1", "w1");
    write_status(
        coord.as_ref(),
        &keys,
        "w1",
        &[("state".to_string(), "processing".to_string())],
        "heartbeat",
    )
    .await
    .unwrap();
    let metrics = Arc::new(Metrics::new());
    let notifier = Notifier::new(Some(Arc::new(RecordingSink::default())), metrics.clone());
    let mut agent = Agent::new(cfg, coord.clone(), Arc::new(runtime.clone()), notifier, metrics);
    let incident = loop {
        agent.cycle().await;
        if let Some(v) = coord.get_many(&[keys.incident("w1")]).await.unwrap()[0].clone() {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    s.sync();
    let failover = tokio::task::spawn_blocking(move || {
        s.failover();
        s
    });
    let mut failed_closed = 0;
    while !failover.is_finished() {
        let r = agent.cycle().await;
        failed_closed += usize::from(r.coordinator_error.is_some());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let _s = failover.await.unwrap();
    assert_eq!(runtime.restarts("c1"), 0, "no restart while the master switched");
    let started = std::time::Instant::now();
    while runtime.restarts("c1") == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "the incident did not resume");
        let r = agent.cycle().await;
        failed_closed += usize::from(r.coordinator_error.is_some());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for _ in 0..5 {
        agent.cycle().await;
    }
    assert_eq!(runtime.restarts("c1"), 1, "exactly one restart");
    let id = incident.split_once(':').unwrap().1;
    let trail = coord.read_recent(&keys.trail(), 100).await.unwrap();
    assert!(
        trail.iter().any(|(_, f)| f["decision"] == "restarted"
            && f.get("incident").map(String::as_str) == Some(id)),
        "the restart is the incident's ({failed_closed} cycles failed closed): {trail:?}"
    );
}
