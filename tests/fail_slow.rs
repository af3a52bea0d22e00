//! Fail-slow (issue 45, `gang.pace`): a four-rank gang on four agents (one Redis-like
//! coordinator, a fake clock, no sleeps) learns its pace, then slows by a third because one rank
//! computes longer before each collective: one `slow` page, placed at that rank and naming its
//! evidence, opened once for the gang; nothing restarted; then back at its pace, one
//! `slow-over`. And a healthy gang whose pace wobbles (a data-loader stall now and then, an
//! announced evaluation at half speed) never pages `slow`.

use crate::common;

use std::time::Duration;

use common::fake_gpu::FakeGpu;
use common::fleet::Fleet;
use vigil::accel::gpu::model::GpuReport;
use vigil::accel::gpu::monitor::spawn_monitor;
use vigil::alerts::AlertKind;
use vigil::clock::Millis;

const POLL: Duration = Duration::from_secs(5);
const GANG: &str = "ml/llama-70b";
const RANKS: usize = 4;

/// Every rank computes 300 ms a step.
fn even(_: usize) -> Option<u64> {
    Some(300)
}

/// Rank 2 computes 450 ms a step where the others take 300: the gang slows to 0.7 steps/s.
fn rank_2_slow(i: usize) -> Option<u64> {
    Some(if i == 2 { 450 } else { 300 })
}

/// The gang's ranks, their step (as a float: fractions of a step per poll) and compute times.
struct Gang {
    fleet: Fleet,
    step: f64,
}

impl Gang {
    fn new(pace: bool) -> Gang {
        Gang::build(pace, false)
    }

    /// With `nodes`: each node's controller writes its Node (`VigilSlow`, opted into the
    /// `NoExecute` taint, held ten minutes after the node was last named).
    fn build(pace: bool, nodes: bool) -> Gang {
        let mut b = Fleet::builder().nodes(RANKS).poll(POLL).config(move |_, c| {
            c.gang.pace.enabled = pace;
            if nodes {
                c.gang.pace.taint = vigil::config::SlowTaint::NoExecute;
                c.gang.pace.taint_for = Duration::from_secs(600);
            }
        });
        if nodes {
            b = b.controllers();
        }
        let fleet = b.build();
        for (i, node) in fleet.nodes.iter().enumerate() {
            node.runtime.add(&format!("c{i}"), &format!("rank-{i}"));
        }
        Gang { fleet, step: 0.0 }
    }

    /// `secs` seconds at `rate` steps per second, every rank beating each poll with its compute
    /// time (`compute(i)`), `grace` announced when given.
    async fn run(
        &mut self,
        rate: f64,
        secs: u64,
        compute: impl Fn(usize) -> Option<u64>,
        grace: bool,
    ) {
        let ticks = secs / POLL.as_secs();
        for _ in 0..ticks {
            self.step += rate * POLL.as_secs_f64();
            let step = format!("step-{}", self.step as u64);
            let now: Millis = self.fleet.now();
            for i in 0..RANKS {
                let ms = compute(i).map(|c| c.to_string());
                let mut fields =
                    vec![("gang", GANG), ("gang_size", "4"), ("progress", step.as_str())];
                if let Some(ms) = &ms {
                    fields.push(("compute_ms", ms.as_str()));
                }
                // NB: as the client does, an announcement ends with `grace` "0" (no grace).
                fields.push(("grace", if grace { "600" } else { "0" }));
                self.fleet.write(i, &format!("rank-{i}"), "processing", now, &fields).await;
            }
            for report in self.fleet.tick().await {
                assert_eq!(report.coordinator_error, None);
            }
        }
    }

    /// A gang with its pace watched that learned it: ten windows, then steady (20 minutes at
    /// one step a second, every rank even).
    async fn learned() -> Gang {
        let mut g = Gang::new(true);
        g.run(1.0, 20 * 60, even, false).await;
        g
    }

    fn pages(&self, kind: AlertKind) -> Vec<vigil::alerts::Alert> {
        self.fleet.sink.of(kind)
    }

    /// A series of node `i`'s scrape (0 when absent).
    fn metric(&self, i: usize, series: &str) -> f64 {
        self.fleet.nodes[i]
            .metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Each node's controller ticks; what node `i`'s Node shows of the pace: the `VigilSlow`
    /// condition (status, message; `None`, `""` before the Node's first write) and the slow
    /// taint's effect (`""`: off).
    async fn slow_nodes(&mut self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for node in self.fleet.nodes.iter_mut() {
            node.controller().tick().await;
            let d = node.node_api.last();
            let taint = d.add_taints.iter().find(|t| t.key == "vigil.dev/slow");
            let tainted = taint.map(|t| t.effect.clone()).unwrap_or_default();
            let shown = match d.conditions.iter().find(|c| c.kind == "VigilSlow") {
                Some(c) => (c.status.as_str().to_string(), c.message.clone(), tainted),
                None => ("None".to_string(), String::new(), tainted),
            };
            out.push(shown);
        }
        out
    }

    /// A fake NVML with one GPU (`GPU-iiii`) behind a real monitor thread on each of `nodes`,
    /// its reports read by that node's agent; the monitors stop with the token.
    fn with_fake_gpus(
        &mut self,
        nodes: &[usize],
    ) -> (tokio_util::sync::CancellationToken, Vec<FakeGpu>) {
        let stop = tokio_util::sync::CancellationToken::new();
        let mut gpus = Vec::new();
        for &i in nodes {
            let gpu = FakeGpu::new();
            gpu.add_gpu(0, &format!("GPU-{i}{i}{i}{i}"));
            let mut cfg = self.fleet.nodes[i].cfg.gpu.clone();
            cfg.sample_interval = Duration::from_millis(20);
            let (tx, rx) = tokio::sync::watch::channel(GpuReport::default());
            spawn_monitor(Box::new(gpu.clone()), cfg, tx, stop.clone()).expect("a monitor");
            gpu.wait_samples(2, Duration::from_secs(30));
            let agent = self.fleet.nodes[i].agents.remove(0);
            self.fleet.nodes[i].agents.insert(0, agent.with_gpu(rx));
            gpus.push(gpu);
        }
        (stop, gpus)
    }

    fn restarts(&self) -> usize {
        (0..RANKS).map(|i| self.fleet.nodes[i].runtime.restarts(&format!("c{i}"))).sum()
    }
}

#[tokio::test]
async fn a_gang_slowed_by_one_rank_is_paged_once_naming_it_and_never_restarted() {
    let mut g = Gang::learned().await;
    assert!(g.pages(AlertKind::Slow).is_empty());
    // Rank 2 computes 450 ms where the others take 300 (`rank_2_slow`).
    g.run(0.7, 90, rank_2_slow, false).await;
    assert!(g.pages(AlertKind::Slow).is_empty(), "not before slow_for");
    g.run(0.7, 6 * 60 + 30, rank_2_slow, false).await;
    let pages = g.pages(AlertKind::Slow);
    assert_eq!(pages.len(), 1, "one page for the gang: {:?}", g.fleet.sink.kinds());
    let p = &pages[0];
    assert_eq!(p.gang.as_deref(), Some(GANG));
    assert_eq!(p.worker.as_deref(), Some("rank-2"), "placed at the rank it waits for");
    assert_eq!(p.node, "gpu-2");
    // NB: the baseline is 1 step/s measured on whole steps: 0.99 or 1.00.
    assert!(
        p.detail.contains("usual 1.00 steps/s") || p.detail.contains("usual 0.99 steps/s"),
        "{}",
        p.detail
    );
    for what in ["0.70 steps/s", "computes 450 ms", "others 300 ms", "does not restart"] {
        assert!(p.detail.contains(what), "{what}: {}", p.detail);
    }
    // Slow for an hour: still one page, nothing restarted, no hang.
    g.run(0.7, 60 * 60, rank_2_slow, false).await;
    assert_eq!(g.pages(AlertKind::Slow).len(), 1);
    assert_eq!(g.restarts(), 0, "never a restart for slowness");
    // Each member lost its deficit: 30 % of the slow run (about 68 min): ~20 min apiece.
    let lost = g.metric(1, "vigil_lost_seconds_total{cause=\"slow\"}");
    assert!((1_000.0..1_500.0).contains(&lost), "{lost}");
    let rate = g.metric(1, "vigil_gang_step_rate{gang=\"ml/llama-70b\",worker=\"rank-1\"}");
    assert!((0.65..0.75).contains(&rate), "{rate}");
    assert_eq!(
        g.metric(0, "vigil_gang_slow_episodes_total")
            + g.metric(1, "vigil_gang_slow_episodes_total")
            + g.metric(2, "vigil_gang_slow_episodes_total")
            + g.metric(3, "vigil_gang_slow_episodes_total"),
        1.0,
        "one opener"
    );
    assert!(g.pages(AlertKind::Hung).is_empty());
    // Back at its pace: the episode ends (a window or two later), said once.
    g.run(1.0, 90, even, false).await;
    let over = g.pages(AlertKind::SlowOver);
    assert_eq!(over.len(), 1, "{:?}", g.fleet.sink.kinds());
    assert!(over[0].detail.contains("back at its pace"), "{}", over[0].detail);
    assert_eq!(over[0].worker.as_deref(), Some("rank-2"));
    let key = g.fleet.nodes[0].keys.gang_slow(GANG);
    assert_eq!(
        g.fleet.get(&key).await.as_deref(),
        Some("over"),
        "the episode is closed, quiet for slow_for"
    );
    let resolved = g.fleet.sink.resolved();
    assert!(
        resolved
            .iter()
            .any(|(w, r)| w == "rank-2" && *r == vigil::alerts::Resolve::Episode(AlertKind::Slow)),
        "the slow alert is resolved by the agent that sent it: {resolved:?}"
    );
    // Slow again later: a new episode, a new page.
    g.run(0.7, 8 * 60, rank_2_slow, false).await;
    assert_eq!(g.pages(AlertKind::Slow).len(), 2);
}

#[tokio::test]
async fn a_healthy_gang_whose_pace_wobbles_is_never_slow() {
    let mut g = Gang::new(true);
    g.run(2.0, 20 * 60, even, false).await;
    for _ in 0..10 {
        // A data-loader stall of half a minute, then a minute and a half at pace.
        g.run(0.0, 30, even, false).await;
        g.run(2.0, 90, even, false).await;
    }
    // An announced evaluation, at half speed for twenty minutes.
    g.run(1.0, 20 * 60, even, true).await;
    g.run(2.0, 10 * 60, even, false).await;
    assert!(
        g.pages(AlertKind::Slow).is_empty(),
        "{:?}",
        g.pages(AlertKind::Slow).first().map(|p| p.detail.clone())
    );
    assert_eq!(g.restarts(), 0);
}

#[tokio::test]
async fn without_gang_pace_nothing_is_measured() {
    // The default is off.
    assert!(!vigil::config::Config::default().gang.pace.enabled);
    let mut g = Gang::new(false);
    g.run(1.0, 20 * 60, |_| Some(300), false).await;
    g.run(0.5, 20 * 60, |i| Some(if i == 2 { 600 } else { 300 }), false).await;
    assert!(g.pages(AlertKind::Slow).is_empty());
}

/// No rank publishes its compute time, but rank 2's node shows its GPU clocked down by the
/// hardware (NVML's `hw-slowdown`): the page names rank 2 by that, and says so.
#[tokio::test]
async fn a_gpu_clocked_down_on_one_node_names_its_rank() {
    // The fake NVML behind the real monitor thread on every node; node 2's GPU reports
    // `hw-slowdown` (and, like the others, `sw-power-cap`: a GPU at full load by design).
    let mut g = Gang::new(true);
    let (stop, gpus) = g.with_fake_gpus(&[0, 1, 2, 3]);
    for gpu in &gpus {
        gpu.set_throttle_reasons(0, vec!["sw-power-cap"]);
    }
    gpus[2].set_throttle_reasons(0, vec!["sw-power-cap", "hw-slowdown"]);
    gpus[2].wait_samples(2, Duration::from_secs(30));
    let none = |_: usize| None;
    g.run(1.0, 20 * 60, none, false).await;
    g.run(0.7, 8 * 60, none, false).await;
    stop.cancel();
    let pages = g.pages(AlertKind::Slow);
    assert_eq!(pages.len(), 1, "{:?}", g.fleet.sink.kinds());
    assert_eq!(pages[0].worker.as_deref(), Some("rank-2"));
    assert!(
        pages[0].detail.contains("its node shows GPU 0 (GPU-2222) hw-slowdown")
            && !pages[0].detail.contains("sw-power-cap"),
        "{}",
        pages[0].detail
    );
}

#[tokio::test]
async fn the_node_a_slow_gang_waits_for_shows_vigil_slow_and_its_opted_in_taint() {
    let mut g = Gang::build(true, true);
    g.run(1.0, 20 * 60, even, false).await;
    for (status, _, tainted) in g.slow_nodes().await {
        assert_eq!((status.as_str(), tainted.as_str()), ("None", ""), "no change, no write");
    }
    g.run(0.7, 8 * 60, rank_2_slow, false).await;
    let shown = g.slow_nodes().await;
    for (i, (status, message, tainted)) in shown.iter().enumerate() {
        if i != 2 {
            // Nobody names it: no change, no write (at start-up the controller writes False).
            assert_eq!((status.as_str(), tainted.as_str()), ("None", ""), "node {i}");
            continue;
        }
        // NB: named by its compute time alone — the job's own word — `NoSchedule`, not the
        // `NoExecute` opted into: a tenant's records never evict a shared node's pods.
        assert_eq!((status.as_str(), tainted.as_str()), ("True", "NoSchedule"), "{message}");
        for what in [
            "gang ml/llama-70b runs at 0.70 steps/s",
            "(70 %)",
            "waits for rank-2 on this node",
            "computes 450 ms",
        ] {
            assert!(message.contains(what), "{what}: {message}");
        }
    }
    let node = &g.fleet.nodes[2].node_api;
    let events = node.reasons();
    assert_eq!(
        events.iter().filter(|r| *r == "VigilSlow").count(),
        1,
        "one Event when the gang names the node: {events:?}"
    );
    assert!(!g.fleet.nodes[1].node_api.reasons().contains(&"VigilSlow".to_string()));
    // An announced operation in the slow run (a checkpoint: held windows) changes nothing: still
    // named, no second Event.
    g.run(0.7, 90, rank_2_slow, true).await;
    g.run(0.7, 30, rank_2_slow, false).await;
    let shown = g.slow_nodes().await;
    assert_eq!(
        (shown[2].0.as_str(), shown[2].2.as_str()),
        ("True", "NoSchedule"),
        "{}",
        shown[2].1
    );
    let events = g.fleet.nodes[2].node_api.reasons();
    assert_eq!(events.iter().filter(|r| *r == "VigilSlow").count(), 1, "{events:?}");
    // Back at its pace: the condition False again; the taint held for taint_for (a replacement
    // is not placed straight back on the node), then off. Never a restart.
    g.run(1.0, 3 * 60, even, false).await;
    let shown = g.slow_nodes().await;
    assert_eq!(
        (shown[2].0.as_str(), shown[2].1.as_str(), shown[2].2.as_str()),
        ("False", "vigil: no slow gang names this node", "NoSchedule")
    );
    g.run(1.0, 8 * 60, even, false).await;
    let shown = g.slow_nodes().await;
    assert_eq!((shown[2].0.as_str(), shown[2].2.as_str()), ("False", ""));
    assert_eq!(g.restarts(), 0);
}

/// Observe mode by SIGHUP (`dry_run = true`) takes the slow taint off the Node at the next tick,
/// as it stops the restarts; out of it again, the taint is back. (The controller once kept its
/// start-up configuration: the taint stayed on, evicting pods, in observe mode.)
#[tokio::test]
async fn a_reload_to_observe_mode_takes_the_slow_taint_off() {
    let mut g = Gang::build(true, true);
    let running = g.fleet.nodes[2].cfg.clone();
    let (reload, rx) = tokio::sync::watch::channel(running.clone());
    let agent = g.fleet.nodes[2].agents.remove(0).with_reload(rx);
    g.fleet.nodes[2].agents.insert(0, agent);
    g.run(1.0, 20 * 60, even, false).await;
    g.run(0.7, 8 * 60, rank_2_slow, false).await;
    assert_eq!(g.slow_nodes().await[2].2, "NoSchedule", "named and tainted");
    reload.send_replace(vigil::config::Config { dry_run: true, ..running.clone() });
    g.run(0.7, POLL.as_secs(), rank_2_slow, false).await;
    let shown = g.slow_nodes().await;
    assert_eq!((shown[2].0.as_str(), shown[2].2.as_str()), ("True", ""), "{}", shown[2].1);
    reload.send_replace(running);
    g.run(0.7, POLL.as_secs(), rank_2_slow, false).await;
    assert_eq!(g.slow_nodes().await[2].2, "NoSchedule", "tainted again");
}

/// `NoExecute` evicts every pod on the node, other namespaces' too: only where the node's own
/// agent reads a slowness there. Rank 2 computes longest (strong evidence, but the job's own
/// word) on a node whose GPU the system's power brake slows: `NoExecute`. (Before, compute time
/// alone evicted: a tenant writing `compute_ms` could empty a shared node of other jobs' pods.)
#[tokio::test]
async fn no_execute_needs_the_node_s_own_signal_beside_the_job_s_records() {
    let mut g = Gang::build(true, true);
    let (stop, gpus) = g.with_fake_gpus(&[0, 1, 2, 3]);
    gpus[2].set_throttle_reasons(0, vec!["hw-power-brake"]);
    gpus[2].wait_samples(2, Duration::from_secs(30));
    g.run(1.0, 20 * 60, even, false).await;
    g.run(0.7, 8 * 60, rank_2_slow, false).await;
    stop.cancel();
    let shown = g.slow_nodes().await;
    assert_eq!((shown[2].0.as_str(), shown[2].2.as_str()), ("True", "NoExecute"), "{}", shown[2].1);
    for what in ["computes 450 ms", "its node shows GPU 0 (GPU-2222) hw-power-brake"] {
        assert!(shown[2].1.contains(what), "{what}: {}", shown[2].1);
    }
    assert_eq!(g.restarts(), 0);
}

/// An accepted SIGHUP is written once in the trail (`config-reloaded`): the keys that changed
/// and those kept until a restart, by name only (never the new Redis URL's password).
#[tokio::test]
async fn a_reload_is_in_the_trail_once_naming_its_keys() {
    let mut g = Gang::new(true);
    let running = g.fleet.nodes[2].cfg.clone();
    let (reload, rx) = tokio::sync::watch::channel(running.clone());
    let agent = g.fleet.nodes[2].agents.remove(0).with_reload(rx);
    g.fleet.nodes[2].agents.insert(0, agent);
    let mut new = vigil::config::Config { dry_run: true, ..running };
    new.redis.url = "redis://:s3cret@redis.example:6379".into();
    reload.send_replace(new);
    g.run(1.0, 3 * POLL.as_secs(), even, false).await;
    let trail = g.fleet.store.read_recent(&g.fleet.nodes[2].keys.trail(), 1000).await.unwrap();
    let got: Vec<_> = trail.iter().filter(|(_, f)| f["decision"] == "config-reloaded").collect();
    assert_eq!(got.len(), 1, "once per reload: {trail:?}");
    let want = "config reloaded: changed dry_run; kept until a restart: redis.url";
    assert_eq!(got[0].1["detail"], want);
}

/// The fake NVML behind the real monitor thread: node 2's GPU starts retrying its PCIe link and
/// its NVLinks while the gang slows (no rank publishes `compute_ms`): the rising counters name
/// rank 2, and another node's busy GPU at full clock names nothing.
#[tokio::test]
async fn a_gpu_whose_links_start_retrying_names_its_rank() {
    let mut g = Gang::new(true);
    let (stop, gpus) = g.with_fake_gpus(&[1, 2]);
    for gpu in &gpus {
        gpu.set_sm_clock(0, 1_980, 0.98);
    }
    let none = |_: usize| None;
    g.run(1.0, 20 * 60, none, false).await;
    gpus[1].set_link_errors(0, 400, 12);
    gpus[1].wait_samples(3, Duration::from_secs(30));
    g.run(0.7, 8 * 60, none, false).await;
    stop.cancel();
    let pages = g.pages(AlertKind::Slow);
    assert_eq!(pages.len(), 1, "{:?}", g.fleet.sink.kinds());
    assert_eq!(pages[0].worker.as_deref(), Some("rank-2"));
    assert!(
        pages[0]
            .detail
            .contains("its node shows GPU 0 (GPU-2222) PCIe replays +400, NVLink errors +12"),
        "{}",
        pages[0].detail
    );
    assert_eq!(g.restarts(), 0);
}

/// Which node's agent opened the gang's slow episodes (by its metrics), if one did.
fn opener(g: &Gang) -> Option<usize> {
    (0..RANKS).find(|&i| g.metric(i, "vigil_gang_slow_episodes_total") > 0.0)
}

/// Every agent restarted in the middle of a slow episode (a rolling update of the DaemonSet):
/// each goes on from the pace its member's entry keeps — it does not learn the slow pace as the
/// usual one — and the opener's new agent takes its episode back: no second page, one
/// `slow-over` when the gang is back at its pace. Then an episode whose opener's node is gone for
/// good lapses with its lease: the gang, still slow, is paged again by another member's agent.
#[tokio::test]
async fn agents_restarted_in_a_slow_episode_go_on_from_the_kept_pace_and_a_lost_opener_lapses() {
    let mut g = Gang::learned().await;
    g.run(0.7, 8 * 60, rank_2_slow, false).await;
    assert_eq!(g.pages(AlertKind::Slow).len(), 1);
    let first = opener(&g).expect("an opener");
    let slow_series = "vigil_gang_slow{gang=\"ml/llama-70b\",worker=\"rank-1\"}";
    assert_eq!(g.metric(1, slow_series), 1.0, "rank 1 is slow");
    for i in 0..RANKS {
        g.fleet.restart_agents(i);
    }
    g.run(0.7, 6 * 60, rank_2_slow, false).await;
    let base =
        g.metric(1, "vigil_gang_step_rate_baseline{gang=\"ml/llama-70b\",worker=\"rank-1\"}");
    assert!((0.95..1.05).contains(&base), "the kept pace, not 0.7: {base}");
    assert_eq!(g.metric(1, slow_series), 1.0, "still slow after the restart");
    assert_eq!(
        g.pages(AlertKind::Slow).len(),
        1,
        "the episode taken back, not paged again: {:?}",
        g.fleet.sink.kinds()
    );
    let key = g.fleet.nodes[0].keys.gang_slow(GANG);
    let held = g.fleet.get(&key).await.expect("the episode stands");
    assert!(
        held.contains(&format!(":gpu-{first}/rank-{first}@")),
        "its opener's new agent holds it: {held}"
    );
    g.run(1.0, 90, even, false).await;
    assert_eq!(g.pages(AlertKind::SlowOver).len(), 1, "ended by its opener");
    assert_eq!(g.metric(1, slow_series), 0.0);
    assert_eq!(g.fleet.get(&key).await.as_deref(), Some("over"));
    // Slow again; once paged, the opener's node goes for good.
    g.run(1.0, 5 * 60, even, false).await;
    g.run(0.7, 8 * 60, rank_2_slow, false).await;
    assert_eq!(g.pages(AlertKind::Slow).len(), 2);
    let second = opener(&g).expect("an opener");
    g.fleet.nodes[second].alive = false;
    // The lease (10 minutes from its last renewal) lapses, and a member still slow asks again
    // within half a lease: paged again, by another agent.
    g.run(0.7, 16 * 60, rank_2_slow, false).await;
    let pages = g.pages(AlertKind::Slow);
    assert_eq!(pages.len(), 3, "{:?}", g.fleet.sink.kinds());
    let third = (0..RANKS)
        .filter(|&i| i != second)
        .find(|&i| g.metric(i, "vigil_gang_slow_episodes_total") > 0.0);
    assert!(third.is_some(), "another member's agent opened it");
    assert_eq!(pages[2].worker.as_deref(), Some("rank-2"), "{}", pages[2].detail);
    assert_eq!(g.restarts(), 0, "never a restart for slowness");
}

/// An agent that died between opening the gang's episode (its SET NX) and naming its member
/// left an episode never paged: its agent, restarted, removes it rather than take it back, and
/// the gang, slow, is paged.
#[tokio::test]
async fn an_episode_its_opener_never_named_is_opened_again_and_paged() {
    let mut g = Gang::learned().await;
    let key = g.fleet.nodes[0].keys.gang_slow(GANG);
    let now = g.fleet.now();
    let half_open = format!("{now}:700:1000:gpu-1/rank-1@{now}|?");
    g.fleet.store.set(&key, &half_open, Duration::from_secs(600)).await.unwrap();
    g.fleet.restart_agents(1);
    g.run(0.7, 8 * 60, |i| Some(if i == 2 { 450 } else { 300 }), false).await;
    let pages = g.pages(AlertKind::Slow);
    assert_eq!(pages.len(), 1, "{:?}", g.fleet.sink.kinds());
    assert_eq!(pages[0].worker.as_deref(), Some("rank-2"));
    let held = g.fleet.get(&key).await.expect("the episode");
    assert!(held.contains("|gpu-2/rank-2|"), "named: {held}");
}

/// An agent that died between naming its episode's member and claiming the page left an episode
/// never paged: its agent, restarted, takes the episode back and pages it once it measures the
/// gang slow itself, naming the member the episode names and why — once (the page's claim),
/// however often the agent restarts.
#[tokio::test]
async fn an_episode_its_opener_named_but_never_paged_is_paged_when_taken_back() {
    let mut g = Gang::learned().await;
    let key = g.fleet.nodes[0].keys.gang_slow(GANG);
    let now = g.fleet.now();
    let since = now - 5 * 60_000;
    let named = format!(
        "{since}:700:1000:gpu-1/rank-1@{now}|gpu-2/rank-2|3|it computes 450 ms a step, the others 300 ms"
    );
    g.fleet.store.set(&key, &named, Duration::from_secs(600)).await.unwrap();
    g.fleet.restart_agents(1);
    g.run(0.7, 8 * 60, rank_2_slow, false).await;
    let pages = g.pages(AlertKind::Slow);
    assert_eq!(pages.len(), 1, "{:?}", g.fleet.sink.kinds());
    assert_eq!(pages[0].worker.as_deref(), Some("rank-2"));
    assert!(pages[0].detail.contains("it computes 450 ms a step"), "{}", pages[0].detail);
    assert_eq!(g.fleet.get(&key).await.as_deref(), Some(named.as_str()));
    g.fleet.restart_agents(1);
    g.run(0.7, 2 * 60, rank_2_slow, false).await;
    assert_eq!(
        g.pages(AlertKind::Slow).len(),
        1,
        "taken back again, not paged again: {:?}",
        g.fleet.sink.kinds()
    );
    assert_eq!(g.restarts(), 0);
}

/// The opener's page claim gets no answer (a Redis blip): the page is owed, and sent on a later
/// cycle while the gang is still slow — once.
#[tokio::test]
async fn a_slow_page_whose_claim_got_no_answer_is_sent_on_a_later_cycle() {
    let mut g = Gang::learned().await;
    g.fleet.blip(":alert:");
    g.run(0.7, 8 * 60, rank_2_slow, false).await;
    assert!(g.fleet.blips.lock().unwrap().is_empty(), "the claim was tried");
    let pages = g.pages(AlertKind::Slow);
    assert_eq!(pages.len(), 1, "{:?}", g.fleet.sink.kinds());
    assert_eq!(pages[0].worker.as_deref(), Some("rank-2"));
    g.run(1.0, 90, even, false).await;
    assert_eq!(g.pages(AlertKind::SlowOver).len(), 1);
}

/// The opener's write naming the member fails, unanswered (a Redis blip after its SET NX won):
/// its placeholder is removed rather than left to hold every member off for a lease, and the
/// episode is opened again. Or it lands and its answer is lost: the opener does not know it
/// opened the episode, and its next ask finds its own episode there and takes it back. Either
/// way the gang is paged once, in minutes (not after half the lease, when an agent would ask
/// again), naming the member, and the episode is ended by its opener.
#[tokio::test]
async fn an_episode_whose_naming_write_got_no_answer_is_paged_once_in_minutes() {
    for blip in ["set::slow", "landed:set::slow"] {
        let mut g = Gang::learned().await;
        g.fleet.blip(blip);
        g.run(0.7, 4 * 60, rank_2_slow, false).await;
        assert!(g.fleet.blips.lock().unwrap().is_empty(), "{blip}: tried");
        let pages = g.pages(AlertKind::Slow);
        assert_eq!(pages.len(), 1, "{blip}: {:?}", g.fleet.sink.kinds());
        assert_eq!(pages[0].worker.as_deref(), Some("rank-2"), "{blip}");
        g.run(0.7, 4 * 60, rank_2_slow, false).await;
        g.run(1.0, 90, even, false).await;
        assert_eq!(g.pages(AlertKind::Slow).len(), 1, "{blip}: once");
        assert_eq!(g.pages(AlertKind::SlowOver).len(), 1, "{blip}: ended by its opener");
    }
}

/// The opener's `slow-over` claim gets no answer after it ended the episode: the step never runs
/// again for it (the episode is gone), so the page is owed while the quiet mark stands, and sent
/// by a later cycle — once.
#[tokio::test]
async fn a_slow_over_whose_claim_got_no_answer_is_still_sent_once() {
    let mut g = Gang::learned().await;
    g.run(0.7, 8 * 60, rank_2_slow, false).await;
    assert_eq!(g.pages(AlertKind::Slow).len(), 1);
    g.fleet.blip(":slow-over");
    g.run(1.0, 3 * 60, even, false).await;
    assert!(g.fleet.blips.lock().unwrap().is_empty(), "the claim was tried");
    assert_eq!(g.pages(AlertKind::SlowOver).len(), 1, "{:?}", g.fleet.sink.kinds());
}
