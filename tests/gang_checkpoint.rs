//! A checkpoint is a collective (issue 30): a notice on one member's node opens one round for
//! the member's whole gang — the same request id in every member's record, on every node — and
//! the node of the notice waits until every member acknowledged that id, or the tightest budget
//! among the members' nodes ran out, naming who did not answer. Two agents (two node names) on
//! one coordinator, one rank each, through the real maintenance controller and its Node writes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::fakes::FakeRuntime;
use common::fleet::Fleet;
use common::real::{shared_redis_url, unique, vigil, Receiver};
use common::wiring::{node_config, write_record};
use vigil::alerts::Notifier;
use vigil::clock::{Clock, SystemClock};
use vigil::config::Config;
use vigil::coord::redis::RedisCoordinator;
use vigil::coord::{Coordinator, Keys};
use vigil::cycle::agent::Agent;
use vigil::maintenance::request::Outcome;
use vigil::metrics::Metrics;
use vigil::vocab::maintenance::{Interruption, MaintenanceState, Phase};

const GANG: &str = "ml/llama-70b";

/// Two ranks of one gang on the shared fleet harness, one on each node, each node with its
/// maintenance controller (on the system clock: the rounds wait in real time).
struct Job {
    fleet: Fleet,
    coord: Arc<dyn Coordinator>,
}

impl Job {
    /// Two ranks of one gang on gpu-0 and gpu-1 (`tweak(i, cfg)` per node), both agents
    /// through one cycle so the gang's view holds both.
    async fn new(tweak: impl Fn(usize, &mut Config) + 'static) -> Job {
        let fleet = Fleet::builder()
            .nodes(2)
            .system_clock()
            .controllers()
            .without_alerts()
            .config(tweak)
            .build();
        for (i, node) in fleet.nodes.iter().enumerate() {
            node.runtime.add(&format!("c{i}"), &format!("rank-{i}"));
        }
        let mut job = Job { coord: fleet.store.clone(), fleet };
        for i in 0..2 {
            job.beat(i).await;
        }
        for report in job.fleet.tick().await {
            assert_eq!(report.coordinator_error, None);
        }
        job
    }

    fn key(&self, i: usize) -> String {
        self.fleet.nodes[i].keys.status(&format!("rank-{i}"))
    }

    async fn beat(&self, i: usize) {
        write_record(
            self.coord.as_ref(),
            &self.key(i),
            "processing",
            SystemClock.now(),
            &[("gang", GANG), ("gang_size", "2"), ("job", "llama")],
        )
        .await;
    }

    async fn record(&self, i: usize) -> std::collections::HashMap<String, String> {
        self.coord.hgetall(&self.key(i)).await.unwrap()
    }

    fn last_checkpoint(&self, i: usize) -> String {
        self.fleet.nodes[i].node_api.last().annotations["vigil.dev/last-checkpoint"]
            .clone()
            .unwrap()
    }
}

/// A rank that acknowledges every new request it finds in its record, after `delay` (its
/// shards take that long to write).
fn saving_rank(
    coord: Arc<dyn Coordinator>,
    key: String,
    delay: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let rec = coord.hgetall(&key).await.unwrap();
            if let Some(id) = rec.get("checkpoint_request").filter(|r| !r.is_empty()) {
                if rec.get("checkpoint_ack") != Some(id) {
                    tokio::time::sleep(delay).await;
                    let ack = [("checkpoint_ack".to_string(), id.clone())];
                    coord.hset(&key, &ack, None).await.unwrap();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

fn notice(interruption: Interruption) -> MaintenanceState {
    let reason = match interruption {
        Interruption::Preemption => "preempted",
        Interruption::HostMaintenance => "terminate-on-host-maintenance",
    };
    MaintenanceState {
        phase: Phase::Terminating,
        reasons: vec![reason],
        interruption: Some(interruption),
        ..MaintenanceState::default()
    }
}

#[tokio::test]
async fn a_notice_on_one_node_asks_the_whole_gang_and_waits_for_every_rank() {
    let mut job = Job::new(|_, _| {}).await;
    let ranks: Vec<_> = (0..2)
        .map(|i| saving_rank(job.coord.clone(), job.key(i), Duration::from_millis(300)))
        .collect();
    job.fleet.nodes[0].controller().apply(notice(Interruption::HostMaintenance)).await;
    ranks.iter().for_each(|r| r.abort());
    let (a, b) = (job.record(0).await, job.record(1).await);
    assert_eq!(
        a["checkpoint_request"], b["checkpoint_request"],
        "one round id on every member, on every node"
    );
    assert_eq!(b["checkpoint_reason"], "host-maintenance");
    assert_eq!(b["checkpoint_ack"], b["checkpoint_request"]);
    let last = job.last_checkpoint(0);
    assert!(last.contains(&format!("gang {GANG} round")), "{last}");
    assert!(last.contains("acked by 2/2"), "{last}");
    assert!(last.contains("acked=1 timed-out=0"), "{last}");
    let trail = job.coord.read_recent(&job.fleet.nodes[0].keys.trail(), 50).await.unwrap();
    let acked = trail
        .iter()
        .find(|(_, f)| f["decision"] == "checkpoint-acked")
        .expect("the gang's round in node 0's trail");
    assert!(acked.1["detail"].contains("acked by 2/2"), "{:?}", acked.1);
    // The round ended acknowledged: its key is gone, and the next notice asks for a new save.
    let round_key = job.fleet.nodes[0].keys.gang_checkpoint(GANG);
    assert_eq!(job.coord.get_many(&[round_key]).await.unwrap(), vec![None]);
}

#[tokio::test]
async fn a_stalled_rank_cuts_the_round_short_at_the_budget_and_is_named() {
    let mut job = Job::new(|_, c| c.checkpoint.maintenance_budget = Duration::from_secs(1)).await;
    let rank0 = saving_rank(job.coord.clone(), job.key(0), Duration::ZERO);
    let started = tokio::time::Instant::now();
    job.fleet.nodes[0].controller().apply(notice(Interruption::HostMaintenance)).await;
    rank0.abort();
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by the budget");
    let last = job.last_checkpoint(0);
    assert!(last.contains("acked by 1/2"), "{last}");
    assert!(last.contains("no answer from gpu-1/rank-1"), "{last}");
    assert!(last.contains("timed-out=1"), "{last}");
    let rec = job.record(1).await;
    assert!(!rec["checkpoint_request"].is_empty(), "rank 1 was asked");
}

/// An ack of an earlier round (or any other value) never counts: rank 1 still shows the ack of
/// a save before this round, and answers nothing new.
#[tokio::test]
async fn an_earlier_round_s_ack_is_no_answer_to_this_one() {
    let mut job = Job::new(|_, c| c.checkpoint.maintenance_budget = Duration::from_secs(1)).await;
    let old = [
        ("checkpoint_request".to_string(), "0123456789ab".to_string()),
        ("checkpoint_ack".to_string(), "0123456789ab".to_string()),
    ];
    job.coord.hset(&job.key(1), &old, None).await.unwrap();
    let rank0 = saving_rank(job.coord.clone(), job.key(0), Duration::ZERO);
    let results = job.fleet.nodes[0]
        .controller()
        .checkpoint("host-maintenance", Duration::from_secs(1))
        .await;
    rank0.abort();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].outcome, Outcome::TimedOut, "{results:?}");
    assert_eq!(results[0].method, "gang");
    assert!(results[0].detail.contains("no answer from gpu-1/rank-1"), "{results:?}");
    assert_eq!(job.record(1).await["checkpoint_ack"], "0123456789ab");
}

/// A member on a node with a tighter budget (a Spot node of a mixed pool) sets the round's
/// budget: the node of the notice stops waiting at 1 s, not its own 20 s.
#[tokio::test]
async fn the_tightest_member_budget_bounds_the_round() {
    let mut job = Job::new(|i, c| {
        c.checkpoint.preemption_budget = Duration::from_secs(if i == 1 { 1 } else { 20 })
    })
    .await;
    let started = tokio::time::Instant::now();
    job.fleet.nodes[0].controller().apply(notice(Interruption::Preemption)).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited {:?}: the member's 1 s budget was not used",
        started.elapsed()
    );
    let last = job.last_checkpoint(0);
    assert!(last.contains("acked by 0/2"), "{last}");
    assert!(last.contains("within 1.0s"), "{last}");
}

/// Notices on both nodes at once (a zone-wide maintenance): the second joins the round the
/// first opened — one id, both ranks save once, both Nodes show the gang acknowledged.
#[tokio::test]
async fn a_second_member_s_notice_joins_the_open_round() {
    let job = Job::new(|_, _| {}).await;
    let ranks: Vec<_> = (0..2)
        .map(|i| saving_rank(job.coord.clone(), job.key(i), Duration::from_millis(500)))
        .collect();
    let mut job = job;
    let (first, second) = job.fleet.nodes.split_at_mut(1);
    let opened = first[0].controller().apply(notice(Interruption::HostMaintenance));
    let joined = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        second[0].controller().apply(notice(Interruption::HostMaintenance)).await
    };
    tokio::join!(opened, joined);
    ranks.iter().for_each(|r| r.abort());
    let (a, b) = (job.record(0).await, job.record(1).await);
    assert_eq!(a["checkpoint_request"], b["checkpoint_request"]);
    let (l0, l1) = (job.last_checkpoint(0), job.last_checkpoint(1));
    assert!(l0.contains("acked by 2/2"), "{l0}");
    assert!(l1.contains("acked by 2/2"), "{l1}");
    assert!(l1.contains("(opened by gpu-0)"), "{l1}");
    assert!(!l0.contains("opened by"), "{l0}");
}

/// A node that joins a round opened earlier tells its workers the time the round has left, not
/// its own whole budget: a rank told 4 s a second into a 4 s round would save past its end.
#[tokio::test]
async fn a_joining_node_tells_its_workers_the_time_the_round_has_left() {
    let job = Job::new(|_, c| c.checkpoint.maintenance_budget = Duration::from_secs(4)).await;
    let hook = Receiver::start().await;
    job.fleet.nodes[1].runtime.set_checkpoint_label("c1", &hook.url);
    // Rank 1 saves 2 s after the opener's request reaches its record: after node 1 joined.
    let ranks = [
        saving_rank(job.coord.clone(), job.key(0), Duration::ZERO),
        saving_rank(job.coord.clone(), job.key(1), Duration::from_secs(2)),
    ];
    let mut job = job;
    let (first, second) = job.fleet.nodes.split_at_mut(1);
    let opened = first[0].controller().apply(notice(Interruption::HostMaintenance));
    let joined = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        second[0].controller().apply(notice(Interruption::HostMaintenance)).await
    };
    tokio::join!(opened, joined);
    ranks.iter().for_each(|r| r.abort());
    let l1 = job.last_checkpoint(1);
    assert!(l1.contains("(opened by gpu-0)") && l1.contains("acked by 2/2"), "{l1}");
    let bodies = hook.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1, "node 1's one POST to rank 1: {bodies:?}");
    // 4 s from the round's opening, a second of which had passed when node 1 joined (the old
    // code sent node 1's own budget: 3.99 s).
    let left = bodies[0]["deadline_ms"].as_u64().unwrap();
    assert!((1_000..3_500).contains(&left), "deadline_ms {left}: not the round's time left");
}

/// Two agents' gang on a real Redis (their cycles publish the gang's view), and a config for
/// the CLI with their key prefix and budgets of 1 s (preemption) and 4 s (maintenance).
async fn redis_gang(gang: &str) -> (Arc<dyn Coordinator>, Vec<Keys>, tempfile::TempDir) {
    let url = shared_redis_url();
    let prefix = unique("drill");
    let coord: Arc<dyn Coordinator> =
        Arc::new(RedisCoordinator::new(&url, Duration::from_secs(2)).unwrap());
    let mut keys = Vec::new();
    for i in 0..2 {
        let mut cfg = node_config(&format!("gpu-{i}"));
        cfg.redis.key_prefix = prefix.clone();
        cfg.validate().unwrap();
        let k = Keys::new(&prefix, &cfg.node_name);
        write_record(
            coord.as_ref(),
            &k.status(&format!("rank-{i}")),
            "processing",
            coord.time().await.unwrap(),
            &[("gang", gang), ("gang_size", "2")],
        )
        .await;
        let runtime = FakeRuntime::default();
        runtime.add(&format!("c{i}"), &format!("rank-{i}"));
        let metrics = Arc::new(Metrics::new());
        let mut agent = Agent::new(
            cfg,
            coord.clone(),
            Arc::new(runtime),
            Notifier::new(None, metrics.clone()),
            metrics,
        );
        assert_eq!(agent.cycle().await.coordinator_error, None);
        keys.push(k);
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("vigil.toml"),
        format!(
            "node_name = \"laptop\"\n[redis]\nkey_prefix = \"{prefix}\"\n[checkpoint]\npreemption_budget = \"1s\"\nmaintenance_budget = \"4s\"\n"
        ),
    )
    .unwrap();
    (coord, keys, dir)
}

/// `vigil drill checkpoint` with the rig's config, off the async runtime (the ranks answer
/// meanwhile).
async fn drill(dir: &std::path::Path, args: &[&str]) -> (i32, String) {
    let cfg = dir.join("vigil.toml").to_string_lossy().to_string();
    let mut argv: Vec<String> =
        ["drill", "checkpoint", "-c", &cfg].iter().map(|s| s.to_string()).collect();
    argv.extend(args.iter().map(|s| s.to_string()));
    let url = shared_redis_url();
    tokio::task::spawn_blocking(move || {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let (code, out, err) = vigil(&argv, &[("REDIS_URL", &url)]);
        (code, format!("{out}{err}"))
    })
    .await
    .unwrap()
}

/// A drill of a gang measures every rank's save against both budgets: rank 1 takes 1.5 s, so
/// the gang fits a maintenance notice (4 s) and not a preemption (1 s). The requests are marked
/// as a drill; the verdict lands in both nodes' trails and in the first node's drills.
#[tokio::test(flavor = "multi_thread")]
async fn a_drill_measures_the_gang_against_both_budgets_and_records_its_verdict() {
    let gang = unique("ml/drill-");
    let (coord, keys, dir) = redis_gang(&gang).await;
    let ranks = [
        saving_rank(coord.clone(), keys[0].status("rank-0"), Duration::from_millis(100)),
        saving_rank(coord.clone(), keys[1].status("rank-1"), Duration::from_millis(1_500)),
    ];
    let (code, out) = drill(dir.path(), &["--gang", &gang, "--require", "maintenance"]).await;
    ranks.iter().for_each(|r| r.abort());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("gang:{gang}: 2/2 acknowledged")), "{out}");
    assert!(out.contains("fits the 1 s preemption budget: no"), "{out}");
    assert!(out.contains("fits the 4 s maintenance budget: yes"), "{out}");
    let rec = coord.hgetall(&keys[1].status("rank-1")).await.unwrap();
    assert_eq!(rec["checkpoint_reason"], "drill");
    assert_eq!(rec["checkpoint_drill"], "1");
    assert_eq!(rec["checkpoint_ack"], rec["checkpoint_request"]);
    for (i, k) in keys.iter().enumerate() {
        let trail = coord.read_recent(&k.trail(), 20).await.unwrap();
        let line = trail
            .iter()
            .find(|(_, f)| f["decision"] == "checkpoint-drill")
            .unwrap_or_else(|| panic!("no drill in gpu-{i}'s trail: {trail:?}"));
        assert!(line.1["detail"].contains("preemption budget: no"), "{line:?}");
    }
    let stored = coord.hgetall(&keys[0].drills()).await.unwrap();
    let result: serde_json::Value = serde_json::from_str(&stored[&format!("gang:{gang}")]).unwrap();
    assert_eq!(result["fits_preemption"], false);
    assert_eq!(result["fits_maintenance"], true);
    assert!(coord.hgetall(&keys[1].drills()).await.unwrap().is_empty());
    let index = coord.hgetall(&keys[0].fleet_drills()).await.unwrap();
    assert_eq!(index[&format!("gang:{gang}")], "gpu-0", "the fleet's index names its exporter");
    // The round's key is gone: a real notice later opens its own round.
    let round = coord.get_many(&[keys[0].gang_checkpoint(&gang)]).await.unwrap();
    assert_eq!(round, vec![None]);
}

/// A drill never competes with a real request: a rank still saving for a notice makes the drill
/// refuse (exit 1, naming it) and leaves every record as it was. A rank that never answers a
/// drill is named, and the drill exits 1.
#[tokio::test(flavor = "multi_thread")]
async fn a_drill_refuses_beside_a_pending_request_and_names_a_silent_rank() {
    let gang = unique("ml/drill-");
    let (coord, keys, dir) = redis_gang(&gang).await;
    let now = coord.time().await.unwrap().to_string();
    let pending = [
        ("checkpoint_request".to_string(), "feedfacecafe".to_string()),
        ("checkpoint_reason".to_string(), "preemption".to_string()),
        ("checkpoint_requested_at".to_string(), now),
    ];
    coord.hset(&keys[1].status("rank-1"), &pending, None).await.unwrap();
    let (code, out) = drill(dir.path(), &["--gang", &gang]).await;
    assert_eq!(code, 3, "refused: {out}");
    assert!(out.contains("gpu-1/rank-1 has a checkpoint request pending (preemption"), "{out}");
    let rec0 = coord.hgetall(&keys[0].status("rank-0")).await.unwrap();
    assert!(!rec0.contains_key("checkpoint_request"), "{rec0:?}");

    // Answered: the drill runs; rank 0 answers it, rank 1 does not.
    let ack = [("checkpoint_ack".to_string(), "feedfacecafe".to_string())];
    coord.hset(&keys[1].status("rank-1"), &ack, None).await.unwrap();
    let rank0 = saving_rank(coord.clone(), keys[0].status("rank-0"), Duration::ZERO);
    let (code, out) = drill(dir.path(), &["--worker", "gpu-1/rank-1", "--wait", "1s"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("worker:gpu-1/rank-1: 0/1 acknowledged"), "{out}");
    assert!(out.contains("no answer from gpu-1/rank-1"), "{out}");
    let (code, out) = drill(dir.path(), &["--node", "gpu-0", "--wait", "3s"]).await;
    rank0.abort();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node:gpu-0: 1/1 acknowledged"), "{out}");
    let (code, out) = drill(dir.path(), &["--gang", "ml/no-such-job"]).await;
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("no members in the fleet view"), "{out}");
    for bad in [["--node", "gpu-{0}"], ["--worker", "gpu-}/rank-0"], ["--wait", "400d"]] {
        let (code, out) = drill(dir.path(), &bad).await;
        assert!(code == 1 || code == 2, "{bad:?} is refused before anything is asked: {out}");
    }
}

/// `--require preemption` gates on the budget: every rank answered, but not within 1 s; and a
/// real request written over the drill's interrupts it (exit 3, nothing recorded).
#[tokio::test(flavor = "multi_thread")]
async fn a_drill_can_gate_on_a_budget_and_a_real_request_interrupts_it() {
    let gang = unique("ml/drill-");
    let (coord, keys, dir) = redis_gang(&gang).await;
    let slow = saving_rank(coord.clone(), keys[0].status("rank-0"), Duration::from_millis(1_300));
    let (code, out) =
        drill(dir.path(), &["--worker", "gpu-0/rank-0", "--require", "preemption"]).await;
    slow.abort();
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("1/1 acknowledged") && out.contains("does not fit the preemption budget"),
        "{out}"
    );
    // A real notice's request lands on rank 0 while the drill waits. NB: once the drill's own
    // request is in the record, not after a fixed delay: a `vigil drill` process slow to start
    // on a loaded machine would otherwise find the real request first, and refuse (a pending
    // request) instead of being interrupted.
    let earlier = coord.hgetall(&keys[0].status("rank-0")).await.unwrap();
    let earlier = earlier.get("checkpoint_request").cloned();
    let notice = {
        let coord = coord.clone();
        let key = keys[0].status("rank-0");
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            loop {
                let rec = coord.hgetall(&key).await.unwrap();
                let asked = rec.get("checkpoint_request");
                if asked.is_some_and(|a| !a.is_empty())
                    && asked != earlier.as_ref()
                    && rec.get("checkpoint_reason").map(String::as_str) == Some("drill")
                {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the drill's request never reached rank 0: {rec:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let now = coord.time().await.unwrap().to_string();
            let fields = [
                ("checkpoint_request".to_string(), "0a0a0a0a0a0a".to_string()),
                ("checkpoint_reason".to_string(), "preemption".to_string()),
                ("checkpoint_requested_at".to_string(), now),
            ];
            coord.hset(&key, &fields, None).await.unwrap();
        })
    };
    let before = coord.hgetall(&keys[0].drills()).await.unwrap();
    // The drill waits its whole `--wait` (nobody answers): time enough for the notice to land.
    let (code, out) = drill(dir.path(), &["--node", "gpu-0", "--wait", "3s"]).await;
    notice.await.unwrap();
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("interrupted: gpu-0/rank-0 was asked for a real checkpoint (preemption)"),
        "{out}"
    );
    let after = coord.hgetall(&keys[0].drills()).await.unwrap();
    assert_eq!(before.get("node:gpu-0"), after.get("node:gpu-0"), "nothing recorded");
}

/// A real notice never joins a drill's round: its ranks must save for the notice, with a round
/// of its own (the drill then finds its id unanswered).
#[tokio::test]
async fn a_real_notice_replaces_a_drill_s_round() {
    let mut job = Job::new(|_, _| {}).await;
    let drill_round = serde_json::json!({
        "id": "d0d0d0d0d0d0", "reason": "drill", "at": SystemClock.now(),
        "until": SystemClock.now() + 60_000, "by": "laptop (vigil drill)", "drill": true,
    });
    let key = job.fleet.nodes[0].keys.gang_checkpoint(GANG);
    job.coord.set(&key, &drill_round.to_string(), Duration::from_secs(60)).await.unwrap();
    let ranks: Vec<_> =
        (0..2).map(|i| saving_rank(job.coord.clone(), job.key(i), Duration::ZERO)).collect();
    job.fleet.nodes[0].controller().apply(notice(Interruption::Preemption)).await;
    ranks.iter().for_each(|r| r.abort());
    let rec = job.record(1).await;
    assert_ne!(rec["checkpoint_request"], "d0d0d0d0d0d0");
    assert_eq!(rec["checkpoint_reason"], "preemption");
    let last = job.last_checkpoint(0);
    assert!(last.contains("acked by 2/2"), "{last}");
    assert!(!last.contains("opened by"), "{last}");
}

/// A preemption on another member's node while a maintenance round runs opens a round of its
/// own (a save of its own): it replaces the maintenance round, and the maintenance round counts
/// the members' acks of the later round — a newer save than it asked for.
#[tokio::test]
async fn a_preemption_replaces_a_maintenance_round_and_both_nodes_see_the_gang_saved() {
    let job = Job::new(|_, _| {}).await;
    let ranks: Vec<_> = (0..2)
        .map(|i| saving_rank(job.coord.clone(), job.key(i), Duration::from_millis(400)))
        .collect();
    let mut job = job;
    let (first, second) = job.fleet.nodes.split_at_mut(1);
    let maintenance = first[0].controller().apply(notice(Interruption::HostMaintenance));
    let preemption = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        second[0].controller().apply(notice(Interruption::Preemption)).await
    };
    tokio::join!(maintenance, preemption);
    ranks.iter().for_each(|r| r.abort());
    let (a, b) = (job.record(0).await, job.record(1).await);
    assert_eq!(a["checkpoint_reason"], "preemption");
    assert_eq!(a["checkpoint_request"], b["checkpoint_request"]);
    let (l0, l1) = (job.last_checkpoint(0), job.last_checkpoint(1));
    assert!(l0.contains("host-maintenance") && l0.contains("acked by 2/2"), "{l0}");
    assert!(l1.contains("preemption") && l1.contains("acked by 2/2"), "{l1}");
    assert!(!l1.contains("opened by"), "its own round: {l1}");
}

/// A member whose agent has not written its entry for `gone_after` (a rank that moved to another
/// node) is no member any more: it is not asked, and the round is acknowledged without it.
#[tokio::test]
async fn a_member_gone_from_the_view_is_not_asked() {
    let mut job = Job::new(|_, _| {}).await;
    let long_ago = SystemClock.now() - 86_400_000;
    let gone = serde_json::json!({"n": "gpu-9", "w": "rank-9", "v": "healthy", "s": "w", "ok": 120_000,
                                  "at": long_ago, "hb": long_ago});
    let shard = job.fleet.nodes[0].keys.gang_members(GANG, 0);
    let field = [("gpu-9/rank-9".to_string(), gone.to_string())];
    job.coord.hset(&shard, &field, None).await.unwrap();
    let ranks: Vec<_> =
        (0..2).map(|i| saving_rank(job.coord.clone(), job.key(i), Duration::ZERO)).collect();
    job.fleet.nodes[0].controller().apply(notice(Interruption::HostMaintenance)).await;
    ranks.iter().for_each(|r| r.abort());
    let last = job.last_checkpoint(0);
    assert!(last.contains("acked by 2/2"), "{last}");
    let stray = Keys::new("vigil", "gpu-9").status("rank-9");
    assert!(job.coord.hgetall(&stray).await.unwrap().is_empty(), "no record made for it");
}

/// A gang whose restarts are someone else's (`[gang] action = "alert-only"`: JobSet's failure
/// policy, Pathways) still gets its checkpoint round: saving before the node goes is never
/// another controller's job.
#[tokio::test]
async fn an_alert_only_gang_still_saves_on_a_notice() {
    let mut job = Job::new(|_, c| c.gang.action = vigil::config::GangAction::AlertOnly).await;
    let ranks: Vec<_> =
        (0..2).map(|i| saving_rank(job.coord.clone(), job.key(i), Duration::ZERO)).collect();
    job.fleet.nodes[0].controller().apply(notice(Interruption::Preemption)).await;
    ranks.iter().for_each(|r| r.abort());
    let last = job.last_checkpoint(0);
    assert!(last.contains("acked by 2/2"), "{last}");
    assert_eq!(job.record(1).await["checkpoint_reason"], "preemption");
}
