//! Redis least privilege, against a real `redis-server` with ACLs on. The users are the lines of
//! docs/security.md ("Redis ACLs"), read from the page itself into the server's `users.acl`, so
//! the documented lines are the tested ones:
//!
//! - a worker's user beats (through `vigil beat`, and through `write_status`) with no command
//!   refused, and is refused (`NOPERM`) on every key of the agent, on its neighbours' records and
//!   on another node's;
//! - the agent user runs whole cycles, through an incident to a restart, and the operator's
//!   `vigil status` and `vigil explain`, with no command refused;
//! - the agent user runs a gang's member on each of two nodes, `gang.pace` on: the pace a
//!   member's entry keeps is read (`HGET`) and, once the ranks stop, a departed member's entry
//!   is removed from the gang's view (a script of `HGET` and `HDEL`), with no command refused;
//! - a record under the layout before the status records had their own prefix is still read for
//!   one release (a hung worker found under it), and a new-layout record wins over it.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::fakes::{FakeRuntime, RecordingSink};
use common::real::{free_port, vigil, wait_listening};
use vigil::alerts::Notifier;
use vigil::clock::Millis;
use vigil::config::Config;
use vigil::coord::redis::RedisCoordinator;
use vigil::coord::{write_status, Coordinator, Keys};
use vigil::cycle::agent::Agent;
use vigil::hang::policy::Verdict;
use vigil::metrics::Metrics;

const NODE: &str = "gpu-a";
const OTHER: &str = "gpu-b";

/// The user lines of docs/security.md's "Redis ACLs" section, placeholders as written.
fn documented_lines() -> (String, String) {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md"),
    )
    .unwrap();
    let section = page
        .split("\n## Redis ACLs\n")
        .nth(1)
        .expect("docs/security.md has a section \"Redis ACLs\"");
    let line = |start: &str| {
        section
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting {start:?} in \"Redis ACLs\""))
            .to_string()
    };
    (line("user vigil-worker-"), line("user vigil-agent "))
}

fn worker_password(node: &str, worker: &str) -> String {
    format!("worker-secret-{node}-{worker}")
}

/// The workers given a user of their own: (node, worker id).
const WORKERS: [(&str, &str); 4] =
    [(NODE, "trainer-0"), (NODE, "trainer-1"), (NODE, "both"), (OTHER, "trainer-0")];

const AGENT_PASSWORD: &str = "agent-secret";

/// A redis-server of its own, in a temp directory, with the documented users of nodes
/// [`NODE`] and [`OTHER`] and the agent user loaded from `users.acl` (and the default user,
/// for the test's own setup and checks).
struct AclRedis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl AclRedis {
    fn start() -> AclRedis {
        let (worker, agent) = documented_lines();
        let mut users = vec!["user default on nopass ~* &* +@all".to_string()];
        users.extend(WORKERS.iter().map(|(node, id)| {
            worker
                .replace("<node>", node)
                .replace("<worker-id>", id)
                .replace("<worker-password>", &worker_password(node, id))
        }));
        users.push(agent.replace("<agent-password>", AGENT_PASSWORD));
        let users = users.join("\n");
        let dir = tempfile::tempdir().unwrap();
        let acl = dir.path().join("users.acl");
        std::fs::write(&acl, users + "\n").unwrap();
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--dir", dir.path().to_str().unwrap()])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--aclfile", acl.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/setup.sh installs it)");
        assert!(wait_listening(port), "redis-server did not start with the documented users.acl");
        AclRedis { child, port, _dir: dir }
    }

    /// As the default user (the test's own view of the data).
    fn admin_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// As the user of one worker (docs/security.md: one user per worker).
    fn worker_url(&self, node: &str, worker: &str) -> String {
        format!(
            "redis://vigil-worker-{node}-{worker}:{}@127.0.0.1:{}",
            worker_password(node, worker),
            self.port
        )
    }

    fn agent_url(&self) -> String {
        format!("redis://vigil-agent:{AGENT_PASSWORD}@127.0.0.1:{}", self.port)
    }

    async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
        redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap()
    }

    async fn admin(&self) -> redis::aio::MultiplexedConnection {
        Self::conn(&self.admin_url()).await
    }

    /// Empty the ACL log, so [`AclRedis::refusals`] sees only what comes after.
    async fn reset_log(&self) {
        let _: () = redis::cmd("ACL")
            .arg("LOG")
            .arg("RESET")
            .query_async(&mut self.admin().await)
            .await
            .unwrap();
    }

    /// What the server has executed, and the error replies it sent, since the last
    /// `CONFIG RESETSTAT`: `["auth", "time", …]` (sorted), and the count of error replies.
    async fn commands(&self) -> (Vec<String>, u64) {
        let info: String =
            redis::cmd("INFO").arg("all").query_async(&mut self.admin().await).await.unwrap();
        let mut names: Vec<String> = info
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
            .map(|(name, _)| name.to_string())
            .filter(|n| n != "config|resetstat")
            .collect();
        names.sort();
        let errors = info
            .lines()
            .find_map(|l| l.strip_prefix("total_error_replies:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        (names, errors)
    }

    async fn reset_stats(&self) {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.admin().await)
            .await
            .unwrap();
    }

    /// What the ACL log holds: each refusal's user, reason and command or key.
    async fn refusals(&self) -> Vec<String> {
        let entries: Vec<std::collections::HashMap<String, redis::Value>> =
            redis::cmd("ACL").arg("LOG").query_async(&mut self.admin().await).await.unwrap();
        let text = |v: Option<&redis::Value>| {
            v.and_then(|v| redis::from_redis_value::<String>(v).ok()).unwrap_or_default()
        };
        entries
            .iter()
            .map(|e| {
                format!(
                    "{} refused {} {}",
                    text(e.get("username")),
                    text(e.get("reason")),
                    text(e.get("object"))
                )
            })
            .collect()
    }
}

impl Drop for AclRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every key the agent owns, for `node` (fleet keys are the prefix's).
fn agent_keys(k: &Keys) -> Vec<(&'static str, String)> {
    let w = "trainer-0";
    vec![
        ("lock", k.lock()),
        ("breaker", k.breaker("2026-11-30")),
        ("breaker_alert", k.breaker_alert("2026-11-30")),
        ("trail", k.trail()),
        ("agent", k.agent()),
        ("suspect", k.suspect(w)),
        ("incident", k.incident(w)),
        ("error_since", k.error_since(w)),
        ("cooldown", k.cooldown(w)),
        ("retry", k.retry(w)),
        ("progress", k.progress(w)),
        ("incarnation", k.incarnation(w)),
        ("restarted", k.restarted(w)),
        ("escalated", k.escalated(w)),
        ("episode", k.episode(w, "stalled")),
        ("alert_dedup", k.alert_dedup("inc-1", "hung")),
        ("idle_since", k.idle_since()),
        ("fleet_nodes", k.fleet_nodes()),
        ("fleet_slices", k.fleet_slices()),
        ("maintenance_claim", k.maintenance_claim("pool-1")),
        ("fleet_budget", k.fleet_budget(42)),
        ("fleet_budget_alert", k.fleet_budget_alert(42)),
    ]
}

/// The error code of a refused command, or a panic naming what was allowed.
fn refusal<T: std::fmt::Debug>(what: &str, r: redis::RedisResult<T>) -> String {
    match r {
        Ok(v) => panic!("the worker user was allowed {what}: {v:?}"),
        Err(e) => {
            assert_eq!(e.code(), Some("NOPERM"), "{what}: {e}");
            e.to_string()
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_user_beats_and_is_refused_on_every_agent_key() {
    let redis = AclRedis::start();
    let keys = Keys::new("vigil", NODE);
    let other = Keys::new("vigil", OTHER);
    let mut admin = redis.admin().await;

    // It beats, through the real binary, and nothing it sends (connection set-up included) is
    // refused: it sends AUTH, TIME and HSET, nothing else (no CLIENT SETINFO, which a Redis
    // >= 7.2 would refuse to this user).
    redis.reset_log().await;
    redis.reset_stats().await;
    let (code, out, err) = vigil(
        &["beat", "--worker", "trainer-0", "--state", "processing", "--progress", "step-1"],
        &[("REDIS_URL", &redis.worker_url(NODE, "trainer-0")), ("NODE_NAME", NODE)],
    );
    assert_eq!(code, 0, "vigil beat as the worker user: {out}{err}");
    assert!(out.contains(&keys.status("trainer-0")), "{out}");
    let (sent, errors) = redis.commands().await;
    assert_eq!(sent, ["auth", "hset", "time"], "what `vigil beat` sends");
    assert_eq!(errors, 0, "and none of it is refused");
    let rec: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(keys.status("trainer-0")).query_async(&mut admin).await.unwrap();
    assert_eq!(rec["state"], "processing");
    assert_eq!(rec["progress"], "step-1");
    assert!(rec.contains_key("heartbeat"));
    // And through the library, as a worker written in Rust would, acknowledging a checkpoint.
    let as_worker: Box<dyn Coordinator> = Box::new(
        RedisCoordinator::new(&redis.worker_url(NODE, "trainer-0"), Duration::from_secs(2))
            .unwrap(),
    );
    write_status(
        &*as_worker,
        &keys,
        "trainer-0",
        &[("checkpoint_ack".into(), "req-1".into())],
        "heartbeat",
    )
    .await
    .unwrap();
    let mine = as_worker.hgetall(&keys.status("trainer-0")).await.unwrap();
    assert_eq!(mine["checkpoint_ack"], "req-1", "it reads its own record");
    assert_eq!(
        redis.refusals().await,
        Vec::<String>::new(),
        "a beat needs nothing the worker user lacks"
    );

    // Every agent key (and the legacy layout), by key: with the very commands it may run.
    let mut w = AclRedis::conn(&redis.worker_url(NODE, "trainer-0")).await;
    let mut refused = Vec::new();
    let mut foreign = agent_keys(&keys);
    foreign.extend(agent_keys(&other));
    foreign.push(("another node's status", other.status("trainer-0")));
    // Issue 26, finding 5: nor another worker of its own node (`state=error` would force its
    // restart, `restarts=alert-only` take its protection away).
    foreign.push(("a neighbour's status", keys.status("trainer-1")));
    for (name, key) in &foreign {
        let read = redis::cmd("HGETALL").arg(key).query_async::<redis::Value>(&mut w).await;
        let e = refusal(&format!("HGETALL {name} {key}"), read);
        assert!(e.contains("key"), "refused for the key: {e}");
        let write = redis::cmd("HSET")
            .arg(key)
            .arg("state")
            .arg("processing")
            .query_async::<redis::Value>(&mut w)
            .await;
        refusal(&format!("HSET {name} {key}"), write);
        refused.push(*name);
    }
    assert_eq!(refused.len(), foreign.len());
    // Nor any other command, on its own record either.
    let own = keys.status("trainer-0");
    for cmd in [
        redis::cmd("DEL").arg(&own).clone(),
        redis::cmd("SET").arg(keys.lock()).arg("x").clone(),
        redis::cmd("GET").arg(keys.lock()).clone(),
        redis::cmd("EVAL").arg("return 1").arg(0).clone(),
        redis::cmd("KEYS").arg("*").clone(),
        redis::cmd("CONFIG").arg("GET").arg("*").clone(),
    ] {
        refusal("another command", cmd.query_async::<redis::Value>(&mut w).await);
    }
    // Through the coordinator the refusals are errors, never lost in a pipeline.
    let taken = as_worker.set_nx(&keys.lock(), "me", Duration::from_secs(30)).await;
    assert!(format!("{taken:?}").contains("NOPERM"), "{taken:?}");
    let set = as_worker.set(&keys.cooldown("trainer-0"), "x", Duration::from_secs(30)).await;
    assert!(format!("{set:?}").contains("NOPERM"), "{set:?}");
    let breaker =
        as_worker.incr_capped(&keys.breaker("2026-11-30"), 3, Duration::from_secs(60)).await;
    assert!(format!("{breaker:?}").contains("NOPERM"), "{breaker:?}");

    // Node B's worker user is refused on node A's records.
    let mut b = AclRedis::conn(&redis.worker_url(OTHER, "trainer-0")).await;
    let read = redis::cmd("HGETALL").arg(&own).query_async::<redis::Value>(&mut b).await;
    refusal("node B's worker on node A's record", read);
    // (The ACL log does record refusals: the checks of "nothing refused" above are not vacuous.)
    let log = redis.refusals().await;
    assert!(
        log.iter().any(|l| l.starts_with(&format!("vigil-worker-{NODE}-trainer-0 refused key"))),
        "{log:?}"
    );
    let (code, _, err) = vigil(
        &["beat", "--worker", "trainer-0", "--state", "processing"],
        &[("REDIS_URL", &redis.worker_url(OTHER, "trainer-0")), ("NODE_NAME", NODE)],
    );
    assert_ne!(code, 0, "node B's worker user cannot beat for node A");
    assert!(err.contains("NOPERM"), "{err}");
}

/// A config for an agent of [`NODE`] that restarts a hung worker within seconds.
fn fast_config(url: &str) -> Config {
    let mut cfg = Config { node_name: NODE.into(), ..Config::default() };
    cfg.redis.url = url.into();
    cfg.policy.stale_after = Duration::from_secs(2);
    cfg.policy.confirm_after = Duration::from_millis(500);
    cfg.policy.restart_delay = Duration::from_secs(1);
    cfg.validate().unwrap();
    cfg
}

/// Cycle `agent` until `done` says so (every cycle without a coordinator error), at most 30 s.
async fn cycle_until(agent: &mut Agent, mut done: impl FnMut(&[(String, Verdict)]) -> bool) {
    let started = std::time::Instant::now();
    loop {
        let r = agent.cycle().await;
        assert!(r.coordinator_error.is_none(), "{r:?}");
        assert!(r.runtime_error.is_none(), "{r:?}");
        if done(&r.verdicts) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "not done in 30 s: {r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_user_runs_whole_cycles_through_a_restart() {
    let redis = AclRedis::start();
    let keys = Keys::new("vigil", NODE);
    let as_worker: Box<dyn Coordinator> = Box::new(
        RedisCoordinator::new(&redis.worker_url(NODE, "trainer-0"), Duration::from_secs(2))
            .unwrap(),
    );
    let (mut agent, coord, runtime) = acl_agent(&redis, fast_config(&redis.agent_url()));
    redis.reset_log().await;
    // The worker beats once, as the worker user, then hangs.
    write_status(
        &*as_worker,
        &keys,
        "trainer-0",
        &[("state".into(), "processing".into())],
        "heartbeat",
    )
    .await
    .unwrap();
    cycle_until(&mut agent, |_| runtime.restarts("c1") == 1).await;
    for _ in 0..3 {
        let r = agent.cycle().await;
        assert!(r.coordinator_error.is_none(), "{r:?}");
    }
    assert_eq!(runtime.restarts("c1"), 1);
    let trail = coord.read_recent(&keys.trail(), 100).await.unwrap();
    assert!(trail.iter().any(|(_, f)| f["decision"] == "restarted"), "{trail:?}");
    // The operator's commands, with the agent user.
    let env = [("REDIS_URL", redis.agent_url()), ("NODE_NAME", NODE.into())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (code, out, err) = vigil(&["status", "--json"], &env);
    assert_eq!(code, 0, "vigil status as the agent user: {err}");
    assert!(out.contains(NODE), "{out}");
    let (code, out, err) = vigil(&["explain", NODE], &env);
    assert_eq!(code, 0, "vigil explain as the agent user: {err}");
    assert!(out.contains("restarted"), "{out}");
    assert_eq!(
        redis.refusals().await,
        Vec::<String>::new(),
        "the agent user lacks nothing a cycle, a restart or the CLI needs"
    );
}

const GANG: &str = "ml/train";
/// A member departed for good (its pod replaced under a new name): its entry in the view.
const DEPARTED: &str = "gpu-9/rank-9";

/// [`fast_config`] on `node`, the gang's pace watched.
fn gang_config(url: &str, node: &str) -> Config {
    let mut cfg = fast_config(url);
    cfg.node_name = node.into();
    cfg.gang.pace.enabled = true;
    cfg.validate().unwrap();
    cfg
}

/// An agent configured by `cfg`, as the agent user, watching its worker `trainer-0` (container
/// `c1`): with its coordinator and runtime.
fn acl_agent(redis: &AclRedis, cfg: Config) -> (Agent, Arc<dyn Coordinator>, FakeRuntime) {
    let coord: Arc<dyn Coordinator> =
        Arc::new(RedisCoordinator::new(&redis.agent_url(), Duration::from_secs(2)).unwrap());
    let runtime = FakeRuntime::default();
    runtime.add("c1", "trainer-0");
    let metrics = Arc::new(Metrics::new());
    let notifier = Notifier::new(Some(Arc::new(RecordingSink::default())), metrics.clone());
    let agent = Agent::new(cfg, coord.clone(), Arc::new(runtime.clone()), notifier, metrics);
    (agent, coord, runtime)
}

/// The agent of `node`, as the agent user, the gang's pace watched.
fn gang_agent(redis: &AclRedis, node: &str) -> Agent {
    acl_agent(redis, gang_config(&redis.agent_url(), node)).0
}

/// Worker `trainer-0` of `node` beats once as a rank of [`GANG`] (of 2), as its own worker
/// user: when, on the Redis clock.
async fn rank_beats(redis: &AclRedis, node: &str) -> Millis {
    let as_worker =
        RedisCoordinator::new(&redis.worker_url(node, "trainer-0"), Duration::from_secs(2))
            .unwrap();
    let fields = [("state", "processing"), ("gang", GANG), ("gang_size", "2")]
        .map(|(k, v)| (k.to_string(), v.to_string()));
    let keys = Keys::new("vigil", node);
    write_status(&as_worker, &keys, "trainer-0", &fields, "heartbeat").await.unwrap()
}

/// The member ids in the gang's view (its one shard), sorted, as the default user reads them.
async fn view_ids(redis: &AclRedis) -> Vec<String> {
    let shard = Keys::new("vigil", NODE).gang_members(GANG, 0);
    let view: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(shard).query_async(&mut redis.admin().await).await.unwrap();
    let mut ids: Vec<String> = view.into_keys().collect();
    ids.sort();
    ids
}

/// One cycle of each agent, none failing at the coordinator or the runtime.
async fn cycle_each(agents: &mut [Agent]) {
    for agent in agents.iter_mut() {
        let r = agent.cycle().await;
        assert!(r.coordinator_error.is_none(), "{r:?}");
        assert!(r.runtime_error.is_none(), "{r:?}");
    }
}

/// A gang of two ranks (`trainer-0` on [`NODE`] and on [`OTHER`], one agent each, as the agent
/// user, `gang.pace` on) and a departed member's entry in its view: each agent reads the pace its
/// member's entry keeps (`HGET`) as it starts watching it; once the ranks stop, the gang's reader
/// reads every entry and removes the departed one (compare-and-delete: a script of `HGET` and
/// `HDEL`); no command is refused. (The single worker above never takes a gang step: a line
/// without `+hget` passed it for a round.) Without `+hget` on the documented line the pace's read
/// is refused (in the ACL log, and the members' entries are never written); without `+hdel` the
/// script fails at its `HDEL` (in the ACL log) and the departed entry stays.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_user_reads_a_gang_s_kept_pace_and_prunes_its_view() {
    let redis = AclRedis::start();
    let mut agents = [gang_agent(&redis, NODE), gang_agent(&redis, OTHER)];
    redis.reset_log().await;
    let beat = rank_beats(&redis, NODE).await;
    rank_beats(&redis, OTHER).await;
    // Its entry unwritten for just over twice the view's gone_after (`policy_gang::Timing`).
    let gone_after = {
        let cfg = gang_config(&redis.agent_url(), NODE);
        let silent = cfg.poll_interval * 3 + cfg.runtime.restart_timeout;
        (silent * 4).max(cfg.policy.stale_after * 2).as_millis() as Millis
    };
    let at = beat - 2 * gone_after - 1_000;
    let departed = serde_json::json!({"n": "gpu-9", "w": "rank-9", "v": "healthy", "s": "w",
                                      "ok": 120_000, "at": at, "hb": at});
    let shard = Keys::new("vigil", NODE).gang_members(GANG, 0);
    let _: i64 = redis::cmd("HSET")
        .arg(&shard)
        .arg(DEPARTED)
        .arg(departed.to_string())
        .query_async(&mut redis.admin().await)
        .await
        .unwrap();
    // The ranks fresh: each agent reads its member's kept pace (its only `HGET`), then writes
    // its entry; a healthy gang reads no view, so nothing is removed yet.
    redis.reset_stats().await;
    cycle_each(&mut agents).await;
    assert!(redis.commands().await.0.contains(&"hget".to_string()), "the kept pace was read");
    assert_eq!(redis.refusals().await, Vec::<String>::new(), "the kept pace's read is allowed");
    assert_eq!(view_ids(&redis).await, [DEPARTED, "gpu-a/trainer-0", "gpu-b/trainer-0"]);
    // The ranks stop: a member stale, its agent takes the gang step, and the gang's reader for
    // the poll interval reads every entry and removes the departed one.
    let started = std::time::Instant::now();
    while view_ids(&redis).await.contains(&DEPARTED.to_string()) {
        if started.elapsed() > Duration::from_secs(30) {
            panic!("the departed entry still there after 30 s: {:?}", redis.refusals().await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        cycle_each(&mut agents).await;
    }
    assert_eq!(view_ids(&redis).await, ["gpu-a/trainer-0", "gpu-b/trainer-0"], "the live stay");
    assert_eq!(
        redis.refusals().await,
        Vec::<String>::new(),
        "the agent user lacks nothing a gang's pace and view need"
    );
}
