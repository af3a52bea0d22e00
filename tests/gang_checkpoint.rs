//! A checkpoint is a collective (issue 30): a notice on one member's node opens one round for
//! the member's whole gang — the same request id in every member's record, on every node — and
//! the node of the notice waits until every member acknowledged that id, or the tightest budget
//! among the members' nodes ran out, naming who did not answer. Two agents (two node names) on
//! one coordinator, one rank each, through the real maintenance controller and its Node writes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::fakes::{FakeRuntime, RecordingNodeApi};
use common::wiring::{agent_and_controller, memory_coordinator, node_config, write_record};
use vigil::alerts::Notifier;
use vigil::clock::{Clock, SystemClock};
use vigil::config::Config;
use vigil::coord::{Coordinator, Keys};
use vigil::hang::agent::Agent;
use vigil::maintenance::model::{Interruption, MaintenanceState, Phase};
use vigil::maintenance::request::Outcome;
use vigil::metrics::Metrics;
use vigil::node::controller::{Controller, SharedFacts};

const GANG: &str = "ml/llama-70b";

struct Member {
    keys: Keys,
    node: RecordingNodeApi,
    agent: Agent,
    controller: Controller,
}

struct Job {
    coord: Arc<dyn Coordinator>,
    members: Vec<Member>,
}

impl Job {
    /// Two ranks of one gang on gpu-0 and gpu-1 (`tweak(i, cfg)` per node), both agents
    /// through one cycle so the gang's view holds both.
    async fn new(tweak: impl Fn(usize, &mut Config)) -> Job {
        let coord = memory_coordinator();
        let mut members = Vec::new();
        for i in 0..2 {
            let mut cfg = node_config(&format!("gpu-{i}"));
            tweak(i, &mut cfg);
            cfg.validate().unwrap();
            let runtime = FakeRuntime::default();
            runtime.add(&format!("c{i}"), &format!("rank-{i}"));
            let node = RecordingNodeApi::default();
            let metrics = Arc::new(Metrics::new());
            let (agent, controller) = agent_and_controller(
                &cfg,
                &coord,
                &runtime,
                Arc::new(node.clone()),
                Notifier::new(None, metrics.clone()),
                &metrics,
                SharedFacts::default(),
            );
            members.push(Member {
                keys: Keys::new(&cfg.redis.key_prefix, &cfg.node_name),
                node,
                agent,
                controller,
            });
        }
        let mut job = Job { coord, members };
        for i in 0..2 {
            job.beat(i).await;
        }
        for m in &mut job.members {
            assert_eq!(m.agent.cycle().await.coordinator_error, None);
        }
        job
    }

    fn key(&self, i: usize) -> String {
        self.members[i].keys.status(&format!("rank-{i}"))
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
        self.members[i].node.last().annotations["vigil.dev/last-checkpoint"]
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
    job.members[0]
        .controller
        .apply(notice(Interruption::HostMaintenance))
        .await;
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
    let trail = job
        .coord
        .read_recent(&job.members[0].keys.trail(), 50)
        .await
        .unwrap();
    let acked = trail
        .iter()
        .find(|(_, f)| f["decision"] == "checkpoint-acked")
        .expect("the gang's round in node 0's trail");
    assert!(acked.1["detail"].contains("acked by 2/2"), "{:?}", acked.1);
    // The round ended acknowledged: its key is gone, and the next notice asks for a new save.
    let round_key = job.members[0].keys.gang_checkpoint(GANG);
    assert_eq!(job.coord.get_many(&[round_key]).await.unwrap(), vec![None]);
}

#[tokio::test]
async fn a_stalled_rank_cuts_the_round_short_at_the_budget_and_is_named() {
    let mut job = Job::new(|_, c| c.checkpoint.maintenance_budget = Duration::from_secs(1)).await;
    let rank0 = saving_rank(job.coord.clone(), job.key(0), Duration::ZERO);
    let started = tokio::time::Instant::now();
    job.members[0]
        .controller
        .apply(notice(Interruption::HostMaintenance))
        .await;
    rank0.abort();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the budget"
    );
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
    let results = job.members[0]
        .controller
        .checkpoint("host-maintenance", Duration::from_secs(1))
        .await;
    rank0.abort();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].outcome, Outcome::TimedOut, "{results:?}");
    assert_eq!(results[0].method, "gang");
    assert!(
        results[0].detail.contains("no answer from gpu-1/rank-1"),
        "{results:?}"
    );
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
    job.members[0]
        .controller
        .apply(notice(Interruption::Preemption))
        .await;
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
    let Job { coord, mut members } = job;
    let (first, second) = members.split_at_mut(1);
    let opened = first[0]
        .controller
        .apply(notice(Interruption::HostMaintenance));
    let joined = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        second[0]
            .controller
            .apply(notice(Interruption::HostMaintenance))
            .await
    };
    tokio::join!(opened, joined);
    ranks.iter().for_each(|r| r.abort());
    let job = Job { coord, members };
    let (a, b) = (job.record(0).await, job.record(1).await);
    assert_eq!(a["checkpoint_request"], b["checkpoint_request"]);
    let (l0, l1) = (job.last_checkpoint(0), job.last_checkpoint(1));
    assert!(l0.contains("acked by 2/2"), "{l0}");
    assert!(l1.contains("acked by 2/2"), "{l1}");
    assert!(l1.contains("(opened by gpu-0)"), "{l1}");
    assert!(!l0.contains("opened by"), "{l0}");
}
