//! A distributed job hangs as a whole: four agents (four node names) on one coordinator, one rank
//! each, ranks that stop together — one incident, one decision, every rank restarted once, one
//! fleet unit; and every reason the gang must not be restarted as a whole (a straggler, a
//! member's breaker, a silent agent, a missing member, `alert-only`). The real agents and
//! pipeline, the in-process coordinator and a fake clock: no sleeps.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::fakes::RecordingSink;
use common::fleet::Fleet;
use common::wiring::write_record;
use vigil::alerts::AlertKind;
use vigil::clock::{utc_day, Millis};
use vigil::config::{Config, GangAction};
use vigil::coord::Coordinator;

const POLL: Duration = Duration::from_secs(15);
const GANG: &str = "ml/llama-70b";

/// A job of `n` ranks, one on each node of the shared fleet harness (`gpu-0`…, rank `i` in
/// container `c{i}`), every rank beating as a member of one gang of `size`.
struct Job {
    fleet: Fleet,
    store: Arc<dyn Coordinator>,
    sink: RecordingSink,
    size: usize,
    /// The step the ranks' beats say (`step-N`), when they say one.
    step: Option<u64>,
}

impl Job {
    /// `n` ranks of one gang on nodes gpu-0.. (gang_size `size`), each with its own agent.
    fn new(n: usize, size: usize, tweak: impl Fn(&mut Config) + 'static) -> Job {
        Job::on_nodes(n, size, POLL, move |_, c| tweak(c))
    }

    /// The same, polled every `poll`, each node's agent configured by `tweak(node, config)`.
    fn on_nodes(
        n: usize,
        size: usize,
        poll: Duration,
        tweak: impl Fn(usize, &mut Config) + 'static,
    ) -> Job {
        let fleet = Fleet::builder()
            .nodes(n)
            .poll(poll)
            .config(move |i, c| {
                c.poll_interval = poll;
                tweak(i, c)
            })
            .build();
        for (i, node) in fleet.nodes.iter().enumerate() {
            node.runtime.add(&format!("c{i}"), &format!("rank-{i}"));
        }
        Job { store: fleet.store.clone(), sink: fleet.sink.clone(), fleet, size, step: None }
    }

    fn now(&self) -> Millis {
        self.fleet.now()
    }

    /// Rank `i` beats (working, at the job's `step` when it has one), stamped `ago` ms before now.
    async fn beat(&self, i: usize, ago: Millis) {
        self.beat_as(i, &format!("rank-{i}"), ago).await
    }

    /// Worker `worker` on rank `i`'s node beats as a member of the job (see [`Job::beat`]).
    async fn beat_as(&self, i: usize, worker: &str, ago: Millis) {
        let size = self.size.to_string();
        let step = self.step.map(|s| format!("step-{s}"));
        let mut fields = vec![("gang", GANG), ("gang_size", &size), ("job", "llama")];
        if let Some(s) = &step {
            fields.push(("progress", s));
        }
        write_record(
            self.store.as_ref(),
            &self.fleet.nodes[i].keys.status(worker),
            "processing",
            self.now() - ago,
            &fields,
        )
        .await;
    }

    async fn beat_all(&self) {
        for i in 0..self.fleet.nodes.len() {
            self.beat(i, 0).await;
        }
    }

    /// One poll interval, then one cycle of every live agent.
    async fn tick(&mut self) {
        for report in self.fleet.tick().await {
            assert_eq!(report.coordinator_error, None);
        }
    }

    async fn run_for(&mut self, d: Duration) {
        self.fleet.run_for(d).await
    }

    fn restarts(&self) -> Vec<usize> {
        (0..self.fleet.nodes.len())
            .map(|i| self.fleet.nodes[i].runtime.restarts(&format!("c{i}")))
            .collect()
    }

    async fn counter(&self, key: &str) -> u64 {
        self.store.counter(key).await.unwrap()
    }

    async fn fleet_budget_used(&self) -> u64 {
        let window = self.now().div_euclid(3_600_000);
        self.counter(&self.fleet.nodes[0].keys.fleet_budget(window)).await
    }
}

/// Every rank progresses for a minute, then the collective stops: rank 2 first, the others 3 s
/// later (they block in the next all-reduce).
async fn collective_stops(job: &mut Job) {
    for _ in 0..4 {
        job.beat_all().await;
        job.tick().await;
    }
    for i in 0..job.fleet.nodes.len() {
        job.beat(i, if i == 2 { 3_000 } else { 0 }).await;
    }
}

#[tokio::test]
async fn a_hung_collective_is_one_incident_one_decision_and_one_restart_of_every_rank() {
    let mut job = Job::new(4, 4, |_| {});
    collective_stops(&mut job).await;
    let mut first_restart: Vec<Option<Millis>> = vec![None; 4];
    let end = job.now() + 600_000;
    while job.now() < end {
        job.tick().await;
        for (i, n) in job.restarts().iter().enumerate() {
            if *n > 0 && first_restart[i].is_none() {
                first_restart[i] = Some(job.now());
            }
        }
    }
    assert_eq!(job.restarts(), vec![1, 1, 1, 1], "every rank restarted exactly once");
    let times: Vec<Millis> = first_restart.iter().map(|t| t.unwrap()).collect();
    let spread = times.iter().max().unwrap() - times.iter().min().unwrap();
    assert!(spread <= 2 * POLL.as_millis() as Millis, "restarts {spread} ms apart");

    let hung = job.sink.of(AlertKind::Hung);
    assert_eq!(
        hung.len(),
        1,
        "one hung page for the gang, not one per rank: {:?}",
        job.sink.kinds()
    );
    assert_eq!(hung[0].gang.as_deref(), Some(GANG));
    assert_eq!(hung[0].worker.as_deref(), Some("rank-2"), "the rank that stopped first");
    assert_eq!(hung[0].node, "gpu-2");
    assert!(hung[0].detail.contains("first to stop was rank-2"), "{}", hung[0].detail);
    assert_eq!(job.sink.count(AlertKind::Restarting), 1);
    assert_eq!(job.sink.count(AlertKind::Escalation), 0);
    assert_eq!(job.fleet_budget_used().await, 1, "one fleet unit for one gang restart");
    let day = utc_day(job.now());
    let gang_breaker = job.fleet.nodes[0].keys.gang_breaker(GANG, &day);
    assert_eq!(job.counter(&gang_breaker).await, 1);
    for r in &job.fleet.nodes {
        assert_eq!(
            job.counter(&r.keys.breaker(&day)).await,
            1,
            "each node counts its rank's restart"
        );
    }
}

#[tokio::test]
async fn pods_of_one_jobset_are_one_gang_without_a_gang_in_their_records() {
    let mut job = Job::new(3, 3, |_| {});
    for (i, r) in job.fleet.nodes.iter().enumerate() {
        r.runtime.set_pod_labels(
            &format!("c{i}"),
            "ml",
            &[
                ("jobset.sigs.k8s.io/jobset-name", "llama"),
                ("jobset.sigs.k8s.io/restart-attempt", "0"),
            ],
        );
    }
    // The records name no gang: only the pods' labels do.
    let plain = |job: &Job, i: usize, ago: Millis| {
        let key = job.fleet.nodes[i].keys.status(&format!("rank-{i}"));
        let at = job.now() - ago;
        let store = job.store.clone();
        async move { write_record(store.as_ref(), &key, "processing", at, &[]).await }
    };
    for _ in 0..4 {
        for i in 0..3 {
            plain(&job, i, 0).await;
        }
        job.tick().await;
    }
    for i in 0..3 {
        plain(&job, i, if i == 1 { 3_000 } else { 0 }).await;
    }
    job.run_for(Duration::from_secs(600)).await;
    assert_eq!(job.restarts(), vec![1, 1, 1]);
    let hung = job.sink.of(AlertKind::Hung);
    assert_eq!(hung.len(), 1, "{:?}", job.sink.kinds());
    assert_eq!(hung[0].gang.as_deref(), Some("ml/jobset/llama"));
    assert_eq!(hung[0].worker.as_deref(), Some("rank-1"));
    // Issue 41: no size on a JobSet's pods: unknown, and said so; the members seen are a count.
    assert_eq!(hung[0].gang_size, None);
    assert_eq!(hung[0].gang_members, Some(3));
    assert!(hung[0].summary().contains("(size unknown; 3 reporting)"), "{}", hung[0].summary());
}

#[tokio::test]
async fn a_restarted_gang_that_progresses_closes_its_incident_and_a_later_hang_is_a_new_one() {
    let mut job = Job::new(3, 3, |_| {});
    collective_stops(&mut job).await;
    job.run_for(Duration::from_secs(420)).await;
    assert_eq!(job.restarts(), vec![1, 1, 1]);
    // The new incarnations train for a while…
    for _ in 0..50 {
        job.beat_all().await;
        job.tick().await;
    }
    // …then hang again: a second incident, restarted again (the gang breaker allows 2 a day);
    // its page is the escalation of the first restart (17 minutes before: inside cooldown +
    // escalate_after).
    collective_stops(&mut job).await;
    job.run_for(Duration::from_secs(420)).await;
    assert_eq!(job.restarts(), vec![2, 2, 2]);
    assert_eq!(job.sink.count(AlertKind::Hung), 1);
    assert_eq!(
        job.sink.count(AlertKind::Escalation),
        1,
        "the second stop's page: it came within policy.cooldown + escalate_after of the restart"
    );
    assert_eq!(job.sink.count(AlertKind::Restarting), 2);
    // A third hang finds the gang's breaker open: one blocked page, nobody restarted.
    for _ in 0..50 {
        job.beat_all().await;
        job.tick().await;
    }
    collective_stops(&mut job).await;
    job.run_for(Duration::from_secs(420)).await;
    assert_eq!(job.restarts(), vec![2, 2, 2]);
    let blocked = job.sink.of(AlertKind::GangBlocked);
    assert_eq!(blocked.len(), 1);
    assert!(blocked[0].detail.contains("gang's breaker is open"), "{}", blocked[0].detail);
}

/// The ranks train from step `from` to `to` (one step per poll interval), then the collective
/// stops there (rank 2 first).
async fn train_and_stop(job: &mut Job, from: u64, to: u64) {
    for s in from..=to {
        job.step = Some(s);
        job.beat_all().await;
        job.tick().await;
    }
    for i in 0..job.fleet.nodes.len() {
        job.beat(i, if i == 2 { 3_000 } else { 0 }).await;
    }
}

#[tokio::test]
async fn a_gang_whose_restarts_bring_no_rank_past_its_step_is_not_restarted_a_third_time() {
    // The gang's breaker would allow more: the run of fruitless restarts is what stops the third.
    let mut job = Job::new(4, 4, |c| c.gang.breaker_per_day = 10);
    train_and_stop(&mut job, 41_195, 41_200).await;
    job.run_for(Duration::from_secs(420)).await;
    assert_eq!(job.restarts(), vec![1, 1, 1, 1]);
    // Each restart resumes from the checkpoint at 41150 and stops at 41200 again.
    train_and_stop(&mut job, 41_150, 41_200).await;
    job.run_for(Duration::from_secs(420)).await;
    assert_eq!(job.restarts(), vec![2, 2, 2, 2], "the second restart runs");
    train_and_stop(&mut job, 41_150, 41_200).await;
    job.run_for(Duration::from_secs(900)).await;
    assert_eq!(job.restarts(), vec![2, 2, 2, 2], "no third restart: {:?}", job.sink.kinds());
    let pages = job.sink.of(AlertKind::Fruitless);
    assert_eq!(pages.len(), 1, "one page: {:?}", job.sink.kinds());
    assert_eq!(pages[0].gang.as_deref(), Some(GANG));
    assert!(
        pages[0].detail.starts_with(
            "restarts are not helping: 2 restart(s) of every member, no progress past step 41200 since"
        ),
        "{}",
        pages[0].detail
    );
    assert_eq!(job.sink.count(AlertKind::Restarting), 2);
    let day = utc_day(job.now());
    let gang_breaker = job.fleet.nodes[0].keys.gang_breaker(GANG, &day);
    assert_eq!(job.counter(&gang_breaker).await, 2, "no unit for the refusal");
    assert_eq!(job.fleet_budget_used().await, 2);
    let mut noted = 0;
    for r in &job.fleet.nodes {
        let trail = common::wiring::trail_decisions(job.store.as_ref(), &r.keys).await;
        noted += trail.iter().filter(|d| *d == "skipped-fruitless").count();
    }
    assert_eq!(noted, 1, "the trail says it once");

    let run_key = job.fleet.nodes[0].keys.gang_fruitless(GANG);
    let run = job.store.get(&run_key).await.unwrap().unwrap();
    assert!(run.starts_with("2:") && run.ends_with(":41200"), "{run}");

    // A person fixes the job: the run is over as soon as a rank gets past 41200, while it trains.
    for s in 41_150..=41_202 {
        job.step = Some(s);
        job.beat_all().await;
        job.tick().await;
    }
    assert_eq!(job.store.get(&run_key).await.unwrap(), None, "the run ended");
    // It hangs elsewhere: a restart helps again, the first of a new run.
    train_and_stop(&mut job, 41_203, 41_230).await;
    job.run_for(Duration::from_secs(420)).await;
    assert_eq!(job.restarts(), vec![3, 3, 3, 3], "{:?}", job.sink.kinds());
    assert_eq!(job.sink.count(AlertKind::Fruitless), 1);
    let run = job.store.get(&run_key).await.unwrap().unwrap();
    assert!(run.starts_with("1:") && run.ends_with(":41230"), "{run}");
}

/// A member's old incarnation may still beat while its own restart runs (a slow runtime): a beat
/// past the step then is the old incarnation's, not progress its restart brought, and it must not
/// end the gang's run of fruitless restarts (a worker's run draws that line at its restart's
/// verification; the gang's is drawn per member, the same way).
#[tokio::test]
async fn beats_of_a_members_old_incarnation_during_its_slow_restart_are_no_progress() {
    use futures_util::FutureExt;
    use vigil::clock::Clock;
    let mut job = Job::new(2, 2, |c| c.policy.max_fruitless_restarts = 1);
    let (store, key, clock) =
        (job.store.clone(), job.fleet.nodes[1].keys.status("rank-1"), job.fleet.clock.clone());
    let once = std::sync::atomic::AtomicBool::new(true);
    job.fleet.nodes[1].runtime.on_restart(move |_| {
        if !once.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        // 30 s into rank 1's restart, its old incarnation beats one step past the stop.
        clock.advance(Duration::from_secs(30));
        let fields =
            [("gang", GANG), ("gang_size", "2"), ("job", "llama"), ("progress", "step-41201")];
        let beat = write_record(store.as_ref(), &key, "processing", clock.now(), &fields);
        assert!(beat.now_or_never().is_some(), "the in-process store answers at once");
    });
    train_and_stop(&mut job, 41_195, 41_200).await;
    job.run_for(Duration::from_secs(420)).await;
    assert_eq!(job.restarts(), vec![1, 1]);
    // The new incarnations resume from the checkpoint at 41150 and stop at 41200 again.
    train_and_stop(&mut job, 41_150, 41_200).await;
    job.run_for(Duration::from_secs(900)).await;
    assert_eq!(job.restarts(), vec![1, 1], "no second restart: {:?}", job.sink.kinds());
    assert_eq!(job.sink.count(AlertKind::Fruitless), 1, "{:?}", job.sink.kinds());
}

#[tokio::test]
async fn a_gang_that_hangs_again_right_after_its_restart_escalates_once_and_is_not_restarted_twice()
{
    let mut job = Job::new(2, 2, |_| {});
    collective_stops(&mut job).await;
    // The restarted ranks never beat: they hang at the rendezvous. Decided at ~390 s; the
    // escalation `escalate_after` (10 min) later; never a second restart in that incident.
    job.run_for(Duration::from_secs(1_100)).await;
    assert_eq!(job.restarts(), vec![1, 1], "not twice in one gang incident");
    assert_eq!(job.sink.count(AlertKind::Escalation), 1, "{:?}", job.sink.kinds());
    // Past the cooldown the incident is over, as a single worker's booting is: a new incident,
    // restarted again (the gang's breaker bounds this), and no second escalation for the
    // same restart.
    job.run_for(Duration::from_secs(600)).await;
    assert_eq!(job.restarts(), vec![2, 2]);
    assert_eq!(job.sink.count(AlertKind::Escalation), 1, "{:?}", job.sink.kinds());
    assert_eq!(job.sink.count(AlertKind::Hung), 1, "the second stop's page is the escalation");
}

#[tokio::test]
async fn a_straggler_is_named_once_and_not_restarted_alone() {
    let mut job = Job::new(3, 3, |_| {});
    job.beat_all().await;
    for _ in 0..30 {
        for i in [0, 2] {
            job.beat(i, 0).await;
        }
        job.tick().await;
    }
    assert_eq!(job.restarts(), vec![0, 0, 0]);
    let s = job.sink.of(AlertKind::Straggler);
    assert_eq!(s.len(), 1, "{:?}", job.sink.kinds());
    assert_eq!(s[0].worker.as_deref(), Some("rank-1"));
    assert_eq!(job.sink.count(AlertKind::Hung), 0);
}

#[tokio::test]
async fn a_member_whose_node_breaker_is_open_blocks_the_whole_gang() {
    let mut job = Job::new(4, 4, |_| {});
    let day = utc_day(job.now());
    for _ in 0..3 {
        job.store
            .incr_capped(&job.fleet.nodes[3].keys.breaker(&day), 3, Duration::from_secs(3600))
            .await
            .unwrap();
    }
    collective_stops(&mut job).await;
    job.run_for(Duration::from_secs(600)).await;
    assert_eq!(job.restarts(), vec![0, 0, 0, 0], "all or nothing");
    let blocked = job.sink.of(AlertKind::GangBlocked);
    assert_eq!(blocked.len(), 1);
    assert!(
        blocked[0].detail.contains("gpu-3/rank-3: the breaker of gpu-3 is open"),
        "{}",
        blocked[0].detail
    );
    assert!(blocked[0].page);
    assert_eq!(job.fleet_budget_used().await, 0);
}

#[tokio::test]
async fn a_silent_agent_or_a_missing_member_blocks_the_whole_gang() {
    let mut job = Job::new(3, 3, |_| {});
    collective_stops(&mut job).await;
    job.fleet.nodes[1].alive = false;
    job.run_for(Duration::from_secs(600)).await;
    assert_eq!(job.restarts(), vec![0, 0, 0]);
    let blocked = job.sink.of(AlertKind::GangBlocked);
    assert_eq!(blocked.len(), 1);
    assert!(
        blocked[0].detail.contains("the agent on gpu-1 has been silent"),
        "{}",
        blocked[0].detail
    );

    let mut job = Job::new(3, 4, |_| {});
    collective_stops(&mut job).await;
    job.run_for(Duration::from_secs(600)).await;
    assert_eq!(job.restarts(), vec![0, 0, 0]);
    let blocked = job.sink.of(AlertKind::GangBlocked);
    assert_eq!(blocked.len(), 1);
    assert!(blocked[0].detail.contains("1 of 4 members missing"), "{}", blocked[0].detail);
}

#[tokio::test]
async fn a_member_whose_node_stands_down_blocks_the_whole_gang() {
    let mut job = Job::new(3, 3, |_| {});
    // Node gpu-1's agent is stopping (SIGTERM: the node is going away): it restarts nothing.
    let term = tokio_util::sync::CancellationToken::new();
    let node = &mut job.fleet.nodes[1];
    let stopping = node.agents.remove(0).with_shutdown(term.clone());
    node.agents.insert(0, stopping);
    term.cancel();
    collective_stops(&mut job).await;
    job.run_for(Duration::from_secs(600)).await;
    assert_eq!(job.restarts(), vec![0, 0, 0], "all or nothing");
    let blocked = job.sink.of(AlertKind::GangBlocked);
    assert_eq!(blocked.len(), 1, "{:?}", job.sink.kinds());
    assert!(
        blocked[0].detail.contains("gpu-1/rank-1: the agent is shutting down on gpu-1"),
        "{}",
        blocked[0].detail
    );
}

/// A member's agent that has just started (its node's first reads not in) defers the gang's
/// decision quietly: no `gang-blocked` page (which would spend the incident's one), no restart;
/// once its reads are in, the whole gang is restarted once.
#[tokio::test]
async fn a_member_whose_agent_just_started_defers_the_gang_without_a_page() {
    let mut job = Job::new(3, 3, |_| {});
    // The fake clock does not move the process's monotonic clock: the bound stays far off.
    let facts = vigil::node::controller::facts_at_start(Duration::from_secs(3600));
    let node = &mut job.fleet.nodes[1];
    let starting = node.agents.remove(0).with_facts(facts.clone());
    node.agents.insert(0, starting);
    collective_stops(&mut job).await;
    job.run_for(Duration::from_secs(600)).await;
    assert_eq!(job.restarts(), vec![0, 0, 0], "all or nothing, and not yet");
    assert_eq!(job.sink.count(AlertKind::GangBlocked), 0, "{:?}", job.sink.kinds());
    assert_eq!(job.sink.count(AlertKind::Hung), 1, "the hang is paged");
    // Its reads are in: the gang is restarted as a whole.
    facts.write().unwrap().unread = None;
    job.run_for(Duration::from_secs(120)).await;
    assert_eq!(job.restarts(), vec![1, 1, 1]);
    assert_eq!(job.sink.count(AlertKind::GangBlocked), 0);
}

#[tokio::test]
async fn an_alert_only_gang_is_paged_once_and_never_restarted() {
    let mut job = Job::new(3, 3, |c| c.gang.action = GangAction::AlertOnly);
    collective_stops(&mut job).await;
    job.run_for(Duration::from_secs(900)).await;
    assert_eq!(job.restarts(), vec![0, 0, 0]);
    assert_eq!(job.sink.count(AlertKind::Hung), 1);
    assert_eq!(job.sink.count(AlertKind::Restarting), 0);
}

/// Issue 46: a job of four ranks beating every 5 s, its rhythm learned by every member's agent
/// (`[policy.learned] restarts = true`, kept in the coordinator) for six minutes; then the
/// collective stops. `learned`: whether node `i`'s agent learns. The last beat's time.
async fn learned_job(learned: impl Fn(usize) -> bool + 'static) -> (Job, Millis) {
    let poll = Duration::from_secs(5);
    let mut job = Job::on_nodes(4, 4, poll, move |i, c| {
        c.policy.learned.enabled = learned(i);
        c.policy.learned.restarts = learned(i);
        c.policy.learned.history = Duration::from_secs(60);
    });
    for _ in 0..72 {
        job.beat_all().await;
        job.tick().await;
    }
    for i in 0..4 {
        job.beat(i, if i == 2 { 3_000 } else { 0 }).await;
    }
    let last = job.now();
    (job, last)
}

/// Ticks until every rank was restarted (at most 10 minutes): each one's restart, ms after
/// `last`.
async fn restarted_after(job: &mut Job, last: Millis) -> Vec<Option<Millis>> {
    let mut at = vec![None; 4];
    while job.now() - last < 600_000 && at.iter().any(Option::is_none) {
        job.tick().await;
        for (i, n) in job.restarts().iter().enumerate() {
            if *n > 0 && at[i].is_none() {
                at[i] = Some(job.now() - last);
            }
        }
    }
    at
}

/// Issue 46: every member's agent holds a learned rule from the coordinator's copy of its
/// rank's rhythm, and every rank is silent past it: the gang is restarted on that evidence —
/// once, every rank, within a minute of the last beat (not the fixed rule's five), with one
/// page and one decision that says what it stood on.
#[tokio::test]
async fn a_gang_learned_by_every_members_agent_is_restarted_within_a_minute_of_its_last_beat() {
    let (mut job, last) = learned_job(|_| true).await;
    let at = restarted_after(&mut job, last).await;
    assert_eq!(job.restarts(), vec![1, 1, 1, 1], "{at:?}");
    for t in &at {
        assert!(t.is_some_and(|t| t <= 60_000), "{at:?}");
    }
    // Never before every rank was silent past its learned silence (~22 s) and then for its wait.
    assert!(at.iter().all(|t| t.is_some_and(|t| t >= 40_000)), "{at:?}");
    assert_eq!(job.sink.count(AlertKind::Hung), 1, "{:?}", job.sink.kinds());
    assert_eq!(job.sink.count(AlertKind::Restarting), 1);
    let decided: Vec<String> =
        job.sink.of(AlertKind::Restarting).iter().map(|a| a.detail.clone()).collect();
    assert!(decided[0].contains("On the learned rhythm"), "{decided:?}");
    assert_eq!(job.fleet_budget_used().await, 1);
}

/// Issue 46: one member's agent has learned nothing (learning off on its node, an agent just
/// restarted, an older version): the other members' rules decide nothing; the whole gang is
/// restarted by the fixed rule — once, every rank, never sooner than the fixed `stale_after`.
#[tokio::test]
async fn a_gang_with_one_member_judged_by_the_fixed_rule_is_restarted_by_the_fixed_rule() {
    let (mut job, last) = learned_job(|i| i != 3).await;
    let at = restarted_after(&mut job, last).await;
    assert_eq!(job.restarts(), vec![1, 1, 1, 1], "{at:?}");
    let fixed = (120 + 180) * 1_000;
    assert!(at.iter().all(|t| t.is_some_and(|t| t >= fixed)), "{at:?}");
    let decided = job.sink.of(AlertKind::Restarting);
    assert!(!decided[0].detail.contains("learned"), "{}", decided[0].detail);
}

/// A Redis blip at the gang's decision: its SET NX gets no answer. The decision is read back:
/// not there (it never landed), the gang's units go back and the next cycle decides; there and
/// ours (it landed, its answer lost), it stands and is announced. Either way one unit of the
/// gang's breaker and one of the fleet budget for one restart of every rank, paged once.
#[tokio::test]
async fn a_decision_whose_write_got_no_answer_is_read_back() {
    for blip in [":decision", "landed::decision"] {
        let mut job = Job::new(4, 4, |_| {});
        collective_stops(&mut job).await;
        job.fleet.blip(blip);
        job.fleet.run_for(Duration::from_secs(600)).await;
        assert!(job.fleet.blips.lock().unwrap().is_empty(), "{blip}: tried");
        assert_eq!(job.restarts(), vec![1, 1, 1, 1], "{blip}: {:?}", job.sink.kinds());
        let day = utc_day(job.now());
        let gang_breaker = job.fleet.nodes[0].keys.gang_breaker(GANG, &day);
        assert_eq!(job.counter(&gang_breaker).await, 1, "{blip}: one unit");
        assert_eq!(job.fleet_budget_used().await, 1, "{blip}");
        assert_eq!(job.sink.count(AlertKind::Restarting), 1, "{blip}");
    }
}

/// A Redis blip at the gang's `restarting` page: its claim gets no answer. The decision stands
/// and is never announced again, so the page is owed and sent by a later cycle — once.
#[tokio::test]
async fn a_gang_restart_whose_page_claim_got_no_answer_is_still_paged_once() {
    let mut job = Job::new(4, 4, |_| {});
    collective_stops(&mut job).await;
    job.fleet.blip(":restart");
    job.fleet.run_for(Duration::from_secs(600)).await;
    assert!(job.fleet.blips.lock().unwrap().is_empty(), "the page was tried");
    assert_eq!(job.restarts(), vec![1, 1, 1, 1], "{:?}", job.sink.kinds());
    assert_eq!(job.sink.count(AlertKind::Restarting), 1, "{:?}", job.sink.kinds());
}

/// The members' ids in the job's view (its one shard), sorted.
async fn view_ids(job: &Job) -> Vec<String> {
    let shard = job.fleet.nodes[0].keys.gang_members(GANG, 0);
    let mut ids: Vec<String> = job.store.hgetall(&shard).await.unwrap().into_keys().collect();
    ids.sort();
    ids
}

/// Ranks 0 and 2 and rank 1's new pod (worker `rank-1b` on gpu-1) beat; rank 2 `ago` ms before
/// now.
async fn beat_replaced(job: &Job, ago: Millis) {
    job.beat(0, 0).await;
    job.beat_as(1, "rank-1b", 0).await;
    job.beat(2, ago).await;
}

/// A member departed for good — its pod replaced under a new name (a JobSet's restart): a new
/// worker id on its node — leaves an entry nobody writes again, while the live members' writes
/// keep the view's hash alive. Once that entry is twice `gone_after` old, the gang's reader
/// removes it at its next full read (compare-and-delete); the live members' entries stay. (The
/// old code only ignored it when read: a job restarted often grew its view without bound.)
#[tokio::test]
async fn a_departed_members_entry_leaves_the_view_and_the_live_ones_stay() {
    let mut job = Job::new(3, 3, |_| {});
    for _ in 0..4 {
        job.beat_all().await;
        job.tick().await;
    }
    assert_eq!(view_ids(&job).await, ["gpu-0/rank-0", "gpu-1/rank-1", "gpu-2/rank-2"]);
    let departed = job.now();
    job.fleet.nodes[1].runtime.remove("c1");
    job.fleet.nodes[1].runtime.add("c1b", "rank-1b");
    // Twice the view's gone_after (`policy_gang::Timing`: 9 minutes with these defaults).
    let bound = {
        let cfg = &job.fleet.nodes[0].cfg;
        let silent = cfg.poll_interval * 3 + cfg.runtime.restart_timeout;
        2 * (silent * 4).max(cfg.policy.stale_after * 2).as_millis() as Millis
    };
    while job.now() - departed <= bound {
        beat_replaced(&job, 0).await;
        job.tick().await;
    }
    // A healthy gang reads no view: nothing removed yet.
    let all = ["gpu-0/rank-0", "gpu-1/rank-1", "gpu-1/rank-1b", "gpu-2/rank-2"];
    assert_eq!(view_ids(&job).await, all);
    // The collective stops (rank 2 first): the gang's reader reads every member's entry.
    beat_replaced(&job, 3_000).await;
    job.run_for(Duration::from_secs(600)).await;
    assert_eq!(view_ids(&job).await, ["gpu-0/rank-0", "gpu-1/rank-1b", "gpu-2/rank-2"]);
}
