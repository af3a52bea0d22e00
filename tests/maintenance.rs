//! The maintenance controller through its real code path, with the in-process coordinator, a
//! fake runtime and a recording Node API: maintenance states in, Node fields, Events,
//! checkpoint requests and outcomes out. (The metadata watcher and the Node adapter are tested
//! over HTTP against their fakes in tests/metadata.rs and tests/kube.rs, and everything
//! together through the binary in tests/e2e.rs.)

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::fakes::{FakeRuntime, RecordingNodeApi, RecordingSink};
use common::fleet::{Fleet, Node};
use common::real::{free_port, serve};
use common::wiring::{agent_and_controller, memory_coordinator, node_config, write_record};
use vigil::alerts::Notifier;
use vigil::config::Config;
use vigil::coord::{Coordinator, Keys};
use vigil::cycle::agent::Agent;
use vigil::hang::policy::Verdict;
use vigil::maintenance::policy::PERFORM_MAINTENANCE_LABEL;
use vigil::maintenance::request::Outcome;
use vigil::metrics::Metrics;
use vigil::node::controller::{Controller, SharedFacts};
use vigil::vocab::maintenance::{Interruption, MaintenanceState, Phase};

struct Rig {
    coord: Arc<dyn Coordinator>,
    runtime: FakeRuntime,
    node: RecordingNodeApi,
    metrics: Arc<Metrics>,
    facts: SharedFacts,
    controller: Controller,
    keys: Keys,
    cfg: Config,
}

/// One node (`gpu-1`, worker `trainer-0` in `c1`) of the shared fleet harness, on the system
/// clock, with its maintenance controller; the pieces the tests read, taken out of it.
fn rig(tweak: impl Fn(&mut Config) + 'static) -> Rig {
    let mut fleet = Fleet::builder()
        .node("gpu-1")
        .system_clock()
        .controllers()
        .without_alerts()
        .config(move |_, c| tweak(c))
        .build();
    let node = fleet.nodes.remove(0);
    node.runtime.add("c1", "trainer-0");
    Rig {
        keys: node.keys,
        coord: fleet.store,
        runtime: node.runtime,
        node: node.node_api,
        metrics: node.metrics,
        facts: node.facts,
        controller: node.controller.expect("built with its controller"),
        cfg: node.cfg,
    }
}

impl Rig {
    /// Apply a maintenance state (see [`state`]) to the controller.
    async fn apply(
        &mut self,
        phase: Phase,
        reasons: Vec<&'static str>,
        interruption: Option<Interruption>,
    ) {
        self.controller.apply(state(phase, reasons, interruption)).await;
    }
}

fn state(
    phase: Phase,
    reasons: Vec<&'static str>,
    interruption: Option<Interruption>,
) -> MaintenanceState {
    MaintenanceState { phase, reasons, interruption, ..MaintenanceState::default() }
}

/// The termination notice of a host maintenance event.
fn host_termination() -> MaintenanceState {
    state(
        Phase::Terminating,
        vec!["terminate-on-host-maintenance"],
        Some(Interruption::HostMaintenance),
    )
}

/// A worker that acknowledges every checkpoint request it sees in its record, as the README's
/// Python example does.
fn acking_worker(coord: Arc<dyn Coordinator>, key: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for _ in 0..200 {
            let rec = coord.hgetall(&key).await.unwrap();
            if let Some(id) = rec.get("checkpoint_request") {
                if rec.get("checkpoint_ack").is_none_or(|a| a.is_empty()) {
                    coord.hset(&key, &[("checkpoint_ack".into(), id.clone())], None).await.unwrap();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

#[tokio::test]
async fn termination_notice_taints_the_node_and_checkpoints_acking_workers() {
    let mut r = rig(|_| {});
    let worker = acking_worker(r.coord.clone(), r.keys.status("trainer-0"));
    r.controller.apply(host_termination()).await;
    worker.abort();
    let d = r.node.last();
    assert_eq!(d.add_taints.len(), 1, "{d:?}");
    assert_eq!(d.labels["vigil.dev/maintenance"].as_deref(), Some("terminating"));
    let last = d.annotations["vigil.dev/last-checkpoint"].clone().unwrap();
    assert!(last.contains("acked=1 timed-out=0 failed=0"), "{last}");
    assert!(r.node.reasons().contains(&"VigilTerminationImminent".to_string()));
    assert!(r.node.reasons().contains(&"VigilCheckpoint".to_string()));
    let text = r.metrics.encode();
    assert!(
        common::has_sample(&text, "vigil_checkpoints_total{method=\"record\",outcome=\"acked\"} 1"),
        "{text}"
    );
    assert!(common::has_sample(&text, "vigil_interruptions_total{type=\"host-maintenance\",reason=\"terminate-on-host-maintenance\"} 1"), "{text}");
    assert!(common::has_sample(&text, "vigil_maintenance_phase{phase=\"terminating\"} 1"));
    let trail = r.coord.read_recent(&r.keys.trail(), 50).await.unwrap();
    assert!(trail.iter().any(|(_, f)| f["decision"] == "checkpoint-acked"));
}

#[tokio::test]
async fn preemption_with_a_silent_worker_times_out_within_the_budget() {
    let mut r = rig(|c| c.checkpoint.preemption_budget = Duration::from_secs(1));
    r.runtime.set_checkpoint_label("c1", "signal:SIGUSR1");
    let started = tokio::time::Instant::now();
    r.apply(Phase::Terminating, vec!["preempted"], Some(Interruption::Preemption)).await;
    assert!(started.elapsed() < Duration::from_secs(3), "bounded by the budget");
    assert_eq!(r.runtime.signals(), vec![("c1".to_string(), "SIGUSR1".to_string())]);
    let last = r.node.last().annotations["vigil.dev/last-checkpoint"].clone().unwrap();
    assert!(last.contains("preemption: acked=0 timed-out=1"), "{last}");
    let rec = r.coord.hgetall(&r.keys.status("trainer-0")).await.unwrap();
    assert_eq!(rec["checkpoint_reason"], "preemption");
}

/// A signalled worker that acknowledges with `ack(request id)`: the id read from its record.
fn on_signal_ack(r: &mut Rig, ack: fn(&str) -> String) {
    let coord = r.coord.clone();
    let key = r.keys.status("trainer-0");
    r.runtime.on_signal(move |_| {
        let coord = coord.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let rec = coord.hgetall(&key).await.unwrap();
            let value = ack(&rec["checkpoint_request"]);
            coord.hset(&key, &[("checkpoint_ack".into(), value)], None).await.unwrap();
        });
    });
}

#[tokio::test]
async fn a_signal_the_worker_acknowledges_is_acked() {
    let mut r = rig(|_| {});
    r.runtime.set_checkpoint_label("c1", "signal:SIGUSR2");
    on_signal_ack(&mut r, |id| id.to_string());
    let results = r.controller.checkpoint("agent-sigterm", Duration::from_secs(2)).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].outcome, Outcome::Acked);
    assert_eq!(results[0].method, "signal");
}

/// Issue 26, finding 4: only the request's own id acknowledges it. A constant (`ok`) or the id
/// of an earlier round (an ack in flight when this round was written) leaves the round waiting
/// until its budget, and it ends timed out, never acked.
#[tokio::test]
async fn an_ack_of_another_id_is_no_acknowledgement() {
    for ack in
        [(|_: &str| "ok".to_string()) as fn(&str) -> String, |id: &str| format!("{id}-earlier")]
    {
        let mut r = rig(|_| {});
        r.runtime.set_checkpoint_label("c1", "signal:SIGUSR2");
        on_signal_ack(&mut r, ack);
        let results = r.controller.checkpoint("agent-sigterm", Duration::from_millis(600)).await;
        assert_eq!(results[0].outcome, Outcome::TimedOut, "{results:?}");
    }
}

/// Issue 26: a label value that is no worker id is never made into a Redis key: that container
/// is reported failed, not asked, and nothing is written under its value.
#[tokio::test]
async fn a_label_that_is_no_worker_id_is_never_asked() {
    let mut r = rig(|_| {});
    r.runtime.add("c2", "x}:status:trainer-0");
    let worker = acking_worker(r.coord.clone(), r.keys.status("trainer-0"));
    let results = r.controller.checkpoint("test", Duration::from_secs(2)).await;
    worker.abort();
    let bad = results.iter().find(|w| w.worker.starts_with("x}")).expect("reported");
    assert_eq!(bad.outcome, Outcome::Failed);
    assert!(bad.detail.contains("not a worker id"), "{}", bad.detail);
    let written = r.coord.hgetall(&r.keys.status("x}:status:trainer-0")).await.unwrap();
    assert!(written.is_empty(), "{written:?}");
    assert!(results.iter().any(|w| w.worker == "trainer-0" && w.outcome == Outcome::Acked));
}

#[tokio::test]
async fn a_bad_checkpoint_label_fails_that_worker_only() {
    let mut r = rig(|_| {});
    r.runtime.add("c2", "trainer-1");
    r.runtime.set_checkpoint_label("c2", "carrier-pigeon");
    let worker = acking_worker(r.coord.clone(), r.keys.status("trainer-0"));
    let results = r.controller.checkpoint("test", Duration::from_secs(2)).await;
    worker.abort();
    let by: std::collections::HashMap<_, _> =
        results.iter().map(|w| (w.worker.as_str(), w.outcome)).collect();
    assert_eq!(by["trainer-0"], Outcome::Acked);
    assert_eq!(by["trainer-1"], Outcome::Failed);
}

#[tokio::test]
async fn pending_to_ongoing_to_clear_checkpoints_once_and_clears_everything() {
    let mut r = rig(|c| c.checkpoint.maintenance_budget = Duration::from_millis(300));
    r.controller
        .apply(MaintenanceState {
            phase: Phase::Pending,
            reasons: vec!["upcoming-pending"],
            window_start: Some("2026-11-30T10:00:00Z".into()),
            window_end: Some("2026-11-30T11:00:00Z".into()),
            can_reschedule: true,
            interruption: None,
            ..MaintenanceState::default()
        })
        .await;
    let d = r.node.last();
    assert_eq!(d.labels["vigil.dev/maintenance"].as_deref(), Some("pending"));
    assert_eq!(d.labels["vigil.dev/can-reschedule"].as_deref(), Some("true"));
    assert_eq!(
        d.annotations["vigil.dev/maintenance-window-start"].as_deref(),
        Some("2026-11-30T10:00:00Z")
    );
    let text = r.metrics.encode();
    assert!(text.contains("vigil_maintenance_window_start_timestamp_seconds 1796032800"), "{text}");
    assert!(r.node.reasons().ends_with(&["VigilMaintenancePending".to_string()]));
    r.apply(Phase::Ongoing, vec!["upcoming-ongoing"], Some(Interruption::HostMaintenance)).await;
    r.controller.apply(host_termination()).await;
    let checkpoints = r.node.reasons().iter().filter(|x| *x == "VigilCheckpoint").count();
    assert_eq!(
        checkpoints,
        2,
        "the migration, then the termination, each checkpoint: {:?}",
        r.node.reasons()
    );
    let now = r.coord.time().await.unwrap();
    assert!(r.facts.read().unwrap().stands_down(now, &r.cfg.metadata));
    r.controller.apply(MaintenanceState::default()).await;
    let d = r.node.last();
    assert_eq!(d.labels["vigil.dev/maintenance"].as_deref(), Some("none"));
    assert!(d.add_taints.is_empty());
    assert!(d.remove_taints.contains(&"vigil.dev/termination-imminent".to_string()));
    assert_eq!(d.annotations["vigil.dev/maintenance-window-start"], None);
    assert!(r.node.reasons().ends_with(&["VigilMaintenanceCleared".to_string()]));
    // The settle period keeps restarts away a while longer.
    let now = r.coord.time().await.unwrap();
    assert!(r.facts.read().unwrap().stands_down(now, &r.cfg.metadata));
    let text = r.metrics.encode();
    assert!(
        text.contains(
            "vigil_interruptions_total{type=\"host-maintenance\",reason=\"upcoming-ongoing\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("vigil_maintenance_window_start_timestamp_seconds 0"), "{text}");
    let _ = r.cfg;
}

#[tokio::test]
async fn a_stale_worker_during_maintenance_is_not_restarted() {
    let r = rig(|c| c.poll_interval = Duration::from_millis(10));
    let metrics = Arc::new(Metrics::new());
    let mut cfg = r.cfg.clone();
    cfg.policy.stale_after = Duration::from_millis(200);
    cfg.policy.confirm_after = Duration::from_millis(20);
    cfg.policy.restart_delay = Duration::from_millis(50);
    let mut agent = Agent::new(
        cfg,
        r.coord.clone(),
        Arc::new(r.runtime.clone()),
        Notifier::new(Some(Arc::new(RecordingSink::default())), metrics.clone()),
        metrics,
    )
    .with_facts(r.facts.clone());
    r.facts.write().unwrap().maintenance = state(Phase::Ongoing, vec!["upcoming-ongoing"], None);
    write_record(
        r.coord.as_ref(),
        &r.keys.status("trainer-0"),
        "processing",
        r.coord.time().await.unwrap() - 10_000,
        &[],
    )
    .await;
    for _ in 0..20 {
        let report = agent.cycle().await;
        assert_eq!(report.verdicts[0].1, Verdict::InMaintenance);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(r.runtime.restarts("c1"), 0);
    // Maintenance over (and no settle): the same stale worker is now a hang.
    {
        let mut f = r.facts.write().unwrap();
        f.maintenance = MaintenanceState::default();
        f.interruption_ended = None;
    }
    let mut restarted = false;
    for _ in 0..50 {
        agent.cycle().await;
        if r.runtime.restarts("c1") == 1 {
            restarted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(restarted);
}

/// A node whose agent has just started (`facts_at_start(wait)`, `metadata.first_read_wait =
/// wait`), on timings compressed to milliseconds, and whose worker `trainer-0` (in `c1`) last
/// beat 10 s ago: a restart is due at the first cycle. The controller is returned unstarted,
/// for the test to run on the sources it feeds.
struct JustStarted {
    agent: Agent,
    controller: Controller,
    facts: SharedFacts,
    runtime: FakeRuntime,
    coord: Arc<dyn Coordinator>,
    keys: Keys,
}

async fn just_started(wait: Duration, tweak: impl Fn(&mut Config)) -> JustStarted {
    let metrics = Arc::new(Metrics::new());
    let mut cfg = node_config("gpu-1");
    cfg.poll_interval = Duration::from_millis(10);
    cfg.policy.stale_after = Duration::from_millis(200);
    cfg.policy.confirm_after = Duration::from_millis(20);
    cfg.policy.restart_delay = Duration::from_millis(50);
    cfg.metadata.first_read_wait = wait;
    tweak(&mut cfg);
    let coord = memory_coordinator();
    let runtime = FakeRuntime::default();
    runtime.add("c1", "trainer-0");
    let facts = vigil::node::controller::facts_at_start(wait);
    let (agent, controller) = agent_and_controller(
        &cfg,
        &coord,
        &runtime,
        Arc::new(RecordingNodeApi::default()),
        Notifier::new(None, metrics.clone()),
        &metrics,
        facts.clone(),
    );
    let keys = Keys::new("vigil", "gpu-1");
    let long_ago = coord.time().await.unwrap() - 10_000;
    let status = keys.status("trainer-0");
    write_record(coord.as_ref(), &status, "processing", long_ago, &[]).await;
    JustStarted { agent: agent.with_facts(facts.clone()), controller, facts, runtime, coord, keys }
}

/// An agent that has just started has not read its node yet: a restart due at its first cycle
/// (an incident an earlier incarnation opened) waits for the metadata server's first answer —
/// and with an ongoing maintenance in that answer, never runs. The controller runs its real loop
/// on a metadata channel the test feeds; the worker is stale from the start.
#[tokio::test]
async fn a_restart_due_at_start_up_waits_for_the_first_metadata_answer() {
    use vigil::accel::gpu::model::GpuReport;
    use vigil::vocab::maintenance::{MaintenanceEvent, RawMetadata};
    let JustStarted { mut agent, controller, facts, runtime, coord, keys } =
        just_started(Duration::from_secs(600), |c| c.metadata.settle = Duration::ZERO).await;
    let (meta_tx, meta_rx) = tokio::sync::watch::channel(RawMetadata::default());
    let (_gpu_tx, gpu_rx) = tokio::sync::watch::channel(GpuReport::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(controller.run(meta_rx, gpu_rx, Default::default(), stop));
    let mut verdicts = Vec::new();
    for _ in 0..40 {
        verdicts.push(agent.cycle().await.verdicts[0].1);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(runtime.restarts("c1"), 0, "restarted before the first read");
    assert!(verdicts.contains(&Verdict::Hung), "detection runs: {verdicts:?}");
    let waiting = facts.read().unwrap().unread.map(|u| u.what);
    assert_eq!(waiting, Some("the metadata server's maintenance state"));
    let trail = common::wiring::trail_decisions(coord.as_ref(), &keys).await;
    assert!(trail.iter().any(|d| d == "cancelled-node-state"), "{trail:?}");
    // One key answered (`preempted`), the others not yet (a 503 in host maintenance): not read.
    meta_tx.send_modify(|raw| raw.preempted = Some(false));
    for _ in 0..10 {
        agent.cycle().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(facts.read().unwrap().unread.is_some(), "one key is no read");
    assert_eq!(runtime.restarts("c1"), 0, "restarted before every key was read");
    // Every key read: an ongoing maintenance. Read now, and still no restart.
    meta_tx.send_modify(|raw| {
        raw.maintenance_event = Some(MaintenanceEvent::MigrateOnHostMaintenance);
        raw.settled = true;
    });
    for _ in 0..20 {
        agent.cycle().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(facts.read().unwrap().unread, None);
    assert_eq!(runtime.restarts("c1"), 0, "restarted during the maintenance");
    // The maintenance ends (the settle is off): the due restart runs.
    meta_tx.send_modify(|raw| raw.maintenance_event = Some(MaintenanceEvent::None));
    let mut restarted = false;
    for _ in 0..50 {
        agent.cycle().await;
        if runtime.restarts("c1") == 1 {
            restarted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(restarted, "the restart runs once the node is read and clear");
}

/// The Node is awaited too (its cordon, taints and GKE's maintenance labels), and never longer
/// than `metadata.first_read_wait`: with no metadata watcher (off) and a Node source that never
/// gives a Node, the due restart waits, naming the Node, then runs once the bound has passed.
#[tokio::test]
async fn a_restart_waits_for_the_nodes_first_read_and_never_past_the_bound() {
    use vigil::accel::gpu::model::GpuReport;
    use vigil::vocab::maintenance::RawMetadata;
    let wait = Duration::from_millis(1500);
    let started = tokio::time::Instant::now();
    let JustStarted { mut agent, controller, facts, runtime, .. } =
        just_started(wait, |_| {}).await;
    // A Node source that has not read the Node (the API server slow to answer).
    let (_node_tx, node_rx) = vigil::node::info::channel();
    let controller = controller.with_node_info(node_rx, None);
    // No metadata watcher (off GCE): its channel closed.
    let (_, meta_rx) = tokio::sync::watch::channel(RawMetadata::default());
    let (_gpu_tx, gpu_rx) = tokio::sync::watch::channel(GpuReport::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(controller.run(meta_rx, gpu_rx, Default::default(), stop));
    let mut restarted_after = None;
    let mut named_the_node = false;
    while started.elapsed() < Duration::from_secs(10) {
        agent.cycle().await;
        if let Some(u) = facts.read().unwrap().unread {
            named_the_node |= u.what.starts_with("the Node");
        }
        if runtime.restarts("c1") > 0 {
            restarted_after = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(named_the_node, "the Node is what restarts wait for");
    let after = restarted_after.expect("the restart runs once the bound has passed");
    assert!(after >= wait, "restarted {after:?} after the start, before the bound");
}

#[tokio::test]
async fn opportunistic_maintenance_lets_only_one_idle_node_of_a_pool_go() {
    use vigil::fleet::view::{publish, NodeRecord};
    let coord = memory_coordinator();
    let runtime = FakeRuntime::default();
    runtime.add("c1", "trainer-0");
    let mut controllers = Vec::new();
    let mut apis = Vec::new();
    let now = coord.time().await.unwrap();
    for node in ["n1", "n2", "n3"] {
        let mut cfg = node_config(node);
        cfg.fleet.pool = "pool-a".into();
        cfg.opportunistic.enabled = true;
        cfg.opportunistic.idle_for = Duration::from_millis(50);
        cfg.opportunistic.min_nodes = 1;
        // No GPUs on these nodes: NVML is not a witness (with it on and unloaded, unknown is busy).
        cfg.gpu.enabled = vigil::config::Switch::Off;
        let keys = Keys::new("vigil", node);
        // Every node reports healthy with the pool's maintenance pending on it (GCE announces a
        // pool's maintenance to several nodes at once), its window days away, and its only
        // worker is idle.
        let rec = NodeRecord {
            node: node.into(),
            pool: "pool-a".into(),
            slice: String::new(),
            maintenance: "pending".into(),
            maintenance_window: Some(now + 3 * 86_400_000),
            gpu: "unknown".into(),
            workers: Default::default(),
            places: Default::default(),
            gangs: Default::default(),
            version: "t".into(),
            dry_run: false,
            updated_at: now,
            ..NodeRecord::default()
        };
        publish(coord.as_ref(), &keys, &rec, Duration::from_secs(60)).await.unwrap();
        coord
            .hset(&keys.status("trainer-0"), &[("state".into(), "idle".into())], None)
            .await
            .unwrap();
        let api = RecordingNodeApi::default();
        let metrics = Arc::new(Metrics::new());
        let (_agent, mut c) = agent_and_controller(
            &cfg,
            &coord,
            &runtime,
            Arc::new(api.clone()),
            Notifier::new(None, metrics.clone()),
            &metrics,
            SharedFacts::default(),
        );
        c.apply(MaintenanceState {
            phase: Phase::Pending,
            can_reschedule: true,
            reasons: vec!["upcoming-pending"],
            ..MaintenanceState::default()
        })
        .await;
        controllers.push(c);
        apis.push(api);
    }
    // NB: a pending notice whose window is days away leaves a node serving: each node counts the
    // two others toward min_nodes (counted out, no node of the pool ever claimed).
    for _ in 0..5 {
        for c in controllers.iter_mut() {
            c.opportunistic().await;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let labelled: Vec<_> =
        apis.iter().filter(|a| perform_label(a) == Some(Some("true".into()))).collect();
    assert_eq!(labelled.len(), 1, "exactly one node of the pool claims");
}

/// The perform-maintenance label in the Node's last write: `None` not written (left alone),
/// `Some(None)` taken off.
fn perform_label(api: &RecordingNodeApi) -> Option<Option<String>> {
    api.last().labels.get(PERFORM_MAINTENANCE_LABEL).cloned()
}

/// The nodes whose Node shows the perform-maintenance label.
fn labelled(nodes: &[Node]) -> Vec<String> {
    let on = |n: &&Node| perform_label(&n.node_api) == Some(Some("true".into()));
    nodes.iter().filter(on).map(|n| n.cfg.node_name.clone()).collect()
}

/// A rescheduleable maintenance, pending.
fn pending() -> MaintenanceState {
    MaintenanceState {
        phase: Phase::Pending,
        can_reschedule: true,
        reasons: vec!["upcoming-pending"],
        ..MaintenanceState::default()
    }
}

/// `nodes` nodes (`gpu-0` …) of pool `pool-a` with opportunistic maintenance on (idle for a
/// minute, no other node needed), on the fake clock, each with its controller and its worker
/// `trainer-0` (in `c1`), whose record says `worker_state`; then `tweak`.
async fn opportunistic_fleet(
    nodes: usize,
    worker_state: &str,
    tweak: impl Fn(&mut Config) + 'static,
) -> Fleet {
    let fleet = Fleet::builder()
        .nodes(nodes)
        .controllers()
        .without_alerts()
        .config(move |_, c| {
            c.fleet.pool = "pool-a".into();
            c.opportunistic.enabled = true;
            c.opportunistic.idle_for = Duration::from_secs(60);
            c.opportunistic.min_nodes = 0;
            // No GPUs, no Kubernetes: the workers' records are the idle check's only witness.
            c.gpu.enabled = vigil::config::Switch::Off;
            c.kubernetes.enabled = vigil::config::Switch::Off;
            // Validation wants the shared Redis for the claim; the fleet uses the in-process store.
            c.redis.url = "redis://127.0.0.1:1".into();
            tweak(c);
        })
        .build();
    for n in &fleet.nodes {
        n.runtime.add("c1", "trainer-0");
        let state = [("state".to_string(), worker_state.to_string())];
        fleet.store.hset(&n.keys.status("trainer-0"), &state, None).await.unwrap();
    }
    fleet
}

/// The details of the node's `perform-maintenance` trail entries, oldest first.
async fn claim_trail(fleet: &Fleet, node: usize) -> Vec<String> {
    let trail = fleet.store.read_recent(&fleet.nodes[node].keys.trail(), 100).await.unwrap();
    let claims = trail.iter().rev().filter(|(_, f)| f["decision"] == "perform-maintenance");
    claims.map(|(_, f)| f["detail"].clone()).collect()
}

/// The claim's holder renews it every poll, so it never lapses while its label is on. Before, it
/// lapsed after `claim_ttl` and its holder took the label off only at its next poll: a second
/// node of the pool polling in between claimed and was labelled beside it (here at the third
/// round: 2 h 30 min after the 2 h claim was taken). A holder whose maintenance never starts
/// gives the claim back itself after `claim_ttl`, label off, and the next node takes its turn;
/// one whose maintenance is under way holds it to the end.
#[tokio::test]
async fn the_holder_renews_its_claim_so_no_second_node_of_the_pool_claims_beside_it() {
    let mut fleet = opportunistic_fleet(2, "idle", |_| {}).await;
    for n in fleet.nodes.iter_mut() {
        n.controller().apply(pending()).await;
        // The first look: idle from now on.
        n.controller().opportunistic().await;
    }
    fleet.clock.advance(Duration::from_secs(60));
    for n in fleet.nodes.iter_mut() {
        n.controller().opportunistic().await;
    }
    assert_eq!(labelled(&fleet.nodes), ["gpu-0"], "idle for idle_for: the first to look claims");
    let claim = fleet.nodes[0].keys.maintenance_claim("pool-a");
    let mut seen = Vec::new();
    for round in 1..=4 {
        // Polls 50 minutes apart (the claim's TTL is 2 h), the other node first.
        fleet.clock.advance(Duration::from_secs(50 * 60));
        for i in [1, 0] {
            fleet.nodes[i].controller().opportunistic().await;
            let now = labelled(&fleet.nodes);
            assert!(now.len() <= 1, "round {round}, after gpu-{i}'s poll: {now:?}");
            seen.push(now.join(","));
        }
    }
    // Held and renewed past its first TTL; given back at the third round (2 h 30 min: GKE never
    // started it), then gpu-1's turn.
    assert_eq!(seen, ["gpu-0", "gpu-0", "gpu-0", "gpu-0", "gpu-0", "", "gpu-1", "gpu-1"]);
    let trail = claim_trail(&fleet, 0).await;
    assert!(trail.last().unwrap().contains("did not start within"), "{trail:?}");
    // gpu-1's maintenance gets under way: it holds the claim however long it lasts.
    let ongoing = MaintenanceState { phase: Phase::Ongoing, ..pending() };
    fleet.nodes[1].controller().apply(ongoing).await;
    for round in 1..=4 {
        fleet.clock.advance(Duration::from_secs(50 * 60));
        fleet.nodes[1].controller().opportunistic().await;
        let held = fleet.store.get(&claim).await.unwrap().unwrap_or_default();
        assert!(held.starts_with("gpu-1:"), "round {round}: the claim is {held:?}");
    }
}

/// An agent restarted while its node held the pool's claim (its label still on the Node) adopts
/// the claim, whose value names the node: it holds it, renewed, and takes the label off when the
/// maintenance is over. Before, the new agent never looked: the claim lapsed and nobody ever
/// took the label off.
#[tokio::test]
async fn a_restarted_agent_adopts_its_nodes_claim_and_takes_the_label_off_when_done() {
    // Busy: this node would not claim now; what it holds, it adopted.
    let mut fleet = opportunistic_fleet(1, "processing", |_| {}).await;
    let claim = fleet.nodes[0].keys.maintenance_claim("pool-a");
    // The claim its agent took before it restarted, ten minutes of it left.
    let taken = fleet.store.set_nx(&claim, "gpu-0:0badcafe", Duration::from_secs(600)).await;
    assert!(taken.unwrap());
    fleet.nodes[0].controller().apply(pending()).await;
    fleet.nodes[0].controller().opportunistic().await;
    let label = perform_label(&fleet.nodes[0].node_api);
    assert_eq!(label, Some(Some("true".into())), "adopted: the label is this agent's again");
    // Held and renewed: still this node's past the ten minutes it had left.
    fleet.clock.advance(Duration::from_secs(15 * 60));
    fleet.nodes[0].controller().opportunistic().await;
    let held = fleet.store.get(&claim).await.unwrap();
    assert_eq!(held.as_deref(), Some("gpu-0:0badcafe"), "renewed, under its own token");
    // The maintenance is over: the claim is released and the label taken off.
    fleet.nodes[0].controller().apply(MaintenanceState::default()).await;
    assert_eq!(fleet.store.get(&claim).await.unwrap(), None, "released");
    let trail = claim_trail(&fleet, 0).await;
    assert_eq!(trail.len(), 2, "{trail:?}");
    assert!(trail[0].starts_with("adopted pool pool-a's claim"), "{trail:?}");
    assert_eq!(trail[1], "maintenance done; pool claim released", "the label goes with it");
}

/// The other agent of an HA pair holds its node's claim, renewing it: this one leaves it alone
/// (two agents renewing one claim fought over its label), and adopts it only once it has not
/// been renewed for two polls (its holder gone).
#[tokio::test]
async fn a_live_sibling_s_claim_is_not_adopted_until_it_stops_renewing_it() {
    let mut fleet = opportunistic_fleet(1, "processing", |_| {}).await;
    let (claim, cfg) =
        (fleet.nodes[0].keys.maintenance_claim("pool-a"), fleet.nodes[0].cfg.clone());
    let ttl = Duration::from_secs(2 * 3600);
    assert!(fleet.store.set_nx(&claim, "gpu-0:5151b1b1", ttl).await.unwrap());
    fleet.nodes[0].controller().apply(pending()).await;
    fleet.nodes[0].controller().opportunistic().await;
    assert_eq!(perform_label(&fleet.nodes[0].node_api), None, "the sibling's: left alone");
    assert!(claim_trail(&fleet, 0).await.is_empty());
    // Its holder stops renewing it: two polls on, this agent adopts it.
    fleet.clock.advance(cfg.poll_interval * 3);
    fleet.nodes[0].controller().opportunistic().await;
    let label = perform_label(&fleet.nodes[0].node_api);
    assert_eq!(label, Some(Some("true".into())), "adopted once its holder is gone");
}

/// An agent that comes back after the maintenance it asked for is over (a VM stopped for its
/// host maintenance, then started again) releases the claim its node took and takes the label
/// off at once; a claim naming another node of the pool is left alone. Before, the claim lapsed
/// on its own and the label stayed on the Node for good.
#[tokio::test]
async fn a_restarted_agent_whose_maintenance_is_over_releases_its_claim_and_label() {
    // The metadata server's first answer is not waited for (`metadata.first_read_wait`).
    let mut fleet =
        opportunistic_fleet(2, "processing", |c| c.metadata.first_read_wait = Duration::ZERO).await;
    let claim = fleet.nodes[0].keys.maintenance_claim("pool-a");
    let taken = fleet.store.set_nx(&claim, "gpu-1:0badcafe", Duration::from_secs(600)).await;
    assert!(taken.unwrap());
    fleet.nodes[0].controller().opportunistic().await;
    assert_eq!(perform_label(&fleet.nodes[0].node_api), None, "not this node's claim");
    assert!(fleet.store.get(&claim).await.unwrap().is_some(), "another node's claim stays");
    fleet.nodes[1].controller().opportunistic().await;
    assert_eq!(perform_label(&fleet.nodes[1].node_api), Some(None), "the label is taken off");
    assert_eq!(fleet.store.get(&claim).await.unwrap(), None, "and the claim released");
}

#[tokio::test]
async fn a_busy_node_never_asks_for_maintenance() {
    let mut r = rig(|c| {
        c.fleet.pool = "p".into();
        c.opportunistic.enabled = true;
        c.opportunistic.idle_for = Duration::from_millis(10);
        c.opportunistic.min_nodes = 0;
        // Validation wants the shared Redis for the claim; the rig uses the in-process store.
        c.redis.url = "redis://127.0.0.1:1".into();
    });
    r.coord
        .hset(&r.keys.status("trainer-0"), &[("state".into(), "processing".into())], None)
        .await
        .unwrap();
    r.controller
        .apply(MaintenanceState {
            phase: Phase::Pending,
            can_reschedule: true,
            ..MaintenanceState::default()
        })
        .await;
    for _ in 0..3 {
        r.controller.opportunistic().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        r.node.last().labels.get(vigil::maintenance::policy::PERFORM_MAINTENANCE_LABEL),
        None,
        "a label this node never set is not touched"
    );
}

#[tokio::test]
async fn an_http_worker_gets_a_post_and_acknowledges_in_its_record() {
    let mut r = rig(|_| {});
    let coord = r.coord.clone();
    let key = r.keys.status("trainer-0");
    let bodies: Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Arc::default();
    let seen = bodies.clone();
    let app = axum::Router::new().route(
        "/checkpoint",
        axum::routing::post(move |body: axum::body::Bytes| {
            let coord = coord.clone();
            let key = key.clone();
            let seen = seen.clone();
            async move {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let id = v["request"].as_str().unwrap().to_string();
                seen.lock().unwrap().push(v);
                coord.hset(&key, &[("checkpoint_ack".into(), id)], None).await.unwrap();
                "saving"
            }
        }),
    );
    let addr = serve(app).await;
    r.runtime.set_checkpoint_label("c1", &format!("http://{addr}/checkpoint"));
    let results = r.controller.checkpoint("host-maintenance", Duration::from_secs(3)).await;
    assert_eq!(results[0].outcome, Outcome::Acked, "{results:?}");
    assert_eq!(results[0].method, "http");
    let b = bodies.lock().unwrap()[0].clone();
    assert_eq!(b["reason"], "host-maintenance");
    assert_eq!(b["worker"], "trainer-0");
    // The budget left once the workers were listed.
    let deadline = b["deadline_ms"].as_u64().unwrap();
    assert!(deadline <= 3000 && deadline > 2500, "{deadline}");
    let rec = r.coord.hgetall(&r.keys.status("trainer-0")).await.unwrap();
    assert_eq!(rec["checkpoint_ack"], rec["checkpoint_request"]);
}

#[tokio::test]
async fn an_http_worker_that_refuses_is_failed() {
    let mut r = rig(|_| {});
    let port = free_port();
    r.runtime.set_checkpoint_label("c1", &format!("http://127.0.0.1:{port}/checkpoint"));
    let results = r.controller.checkpoint("test", Duration::from_secs(2)).await;
    assert_eq!(results[0].outcome, Outcome::Failed);
    assert!(results[0].detail.contains("POST"), "{}", results[0].detail);
}

/// A preemption two seconds into a host-maintenance checkpoint round (whose worker never
/// answers, so the round would hold the whole 50 s budget) reaches the Node and the workers at
/// once: the round runs on its own and the controller keeps reading the metadata.
#[tokio::test]
async fn a_second_notice_during_a_checkpoint_round_is_acted_on_at_once() {
    use tokio_util::sync::CancellationToken;
    use vigil::vocab::maintenance::{MaintenanceEvent, RawMetadata};
    let r = rig(|_| {});
    let (meta_tx, meta_rx) = tokio::sync::watch::channel(RawMetadata::default());
    let (_gpu_tx, gpu_rx) = tokio::sync::watch::channel(Default::default());
    let stop = CancellationToken::new();
    let task =
        tokio::spawn(r.controller.run(meta_rx, gpu_rx, CancellationToken::new(), stop.clone()));
    let status = r.keys.status("trainer-0");
    let reason = |coord: Arc<dyn Coordinator>, key: String| async move {
        coord.hgetall(&key).await.unwrap().get("checkpoint_reason").cloned()
    };
    meta_tx.send_replace(RawMetadata {
        maintenance_event: Some(MaintenanceEvent::MigrateOnHostMaintenance),
        ..RawMetadata::default()
    });
    let asked = common::real::poll(Duration::from_secs(5), || {
        let (c, k) = (r.coord.clone(), status.clone());
        async move { reason(c, k).await.filter(|x| x == "host-maintenance") }
    })
    .await;
    assert!(asked.is_some(), "the first round asked the worker");
    tokio::time::sleep(Duration::from_secs(2)).await;

    let sent = tokio::time::Instant::now();
    meta_tx.send_replace(RawMetadata {
        maintenance_event: Some(MaintenanceEvent::MigrateOnHostMaintenance),
        preempted: Some(true),
        ..RawMetadata::default()
    });
    let preemption = common::real::poll(Duration::from_secs(5), || {
        let (c, k) = (r.coord.clone(), status.clone());
        async move { reason(c, k).await.filter(|x| x == "preemption") }
    })
    .await;
    let took = sent.elapsed();
    assert!(preemption.is_some(), "the preemption round asked the worker");
    assert!(
        r.node.last().add_taints.iter().any(|t| t.key == "vigil.dev/termination-imminent"),
        "the Node shows the termination"
    );
    assert!(
        took < Duration::from_secs(3),
        "as fast as a first notice, not after the first round's 50 s budget: {took:?}"
    );
    stop.cancel();
    let _ = task.await;
}

/// A Node API that refuses its first writes (the API server down, a 500, a timeout).
struct Flaky {
    refuse: std::sync::atomic::AtomicUsize,
    inner: RecordingNodeApi,
}

#[async_trait::async_trait]
impl vigil::kube::node::NodeApi for Flaky {
    async fn reconcile(
        &self,
        node: &str,
        desired: &vigil::kube::node::NodeDesired,
    ) -> Result<(), vigil::kube::node::NodeError> {
        use std::sync::atomic::Ordering;
        if self
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(vigil::kube::node::NodeError::Conflict { node: node.into(), attempts: 5 });
        }
        self.inner.reconcile(node, desired).await
    }
    async fn event(
        &self,
        node: &str,
        reason: &str,
        message: &str,
        kind: vigil::kube::node::EventType,
    ) -> Result<(), vigil::kube::node::NodeError> {
        self.inner.event(node, reason, message, kind).await
    }
}

/// A Node write that failed is retried every tick until the Node shows the state: no waiting
/// for the next metadata change (which may never come before the VM is gone).
#[tokio::test]
async fn a_failed_node_write_is_retried_until_the_node_matches() {
    use tokio_util::sync::CancellationToken;
    use vigil::vocab::maintenance::{MaintenanceEvent, RawMetadata};
    let mut cfg = node_config("gpu-1");
    cfg.poll_interval = Duration::from_millis(100);
    cfg.fleet.heartbeat_ttl = Duration::from_secs(1);
    let coord = memory_coordinator();
    let runtime = FakeRuntime::default();
    let metrics = Arc::new(Metrics::new());
    let recorded = RecordingNodeApi::default();
    let flaky =
        Arc::new(Flaky { refuse: std::sync::atomic::AtomicUsize::new(3), inner: recorded.clone() });
    let (_agent, controller) = agent_and_controller(
        &cfg,
        &coord,
        &runtime,
        flaky,
        Notifier::new(None, metrics.clone()),
        &metrics,
        SharedFacts::default(),
    );
    let (meta_tx, meta_rx) = tokio::sync::watch::channel(RawMetadata::default());
    let (_gpu_tx, gpu_rx) = tokio::sync::watch::channel(Default::default());
    let stop = CancellationToken::new();
    let task =
        tokio::spawn(controller.run(meta_rx, gpu_rx, CancellationToken::new(), stop.clone()));
    meta_tx.send_replace(RawMetadata {
        maintenance_event: Some(MaintenanceEvent::TerminateOnHostMaintenance),
        ..RawMetadata::default()
    });
    let shown = common::real::poll(Duration::from_secs(5), || {
        let n = recorded.clone();
        async move {
            n.last()
                .add_taints
                .iter()
                .any(|t| t.key == "vigil.dev/termination-imminent")
                .then_some(())
        }
    })
    .await;
    assert!(shown.is_some(), "the Node converged after the refused writes");
    stop.cancel();
    let _ = task.await;
}

/// SIGTERM while a notice's round still waits for a silent worker, with a budget that reaches
/// into the drain's last second: the round is cut short two seconds before the grace period
/// ends and recorded as such (trail, annotation, Event), so the outcome is never lost to the
/// drain's guard. Paused time: the schedule is exact, not a race with a busy machine.
#[tokio::test(start_paused = true)]
async fn sigterm_during_a_long_round_records_it_as_cut_short_before_the_grace_ends() {
    use tokio_util::sync::CancellationToken;
    use vigil::vocab::maintenance::{MaintenanceEvent, RawMetadata};
    let r = rig(|c| {
        c.checkpoint.grace = Duration::from_secs(10);
        c.checkpoint.maintenance_budget = Duration::from_secs(9);
        c.checkpoint.sigterm_budget = Duration::from_secs(5);
        c.checkpoint.preemption_budget = Duration::from_secs(5);
    });
    let (meta_tx, meta_rx) = tokio::sync::watch::channel(RawMetadata::default());
    let (_gpu_tx, gpu_rx) = tokio::sync::watch::channel(Default::default());
    let term = CancellationToken::new();
    let task =
        tokio::spawn(r.controller.run(meta_rx, gpu_rx, term.clone(), CancellationToken::new()));
    meta_tx.send_replace(RawMetadata {
        maintenance_event: Some(MaintenanceEvent::MigrateOnHostMaintenance),
        ..RawMetadata::default()
    });
    let status = r.keys.status("trainer-0");
    let asked = common::real::poll(Duration::from_secs(5), || {
        let (c, k) = (r.coord.clone(), status.clone());
        async move { c.hgetall(&k).await.unwrap().remove("checkpoint_reason") }
    })
    .await;
    assert_eq!(asked.as_deref(), Some("host-maintenance"));

    let signalled = tokio::time::Instant::now();
    term.cancel();
    tokio::time::timeout(Duration::from_secs(9), task)
        .await
        .expect("the controller returned before the drain's guard (grace - 1 s)")
        .unwrap();
    assert!(signalled.elapsed() <= Duration::from_secs(8), "{:?}", signalled.elapsed());
    let last = r.node.last().annotations["vigil.dev/last-checkpoint"].clone().unwrap();
    assert!(last.contains("sigterm-cut-short: acked=0 timed-out=1"), "{last}");
    assert!(r.node.reasons().contains(&"VigilCheckpoint".to_string()));
    let trail = r.coord.read_recent(&r.keys.trail(), 50).await.unwrap();
    assert!(
        trail.iter().any(|(_, f)| f["decision"] == "checkpoint-timed-out"
            && f.get("detail").is_some_and(|d| d.contains("cut short"))),
        "{trail:?}"
    );
}

/// The round's deadline runs from the signal as the signal handler stamped it, not from when the
/// controller noticed it: noticed 3 s late (an API call under way), the round is still recorded
/// before the drain's guard, which runs from the signal too (it once ran from the notice, 3 s
/// after the drain's: nothing was recorded and the agent exited 1).
#[tokio::test(start_paused = true)]
async fn a_sigterm_noticed_late_still_records_its_round_before_the_drain_ends() {
    use tokio_util::sync::CancellationToken;
    use vigil::vocab::maintenance::{MaintenanceEvent, RawMetadata};
    let r = rig(|c| {
        c.checkpoint.grace = Duration::from_secs(10);
        c.checkpoint.maintenance_budget = Duration::from_secs(9);
        c.checkpoint.sigterm_budget = Duration::from_secs(5);
        c.checkpoint.preemption_budget = Duration::from_secs(5);
    });
    let term_at = vigil::node::controller::TermAt::default();
    let controller = r.controller.with_term_at(term_at.clone());
    let (meta_tx, meta_rx) = tokio::sync::watch::channel(RawMetadata::default());
    let (_gpu_tx, gpu_rx) = tokio::sync::watch::channel(Default::default());
    let term = CancellationToken::new();
    let task =
        tokio::spawn(controller.run(meta_rx, gpu_rx, term.clone(), CancellationToken::new()));
    meta_tx.send_replace(RawMetadata {
        maintenance_event: Some(MaintenanceEvent::MigrateOnHostMaintenance),
        ..RawMetadata::default()
    });
    let status = r.keys.status("trainer-0");
    let asked = common::real::poll(Duration::from_secs(5), || {
        let (c, k) = (r.coord.clone(), status.clone());
        async move { c.hgetall(&k).await.unwrap().remove("checkpoint_reason") }
    })
    .await;
    assert_eq!(asked.as_deref(), Some("host-maintenance"));

    let signalled = tokio::time::Instant::now();
    term_at.set(signalled).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    term.cancel();
    tokio::time::timeout(Duration::from_secs(6), task)
        .await
        .expect("the controller returned before the drain's guard (signal + grace - 1 s)")
        .unwrap();
    assert!(signalled.elapsed() <= Duration::from_secs(8), "{:?}", signalled.elapsed());
    let last = r.node.last().annotations["vigil.dev/last-checkpoint"].clone().unwrap();
    assert!(last.contains("sigterm-cut-short: acked=0 timed-out=1"), "{last}");
}

/// Issue 31, item 2: a maintenance costs its notice → the end of its checkpoint round → its end,
/// counted to `maintenance` and said in the trail when it ends.
#[tokio::test]
async fn a_maintenance_says_what_it_lost_when_it_ends() {
    let mut r = rig(|c| c.checkpoint.maintenance_budget = Duration::from_secs(5));
    let worker = acking_worker(r.coord.clone(), r.keys.status("trainer-0"));
    write_record(
        r.coord.as_ref(),
        &r.keys.status("trainer-0"),
        "processing",
        r.coord.time().await.unwrap(),
        &[],
    )
    .await;
    let notice = r.coord.time().await.unwrap();
    r.apply(Phase::Ongoing, vec!["upcoming-ongoing"], Some(Interruption::HostMaintenance)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.controller.apply(MaintenanceState::default()).await;
    let end = r.coord.time().await.unwrap();
    worker.abort();
    let entries = r.coord.read_recent(&r.keys.trail(), 100).await.unwrap();
    let lost: Vec<&str> = entries
        .iter()
        .filter(|(_, e)| e.get("decision").map(String::as_str) == Some("time-lost"))
        .map(|(_, e)| e["detail"].as_str())
        .collect();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert!(
        lost[0].starts_with("maintenance: lost ")
            && lost[0].contains(" = notice → checkpoint ")
            && lost[0].ends_with("(it ended)"),
        "{}",
        lost[0]
    );
    let text = r.metrics.encode();
    let counted: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("vigil_lost_seconds_total{cause=\"maintenance\"} "))
        .and_then(|v| v.parse().ok())
        .expect("the counter");
    let wall = (end - notice) as f64 / 1000.0;
    assert!((0.3..=wall).contains(&counted), "{counted} s counted, {wall} s seen");
}
