//! A job restarted the way its controller restarts it (issue 44), with the real agents and
//! pipeline on the shared fleet harness: four agents (four node names) on one coordinator, one
//! rank each, ranks that stop together. A JobSet stand-in follows JobSet's documented failure
//! policy: a failed member fails its Job (`backoffLimit: 0`, `restartPolicy: Never`), the JobSet
//! recreates every Job with `restart-attempt` + 1 while `restartsCountTowardsMax` is below
//! `maxRestarts`, and is failed after. How each member's agent restarts is the production table
//! (`vigil::vocab::workload::remediation`) on the JobSet's facts as they stand; `OnFailure` pods
//! with `backoffLimit: 0` take the same path; a LeaderWorkerSet group has one member stopped and
//! its controller recreates the group. The Kubernetes side over real HTTP is
//! `tests/kube_workloads.rs`; on real containerd, `tests/e2e_jobset.rs`. Last, the restart's
//! last steps before the command, on a plain worker whose runtime answers its last inspect late
//! or changed.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::fakes::FakeRuntime;
use common::fleet::Fleet;
use common::wiring::write_record;
use vigil::alerts::AlertKind;
use vigil::clock::utc_day;
use vigil::runtime::{Container, ContainerRuntime, RuntimeError};
use vigil::vocab::workload::{
    remediation, JobFacts, JobSetFacts, Remediation, RestartPolicy, Stops, Workload,
};

const POLL: Duration = Duration::from_secs(15);
const GANG: &str = "ml/jobset/train";

/// JobSet `ml/train` as its controller keeps it: one replicated job `workers` of four Jobs, one
/// pod each, on nodes gpu-0…gpu-3; the pods of attempt `attempt` run as containers
/// `a<attempt>-c<i>`.
struct JobSet {
    fleet: Fleet,
    /// The pods' `restartPolicy` (`Never`, or `OnFailure` with `backoffLimit: 0`).
    policy: RestartPolicy,
    max_restarts: u32,
    /// `status.restartsCountTowardsMax`.
    restarts: u32,
    attempt: u32,
    failed: bool,
}

impl JobSet {
    fn new(max_restarts: u32) -> JobSet {
        JobSet::of(RestartPolicy::Never, max_restarts)
    }

    fn of(policy: RestartPolicy, max_restarts: u32) -> JobSet {
        let fleet = Fleet::builder().nodes(4).poll(POLL).build();
        let mut js = JobSet { fleet, policy, max_restarts, restarts: 0, attempt: 0, failed: false };
        js.create_pods();
        js
    }

    fn container(&self, i: usize) -> String {
        format!("a{}-c{i}", self.attempt)
    }

    /// A member pod's facts as the agent reads them from the API.
    fn facts(&self, i: usize) -> Workload {
        Workload {
            job: Some(JobFacts {
                name: format!("train-workers-{i}"),
                backoff_limit: 0,
                parallelism: 1,
                retries: 0,
                pod_failure: Vec::new(),
                per_index: None,
            }),
            jobset: Some(JobSetFacts {
                name: "train".into(),
                replicated_job: "workers".into(),
                max_restarts: Some(self.max_restarts),
                rules: Vec::new(),
                restarts: self.restarts,
                strategy: "Recreate".into(),
            }),
            ..Workload::bare(&format!("ml/train-workers-{i}-0"), "trainer", self.policy)
        }
    }

    /// The attempt's pods, each with JobSet's labels and the production table's answer.
    fn create_pods(&mut self) {
        let attempt = self.attempt.to_string();
        for i in 0..4 {
            let (id, node) = (self.container(i), &self.fleet.nodes[i]);
            node.runtime.add(&id, &format!("rank-{i}"));
            // Its start, as a CRI runtime says it (a one-member decision is carried out only on
            // a container that ran when it was taken).
            let started = jiff::Timestamp::from_millisecond(self.fleet.now()).unwrap();
            node.runtime.set_started_at(&id, &started.to_string());
            node.runtime.set_pod_labels(
                &id,
                "ml",
                &[
                    ("jobset.sigs.k8s.io/jobset-name", "train"),
                    ("jobset.sigs.k8s.io/replicatedjob-name", "workers"),
                    ("jobset.sigs.k8s.io/restart-attempt", &attempt),
                ],
            );
            node.runtime.set_remediation(&id, rem(&self.facts(i)));
        }
    }

    /// What the controllers do after a cycle: a failed member's pod fails its Job
    /// (`backoffLimit: 0`); the JobSet then restarts (every Job deleted, its pods with it, and
    /// recreated with the next attempt) while its restarts last, else it fails.
    fn reconcile(&mut self) {
        let failed = (0..4).any(|i| {
            let c = self.container(i);
            self.fleet.nodes[i].runtime.failed().contains(&c)
        });
        if !failed || self.failed {
            return;
        }
        for i in 0..4 {
            let c = self.container(i);
            self.fleet.nodes[i].runtime.remove(&c);
        }
        if self.restarts >= self.max_restarts {
            self.failed = true;
            return;
        }
        self.restarts += 1;
        self.attempt += 1;
        self.create_pods();
    }

    /// Rank `i` beats at `step`, `ago` ms before now.
    async fn beat(&self, i: usize, step: u64, ago: i64) {
        beat(&self.fleet, i, step, ago).await;
    }

    async fn tick(&mut self) {
        for report in self.fleet.tick().await {
            assert_eq!(report.coordinator_error, None);
        }
        self.reconcile();
    }

    /// Every rank trains for a minute up to `step`, then the collective stops there: rank 2
    /// first, the others 3 s later.
    async fn train_then_hang(&mut self, step: u64) {
        for s in 0..4 {
            for i in 0..4 {
                self.beat(i, step - 3 + s, 0).await;
            }
            self.tick().await;
        }
        for i in 0..4 {
            self.beat(i, step, if i == 2 { 3_000 } else { 0 }).await;
        }
    }

    async fn run_for(&mut self, d: Duration) {
        let end = self.fleet.now() + d.as_millis() as i64;
        while self.fleet.now() < end {
            self.tick().await;
        }
    }

    /// Containers failed on each node so far, and in-place restarts.
    fn failed(&self) -> Vec<Vec<String>> {
        self.fleet.nodes.iter().map(|n| n.runtime.failed()).collect()
    }

    fn in_place_restarts(&self) -> usize {
        (0..4).map(|i| self.fleet.nodes[i].runtime.restarts(&self.container(i))).sum()
    }

    async fn gang_breaker(&self) -> u64 {
        let day = utc_day(self.fleet.now());
        let key = self.fleet.nodes[0].keys.gang_breaker(GANG, &day);
        self.fleet.counter(&key).await
    }
}

/// The first test: a four-rank JobSet of Never pods hangs → one member failed (the
/// rank that stopped first), one JobSet restart, one page, the new attempt beating and the
/// incident closed on it, one unit of the gang's breaker; the gang is the JobSet across the
/// attempt (its run of restarts is still there).
#[tokio::test]
async fn a_hung_jobset_has_one_member_failed_and_its_controller_restarts_every_member() {
    let mut js = JobSet::new(3);
    js.train_then_hang(100).await;
    js.run_for(Duration::from_secs(600)).await;

    let failed = js.failed();
    assert_eq!(
        failed,
        vec![vec![], vec![], vec!["a0-c2".to_string()], vec![]],
        "one member failed, the rank that stopped first; no stop of the others"
    );
    assert_eq!(js.restarts, 1, "one JobSet restart");
    assert_eq!(js.attempt, 1);
    assert_eq!(js.in_place_restarts(), 0, "nothing restarted in place");
    let restarting = js.fleet.sink.of(AlertKind::Restarting);
    assert_eq!(restarting.len(), 1, "{:?}", js.fleet.sink.kinds());
    assert!(
        restarting[0].detail.contains("one member, gpu-2/rank-2")
            && restarting[0].detail.contains("its controller restarts all 4 members"),
        "{}",
        restarting[0].detail
    );
    assert_eq!(js.fleet.sink.count(AlertKind::Hung), 1);
    assert_eq!(js.fleet.sink.count(AlertKind::GangBlocked), 0);
    assert_eq!(js.gang_breaker().await, 1, "one unit of the gang's breaker");
    let day = utc_day(js.fleet.now());
    for (i, n) in js.fleet.nodes.iter().enumerate() {
        let want = u64::from(i == 2);
        assert_eq!(js.fleet.counter(&n.keys.breaker(&day)).await, want, "node {i}");
    }
    let calls = js.fleet.nodes[2].runtime.fail_calls();
    assert_eq!(
        (calls[0].1, calls[0].2),
        (Duration::ZERO, true),
        "a SIGKILL of every container of its pod (a Never pod fails once all have ended)"
    );
    let decided = js.fleet.decisions(2).await;
    assert!(
        decided.iter().any(|d| d == "restarted"),
        "the failure is the trail's restart: {decided:?}"
    );

    // The new attempt trains past where the last one stopped, then hangs again: the same gang
    // (the JobSet, not the attempt) — its restart remembered, so the new hang's page is the
    // escalation of that restart, and its second restart is the gang breaker's second unit.
    for s in 0..8 {
        for i in 0..4 {
            js.beat(i, 200 + s, 0).await;
        }
        js.tick().await;
    }
    assert_eq!(js.failed().concat().len(), 1, "nobody touched while it trains");
    js.train_then_hang(210).await;
    js.run_for(Duration::from_secs(600)).await;
    assert_eq!(js.restarts, 2, "a second JobSet restart");
    assert_eq!(
        js.failed()[2],
        vec!["a0-c2".to_string(), "a1-c2".to_string()],
        "again the rank that stopped first, of the new attempt"
    );
    assert_eq!(js.fleet.sink.count(AlertKind::Hung), 1);
    assert_eq!(
        js.fleet.sink.count(AlertKind::Escalation),
        1,
        "the hang after the JobSet's restart is that restart's escalation: {:?}",
        js.fleet.sink.kinds()
    );
    assert_eq!(js.gang_breaker().await, 2);
}

/// A fruitless run carries across attempts: the new attempt stops where the last one did, and
/// the gang — the JobSet, not the attempt — is refused after `max_fruitless_restarts`.
#[tokio::test]
async fn a_fruitless_run_of_restarts_carries_across_the_jobsets_attempts() {
    let mut js = JobSet::new(10);
    js.train_then_hang(100).await;
    js.run_for(Duration::from_secs(600)).await;
    assert_eq!(js.restarts, 1);
    let run = js.fleet.get(&js.fleet.nodes[0].keys.gang_fruitless(GANG)).await;
    assert!(run.is_some(), "the run is the JobSet's");
    // The new attempt resumes from its checkpoint (step 90) and stops at step 100 again.
    for round in 0..4 {
        js.train_then_hang(100).await;
        js.run_for(Duration::from_secs(600)).await;
        if js.fleet.sink.count(AlertKind::Fruitless) > 0 {
            assert!(round >= 1, "refused after more than one fruitless restart");
            break;
        }
    }
    let fruitless = js.fleet.sink.of(AlertKind::Fruitless);
    assert_eq!(fruitless.len(), 1, "{:?}", js.fleet.sink.kinds());
    assert_eq!(fruitless[0].gang.as_deref(), Some(GANG));
    let restarts = js.restarts;
    js.run_for(Duration::from_secs(600)).await;
    assert_eq!(js.restarts, restarts, "no restart after the refusal");
}

/// A JobSet whose restarts are spent: a failure would fail the JobSet, so nothing is stopped
/// and one page says why.
#[tokio::test]
async fn a_jobset_whose_restarts_are_spent_is_left_alone_with_one_page() {
    let mut js = JobSet::new(1);
    js.restarts = 1;
    js.create_pods_again();
    js.train_then_hang(100).await;
    js.run_for(Duration::from_secs(900)).await;
    assert!(js.failed().concat().is_empty(), "{:?}", js.failed());
    assert_eq!(js.in_place_restarts(), 0);
    let blocked = js.fleet.sink.of(AlertKind::GangBlocked);
    assert_eq!(blocked.len(), 1, "{:?}", js.fleet.sink.kinds());
    assert!(
        blocked[0].detail.contains("restarts are spent (1 of maxRestarts 1)"),
        "{}",
        blocked[0].detail
    );
    assert_eq!(js.gang_breaker().await, 0, "no unit taken");
    assert!(!js.failed);
}

impl JobSet {
    /// The current attempt's pods read their facts again (the status changed under them).
    fn create_pods_again(&mut self) {
        for i in 0..4 {
            let id = self.container(i);
            let r = rem(&self.facts(i));
            assert!(matches!(r, Remediation::Refuse(_)) || self.restarts < self.max_restarts);
            self.fleet.nodes[i].runtime.set_remediation(&id, r);
        }
    }
}

fn rem(w: &Workload) -> Remediation {
    remediation(w, Stops::EveryPod)
}

/// `backoffLimit: 0` with `OnFailure` pods: a stop would fail the Job (its one container
/// restart reaches the limit), so the same single path as `Never` — one member failed, the
/// JobSet restarts every member — never N in-place stops that each fail a Job.
#[tokio::test]
async fn a_jobset_of_on_failure_pods_with_backoff_limit_0_takes_the_same_single_path() {
    let mut js = JobSet::of(RestartPolicy::OnFailure, 3);
    js.train_then_hang(100).await;
    js.run_for(Duration::from_secs(600)).await;
    assert_eq!(js.failed().concat(), ["a0-c2"], "{:?}", js.fleet.sink.kinds());
    assert_eq!(js.restarts, 1);
    assert_eq!(js.in_place_restarts(), 0);
    assert_eq!(js.fleet.sink.count(AlertKind::Restarting), 1);
}

impl JobSet {
    /// A JobSet of `Never` pods (three restarts) on agents that learn their workers' rhythm and
    /// restart on it (`[policy.learned] restarts = true`, a history of a minute), polled every
    /// 5 s. As in every JobSet here, the members' records name no gang: their pods' labels do.
    fn learning() -> JobSet {
        let poll = Duration::from_secs(5);
        let fleet = Fleet::builder()
            .nodes(4)
            .poll(poll)
            .config(move |_, c| {
                c.poll_interval = poll;
                c.policy.learned.enabled = true;
                c.policy.learned.restarts = true;
                c.policy.learned.history = Duration::from_secs(60);
            })
            .build();
        let (policy, max_restarts) = (RestartPolicy::Never, 3);
        let mut js = JobSet { fleet, policy, max_restarts, restarts: 0, attempt: 0, failed: false };
        js.create_pods();
        js
    }
}

/// Commit a6b767f: the members of a JobSet — their records name no gang, their pods' JobSet
/// labels do — beat every 5 s for six minutes, their rhythm learned by every member's agent,
/// then stop together. The gang is decided on that learned evidence, and the member's
/// last-moment revalidation judges it by the learned rule its agent holds, its gang read from its
/// pod's labels as its verdict read it: the member is failed long before the fixed rule would.
/// Read from its record (no gang), the revalidation would judge it by the fixed rule, which calls
/// that silence fresh until `stale_after` (2 min): cancelled as recovered, again each cycle.
#[tokio::test]
async fn a_jobset_decided_on_its_learned_rhythm_is_not_cancelled_at_its_members_revalidation() {
    let mut js = JobSet::learning();
    for step in 0..72 {
        for i in 0..4 {
            js.beat(i, step, 0).await;
        }
        js.tick().await;
    }
    for i in 0..4 {
        js.beat(i, 72, if i == 2 { 3_000 } else { 0 }).await;
    }
    let last = js.fleet.now();
    while js.restarts == 0 && js.fleet.now() - last < 600_000 {
        js.tick().await;
    }
    let took = js.fleet.now() - last;
    assert_eq!(js.failed().concat(), ["a0-c2"], "{:?}", js.fleet.sink.kinds());
    assert_eq!(js.restarts, 1);
    for i in 0..4 {
        let decided = js.fleet.decisions(i).await;
        assert!(!decided.iter().any(|d| d == "cancelled-recovered"), "node {i}: {decided:?}");
    }
    // NB: the learned rule's ~45 s, well short of the fixed rule's `stale_after` (120 s).
    assert!(took <= 90_000, "failed {took} ms after the last beat: not on the learned rhythm");
    let restarting = js.fleet.sink.of(AlertKind::Restarting);
    assert_eq!(restarting.len(), 1, "{:?}", js.fleet.sink.kinds());
    assert!(restarting[0].detail.contains("On the learned rhythm"), "{}", restarting[0].detail);
}

/// A LeaderWorkerSet group (its default `RecreateGroupOnPodRestart`): one member stopped as
/// any stop goes (SIGTERM, the stop grace), nothing awaited after it, and the group recreated by
/// its controller; one page, one unit of the gang's breaker.
#[tokio::test]
async fn a_leaderworkerset_group_has_one_member_stopped_and_its_controller_recreates_it() {
    use vigil::vocab::workload::LwsFacts;
    const LWS_GANG: &str = "ml/lws/serve/0";
    let mut fleet = Fleet::builder().nodes(4).poll(POLL).build();
    let generation = std::cell::Cell::new(0u32);
    let add = |fleet: &Fleet| {
        let g = generation.get();
        for (i, node) in fleet.nodes.iter().enumerate() {
            let id = format!("g{g}-c{i}");
            node.runtime.add(&id, &format!("rank-{i}"));
            let started = jiff::Timestamp::from_millisecond(fleet.now()).unwrap();
            node.runtime.set_started_at(&id, &started.to_string());
            node.runtime.set_pod_labels(
                &id,
                "ml",
                &[
                    ("leaderworkerset.sigs.k8s.io/name", "serve"),
                    ("leaderworkerset.sigs.k8s.io/group-index", "0"),
                ],
            );
            let w = Workload {
                lws: Some(LwsFacts {
                    name: "ml/serve".into(),
                    group: "0".into(),
                    recreate_group: true,
                }),
                ..Workload::bare(&format!("ml/serve-0-{i}"), "trainer", RestartPolicy::Always)
            };
            node.runtime.set_remediation(&id, rem(&w));
        }
    };
    add(&fleet);
    for s in 0..4 {
        for i in 0..4 {
            beat(&fleet, i, 97 + s, 0).await;
        }
        fleet.tick().await;
    }
    for i in 0..4 {
        beat(&fleet, i, 100, if i == 1 { 3_000 } else { 0 }).await;
    }
    let mut recreated = false;
    let end = fleet.now() + 600_000;
    while fleet.now() < end {
        fleet.tick().await;
        let g = generation.get();
        let stopped = fleet.nodes.iter().any(|n| !n.runtime.failed().is_empty());
        if stopped && !recreated {
            // The group's pods deleted and created again by the LeaderWorkerSet controller.
            for (i, n) in fleet.nodes.iter().enumerate() {
                n.runtime.remove(&format!("g{g}-c{i}"));
            }
            generation.set(g + 1);
            add(&fleet);
            recreated = true;
        }
    }
    let calls: Vec<_> = fleet.nodes.iter().map(|n| n.runtime.fail_calls()).collect();
    let stopped: Vec<&(String, Duration, bool)> = calls.iter().flatten().collect();
    assert_eq!(stopped.len(), 1, "one member stopped: {calls:?}");
    let (id, grace, whole) = stopped[0];
    assert_eq!(id, "g0-c1", "the member that stopped first");
    let stop_grace = fleet.nodes[1].cfg.runtime.stop_grace;
    assert_eq!((*grace, *whole), (stop_grace, false), "a stop as any, of the worker only");
    let restarting = fleet.sink.of(AlertKind::Restarting);
    assert_eq!(restarting.len(), 1, "{:?}", fleet.sink.kinds());
    assert_eq!(restarting[0].gang.as_deref(), Some(LWS_GANG));
    let day = utc_day(fleet.now());
    let key = fleet.nodes[0].keys.gang_breaker(LWS_GANG, &day);
    assert_eq!(fleet.counter(&key).await, 1);
    assert!(fleet.nodes.iter().all(|n| n.runtime.restarts(&format!("g0-c{}", 0)) == 0));
}

/// Rank `i` of `fleet` (worker `rank-<i>`) beats `processing` at `step`, `ago` ms before now.
async fn beat(fleet: &Fleet, i: usize, step: u64, ago: i64) {
    let key = fleet.nodes[i].keys.status(&format!("rank-{i}"));
    let progress = format!("step-{step}");
    let at = fleet.now() - ago;
    let fields = [("progress", progress.as_str())];
    write_record(fleet.store.as_ref(), &key, "processing", at, &fields).await;
}

/// The fake runtime, with a hook run at each `inspect`, told which it is (from 1): a worker's
/// restart pass inspects its container at the revalidation and once more right before the
/// command (`Recheck`), so a pass's second is that last one. Everything else is the fake's.
#[derive(Clone, Default)]
struct Inspected {
    inner: FakeRuntime,
    count: Arc<AtomicUsize>,
    hook: Arc<Mutex<Option<InspectHook>>>,
}

type InspectHook = Box<dyn Fn(usize) + Send + Sync>;

impl Inspected {
    fn on_inspect(&self, hook: impl Fn(usize) + Send + Sync + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }

    fn inspects(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl ContainerRuntime for Inspected {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn list_workers(&self) -> Result<Vec<Container>, RuntimeError> {
        self.inner.list_workers().await
    }
    async fn inspect(&self, id: &str) -> Result<Option<Container>, RuntimeError> {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        self.hook.lock().unwrap().iter().for_each(|h| h(n));
        self.inner.inspect(id).await
    }
    async fn logs(&self, id: &str, lines: usize) -> Result<String, RuntimeError> {
        self.inner.logs(id, lines).await
    }
    async fn remediation(&self, c: &Container, stops: Stops) -> Remediation {
        self.inner.remediation(c, stops).await
    }
    async fn restart(&self, c: &Container, grace: Duration) -> Result<(), RuntimeError> {
        self.inner.restart(c, grace).await
    }
    async fn fail(&self, c: &Container, grace: Duration, pod: bool) -> Result<(), RuntimeError> {
        self.inner.fail(c, grace, pod).await
    }
    async fn successor(&self, c: &Container) -> Result<Option<Container>, RuntimeError> {
        self.inner.successor(c).await
    }
    async fn kill(&self, id: &str, signal: &str) -> Result<(), RuntimeError> {
        self.inner.kill(id, signal).await
    }
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.inner.ping().await
    }
}

/// One node whose agent runs on `rt` (worker `trainer-0` in container `c1`), configured by
/// `tweak`.
fn inspected_node(rt: &Inspected, tweak: impl Fn(&mut vigil::config::Config) + 'static) -> Fleet {
    rt.inner.add("c1", "trainer-0");
    let builder = Fleet::builder().node("gpu-1").runtime(Arc::new(rt.clone()));
    builder.config(move |_, c| tweak(c)).build()
}

/// Property 8 (docs/safety.md): the lock is checked after the last slow step, right before the
/// command, and renewed there (it must cover the whole restart). The runtime's inspect right
/// before it may take `runtime.call_timeout` (or the agent stalls in it); here the clock runs on
/// inside that inspect until the lock has expired: the command does not run
/// (`skipped-lock-expiring`), the breaker's unit and the claim go back, and the next pass, on a
/// lock of its own, restarts the worker.
#[tokio::test]
async fn a_lock_run_short_in_the_last_inspect_before_the_command_refuses_the_command() {
    let rt = Inspected::default();
    let mut fleet = inspected_node(&rt, |_| {});
    let (clock, cfg) = (fleet.clock.clone(), fleet.nodes[0].cfg.clone());
    let stalled = cfg.safety.lock_ttl + Duration::from_secs(1);
    rt.on_inspect(move |n| {
        if n == 2 {
            clock.advance(stalled);
        }
    });
    fleet.write(0, "trainer-0", "processing", fleet.now(), &[]).await;
    let end = fleet.now() + 600_000;
    while rt.inspects() < 2 && fleet.now() < end {
        fleet.tick().await;
    }
    assert_eq!(rt.inner.restarts("c1"), 0, "no command on a lock that cannot cover it");
    let decided = fleet.decisions(0).await;
    assert!(decided.iter().any(|d| d == "skipped-lock-expiring"), "{decided:?}");
    let k = &fleet.nodes[0].keys;
    assert_eq!(fleet.counter(&k.breaker(&utc_day(fleet.now()))).await, 0, "the unit given back");
    assert_eq!(fleet.get(&k.cooldown("trainer-0")).await, None, "the claim given back");
    fleet.tick().await;
    assert_eq!(rt.inner.restarts("c1"), 1, "{:?}", fleet.decisions(0).await);
}

/// A claim given back puts back what it removed: an errored worker whose restart is refused after
/// its claim for a passing reason (its container paused between the revalidation and the last
/// look before the command: `skipped-not-running`) keeps its error timer, and the next pass
/// restarts it — not another `error_for` later.
#[tokio::test]
async fn an_errored_worker_refused_after_its_claim_keeps_its_error_timer() {
    let rt = Inspected::default();
    let mut fleet = inspected_node(&rt, |c| c.policy.error_for = Duration::from_secs(60));
    let paused = rt.inner.clone();
    rt.on_inspect(move |n| {
        if n == 2 {
            paused.set_paused("c1", true);
        }
    });
    let key = fleet.nodes[0].keys.error_since("trainer-0");
    let (mut before, end) = (None, fleet.now() + 600_000);
    while rt.inspects() < 2 && fleet.now() < end {
        fleet.write(0, "trainer-0", "error", fleet.now(), &[]).await;
        before = fleet.get(&key).await;
        fleet.tick().await;
    }
    assert_eq!(rt.inner.restarts("c1"), 0);
    let decided = fleet.decisions(0).await;
    assert!(decided.iter().any(|d| d == "skipped-not-running"), "{decided:?}");
    assert!(before.is_some(), "in error for error_for: {decided:?}");
    assert_eq!(fleet.get(&key).await, before, "the error timer given back with the claim");
    rt.inner.set_paused("c1", false);
    fleet.write(0, "trainer-0", "error", fleet.now(), &[]).await;
    fleet.tick().await;
    assert_eq!(rt.inner.restarts("c1"), 1, "{:?}", fleet.decisions(0).await);
}
