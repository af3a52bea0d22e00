//! The seeded simulation of gangs (issue 29, docs/safety.md "Gangs"): the real agents — one per
//! node, each node a member of two gangs that share the nodes — on one coordinator and one fake
//! clock, their cycles interleaved in a seeded order, with faults: agents that crash (mid-wave
//! too) and come back, a member's node standing down (its agent's SIGTERM), a node breaker spent
//! by others, the coordinator gone for a while, a failover that forgets a gang's incident, decision
//! and the locks, slow agents, stragglers, restarts that do not help (and a person who restarts a
//! job stuck for 45 minutes). After every cycle the harness checks, against its own ground truth:
//!
//! - **once per incident**: a member is never restarted twice unless its gang progressed in
//!   between, or `policy.cooldown` passed (the product's new incident);
//! - **all or nothing**: once one member of a gang is restarted, every member is within four of
//!   its own agent's cycles — unless its node was faulted (stood down, crashed, the coordinator
//!   gone, a failover) in that window: the residual window of docs/how-it-decides.md;
//! - **one page per incident**: at most one `hung` alert for a gang per stop of its collective;
//! - **never a moving collective**: no member is restarted while a member of its gang progresses;
//! - **restarts that do not help stop**: no restart of every member is decided after
//!   `policy.max_fruitless_restarts` decided in a row that brought the collective no further
//!   (each restart resumes from a checkpoint and trains on, never beats, or stops again where it
//!   did; a decision a member's node then refused counts, as the product counts it);
//! - **restarts that help go on**: a gang is refused as fruitless only when that is so;
//! - **one member for all** (gang `ml/b` is a JobSet's: one member's failure makes its
//!   controller restart every member, a few ticks later): one member failed per restart of the
//!   job, never a second before the controller acts, never one restarted in place;
//! - **a gang's restart persists**: unless every node's agent learns, no restart of every member
//!   begins sooner after its collective stopped than the fixed rule allows (`stale_after` and
//!   `restart_delay`);
//! - the odd seeds' agents learn their ranks' rhythms and restart on them (issue 46,
//!   `policy.learned.restarts`; in one of four, node 3's does not, and its gangs keep the fixed
//!   rule): every invariant above holds for a gang decided on learned evidence too;
//! - with gang `ml/c`, a job that never stops but sometimes runs slow (`super::gang_slow`):
//!   **no slow page without a slowdown**, **the slow member named** when it published its
//!   evidence, **never a restart for slowness**.
//!
//! The cycle, not every coordinator call, is the unit of interleaving here (the single-worker
//! simulation, `super::world`, interleaves every call): gang safety rests on the same per-member
//! pipeline that simulation checks, plus the decision's lock and SET NX.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use vigil::alerts::{AlertKind, Notifier};
use vigil::clock::{Clock, FakeClock, Millis};
use vigil::config::Config;
use vigil::coord::memory::MemoryCoordinator;
use vigil::coord::{Coordinator, Keys};
use vigil::cycle::agent::Agent;
use vigil::metrics::Metrics;
use vigil::recording::RecordingSink;
use vigil::runtime::sim::FakeRuntime;

use super::gang_mutant::{Faulty, GangMutant};
use super::gang_slow::{SlowGang, SlowSeen, SLOW_GANG, SLOW_INDEX};

/// The one-for-all gang's controller (a JobSet's), in its own file.
#[path = "gang_controller.rs"]
mod controller;
use super::gang_truth::{GangTruth, Phase};
use super::rng::Rng;

const DAY_START: Millis = 1_796_083_200_000 - 86_400_000;
const POLL: Duration = Duration::from_secs(15);
const POLL_MS: Millis = 15_000;
pub(super) const NODES: usize = 4;
const GANGS: [&str; 2] = ["ml/a", "ml/b"];
/// The gang whose controller restarts every member once one fails (a JobSet's).
const ONE_FOR_ALL: usize = 1;
/// Simulated time per seed.
const TICKS: u64 = 480;

struct NodeSim {
    keys: Keys,
    runtime: FakeRuntime,
    agent: Option<Agent>,
    cfg: Config,
    /// When this node was last faulted (stood down, crashed, or restarted its agent).
    faulted_at: Millis,
    /// Its agent stands down (SIGTERM) until this time.
    standing_down_until: Millis,
    /// The end of its latest stand-down (kept once it is over).
    held_until: Millis,
    /// Its agent's metrics (which agent opened the slow gang's episode).
    metrics: Option<Arc<Metrics>>,
}

pub struct GangViolation {
    pub invariant: &'static str,
    pub detail: String,
    pub trace: Vec<String>,
}

/// Totals across seeds, so the bulk run can say what it exercised.
#[derive(Debug, Default, Clone)]
pub struct GangStats {
    pub gang_restarts: u64,
    pub stops: u64,
    pub stragglers: u64,
    pub blocked_pages: u64,
    pub crashes: u64,
    pub stand_downs: u64,
    pub outages: u64,
    pub escalations: u64,
    pub failovers: u64,
    pub breakers_spent: u64,
    pub fruitless_pages: u64,
    pub fixed_by_people: u64,
    /// Restarts of the one-for-all gang: one member failed, its controller restarting all.
    pub one_for_all: u64,
    /// Old incarnations' beats past the step during their members' slow restarts.
    pub late_beats: u64,
    /// The slow gang's slowdowns, its `slow` pages, and those that named the slow member.
    pub slowdowns: u64,
    pub slow_pages: u64,
    pub slow_named: u64,
    /// Restarts of every member decided on the learned rhythm (issue 46, the odd seeds).
    pub learned_waves: u64,
}

impl GangStats {
    pub fn add(&mut self, o: &GangStats) {
        self.gang_restarts += o.gang_restarts;
        self.stops += o.stops;
        self.stragglers += o.stragglers;
        self.blocked_pages += o.blocked_pages;
        self.crashes += o.crashes;
        self.stand_downs += o.stand_downs;
        self.outages += o.outages;
        self.escalations += o.escalations;
        self.failovers += o.failovers;
        self.breakers_spent += o.breakers_spent;
        self.fruitless_pages += o.fruitless_pages;
        self.fixed_by_people += o.fixed_by_people;
        self.one_for_all += o.one_for_all;
        self.late_beats += o.late_beats;
        self.slowdowns += o.slowdowns;
        self.slow_pages += o.slow_pages;
        self.slow_named += o.slow_named;
        self.learned_waves += o.learned_waves;
    }
}

struct Sim {
    rng: Rng,
    clock: FakeClock,
    store: Arc<dyn Coordinator>,
    down: Arc<AtomicBool>,
    down_until: Millis,
    sink: RecordingSink,
    nodes: Vec<NodeSim>,
    gangs: Vec<GangTruth>,
    mutant: Option<GangMutant>,
    trace: Vec<String>,
    stats: GangStats,
    /// Cycles each node's agent has run.
    cycles: Vec<u64>,
    seen_alerts: usize,
    /// The one-for-all gang's attempt (its controller's incarnation), the failures seen of its
    /// members on each node, those since its controller last restarted it, and when its
    /// controller acts on the last one.
    attempt: u32,
    failed_seen: Vec<usize>,
    failed_this_attempt: usize,
    recreate_at: Option<Millis>,
    /// Gang `ml/c`: it never stops, it sometimes runs slow.
    slow: SlowGang,
    slow_seen: SlowSeen,
    /// Every node's agent restarts on learned rhythms (`learns`): a restart may come within
    /// seconds of a stop. Else the fixed rule's persistence holds ("a gang's restart persists").
    learned_all: bool,
    /// Beats of old incarnations in slow restarts (`super::gang_restart`), counted by the hooks.
    late_beats: Arc<std::sync::atomic::AtomicU64>,
    /// When this tick began: a slow restart moves the clock within a tick.
    tick_at: Millis,
}

fn container(node: usize, gang: usize) -> String {
    format!("c{node}-{gang}")
}

fn worker(gang: usize) -> String {
    format!("rank-g{gang}")
}

impl Sim {
    fn new(seed: u64, mutant: Option<GangMutant>) -> Sim {
        let mut rng = Rng::new(seed);
        let clock = FakeClock::at(DAY_START + rng.below(86_400) as Millis * 1_000);
        let slow = SlowGang::new(seed, clock.now());
        let store: Arc<dyn Coordinator> = Arc::new(MemoryCoordinator::new(Arc::new(clock.clone())));
        let mut sim = Sim {
            rng,
            clock,
            store,
            down: Arc::new(AtomicBool::new(false)),
            down_until: 0,
            sink: RecordingSink::default(),
            nodes: Vec::new(),
            gangs: Vec::new(),
            mutant,
            trace: Vec::new(),
            stats: GangStats::default(),
            cycles: vec![0; NODES],
            seen_alerts: 0,
            attempt: 0,
            failed_seen: vec![0; NODES],
            failed_this_attempt: 0,
            recreate_at: None,
            slow,
            slow_seen: SlowSeen::default(),
            learned_all: (0..NODES).all(|n| learns(seed, n)),
            late_beats: Arc::default(),
            tick_at: 0,
        };
        for n in 0..NODES {
            let mut cfg = Config { node_name: format!("gpu-{n}"), ..Config::default() };
            cfg.safety.fleet_budget = 0;
            cfg.safety.breaker_per_day = 20;
            cfg.gang.breaker_per_day = 20;
            cfg.gang.pace.enabled = true;
            if learns(seed, n) {
                // Issue 46: the members' agents learn their ranks' rhythm (a beat a tick: a
                // 15 s silence, ~66 s learned) and may restart the gang on it (~2 min into a
                // stop, not the fixed rule's 5).
                let l = &mut cfg.policy.learned;
                l.enabled = true;
                l.restarts = true;
                l.history = Duration::from_secs(60);
                l.min_samples = 5;
            }
            if mutant == Some(GangMutant::SlowLineAbovePace) {
                cfg.gang.pace.slow_fraction = 1.1;
            }
            let keys = Keys::new(&cfg.redis.key_prefix, &cfg.node_name);
            let runtime = FakeRuntime::default();
            runtime.add(&container(n, 0), &worker(0));
            super::gang_restart::slow_now_and_then(
                seed ^ ((n as u64) << 40),
                &runtime,
                container(n, 0),
                keys.status(&worker(0)),
                sim.store.clone(),
                sim.clock.clone(),
                sim.late_beats.clone(),
            );
            if sim.slow.on {
                runtime.add(&container(n, SLOW_INDEX), &worker(SLOW_INDEX));
            }
            sim.nodes.push(NodeSim {
                keys,
                runtime,
                agent: None,
                cfg,
                faulted_at: Millis::MIN / 2,
                standing_down_until: 0,
                held_until: 0,
                metrics: None,
            });
            sim.start_agent(n, false);
        }
        let now = sim.now();
        for n in 0..NODES {
            sim.add_one_for_all_member(n);
        }
        for _ in GANGS {
            sim.gangs.push(GangTruth::new(now, NODES, 41_000));
        }
        sim
    }

    fn now(&self) -> Millis {
        self.clock.now()
    }

    fn log(&mut self, line: String) {
        let t = (self.now() - DAY_START) / 1_000;
        self.trace.push(format!("t={t:>6}s {line}"));
        if self.trace.len() > 400 {
            self.trace.drain(..100);
        }
    }

    fn start_agent(&mut self, n: usize, term: bool) {
        let node = &mut self.nodes[n];
        let coord: Arc<dyn Coordinator> = Arc::new(Faulty {
            inner: self.store.clone(),
            down: self.down.clone(),
            mutant: self.mutant,
            node: node.cfg.node_name.clone(),
            read_slow: Default::default(),
        });
        let metrics = Arc::new(Metrics::new());
        node.metrics = Some(metrics.clone());
        let notifier = Notifier::new(Some(Arc::new(self.sink.clone())), metrics.clone());
        let token = CancellationToken::new();
        if term {
            token.cancel();
        }
        let agent =
            Agent::new(node.cfg.clone(), coord, Arc::new(node.runtime.clone()), notifier, metrics)
                .with_shutdown(token)
                .with_host_procfs("/nonexistent/vigil-sim-procfs");
        node.agent = Some(agent);
    }

    /// Each working member writes its record (the collective's truth decides who beats).
    async fn beats(&mut self) {
        let now = self.now();
        for (g, gang) in GANGS.iter().enumerate() {
            let beating: Vec<bool> = (0..NODES).map(|n| self.beats_now(g, n, now)).collect();
            if beating.contains(&true) {
                self.gangs[g].stepped();
            }
            let progress = format!("step-{}", self.gangs[g].step);
            for (n, beat) in beating.into_iter().enumerate() {
                if beat {
                    let key = self.nodes[n].keys.status(&worker(g));
                    let fields = vec![
                        ("state".to_string(), "processing".to_string()),
                        ("heartbeat".to_string(), vigil::coord::heartbeat_value(now)),
                        ("gang".to_string(), gang.to_string()),
                        ("gang_size".to_string(), NODES.to_string()),
                        ("progress".to_string(), progress.clone()),
                    ];
                    self.store.hset(&key, &fields, None).await.unwrap();
                    self.gangs[g].progressed_at = now;
                }
            }
            let truth = &mut self.gangs[g];
            if truth.stop_at.is_some_and(|s| truth.step >= s) {
                truth.stop_at = None;
                truth.phase = Phase::Stopped { at: now };
                truth.hung_pages = 0;
                truth.stopped_at = now;
                self.log(format!(
                    "gang {g}: the collective stops again at step {progress}, where it stopped before"
                ));
            }
        }
    }

    /// The slow gang's members write their records: every member beats, at the job's pace (its
    /// slowest member's), with each rank's compute time when the job publishes it.
    async fn slow_gang_beats(&mut self) {
        if !self.slow.on {
            return;
        }
        let now = self.now();
        let compute = self.slow.tick(NODES);
        let progress = format!("step-{}", self.slow.step);
        for (n, c) in compute.into_iter().enumerate() {
            let key = self.nodes[n].keys.status(&worker(SLOW_INDEX));
            let mut fields = vec![
                ("state".to_string(), "processing".to_string()),
                ("heartbeat".to_string(), vigil::coord::heartbeat_value(now)),
                ("gang".to_string(), SLOW_GANG.to_string()),
                ("gang_size".to_string(), NODES.to_string()),
                ("progress".to_string(), progress.clone()),
            ];
            if let Some(c) = c {
                fields.push(("compute_ms".to_string(), c.to_string()));
            }
            self.store.hset(&key, &fields, None).await.unwrap();
        }
    }

    /// The slow gang against the truth: its members never restarted (it never stops), every
    /// `slow` page (of any gang) true and naming the member that published its evidence.
    fn check_slow(&mut self, alerts: &[vigil::alerts::Alert]) -> Result<(), GangViolation> {
        let now = self.now();
        for n in 0..NODES {
            if self.nodes[n].runtime.restarts(&container(n, SLOW_INDEX)) == 0 {
                continue;
            }
            let (invariant, why) = match self.slow.slow {
                Some(s) => (
                    "never a restart for slowness",
                    format!("slowed by member {} to {} %", s.member, s.pct),
                ),
                None => ("never a moving collective", "at its pace".to_string()),
            };
            let detail =
                format!("gang c: member {n} restarted, though the job never stopped ({why})");
            return self.fail(invariant, detail);
        }
        for a in alerts.iter().filter(|a| a.gang.as_deref() == Some(SLOW_GANG)) {
            let line = format!("alert {} gang c: {}", a.kind.as_str(), a.detail);
            self.trace.push(line);
        }
        let down_until = self.down_until;
        let faulted = |n: usize, since: Millis| self.faulted_since(n, since) || down_until >= since;
        let held = |since: Millis| self.nodes.iter().any(|n| n.held_until > since);
        let mut seen = self.slow_seen;
        for a in alerts {
            let judged = self.slow.judge_page(a, now, (faulted, held), &mut seen);
            if let Err((invariant, detail)) = judged {
                return self.fail(invariant, detail);
            }
        }
        self.slow_seen = seen;
        Ok(())
    }

    fn beats_now(&self, g: usize, n: usize, now: Millis) -> bool {
        match &self.gangs[g].phase {
            Phase::Running => true,
            Phase::Straggling { member, .. } => *member != n,
            Phase::Stopped { .. } => false,
            Phase::Booting { at } => at.is_some_and(|t| now >= t),
        }
    }

    /// The seed's events for this tick.
    fn events(&mut self) {
        let now = self.now();
        self.controller_restarts(now);
        if let Some(line) = self.slow.events(now) {
            if self.slow.slow.is_some() {
                self.stats.slowdowns += 1;
            }
            self.log(line);
        }
        if self.slow.opener_crashes() {
            self.crash_opener(now);
        }
        if odds(&mut self.rng, 1, 900) {
            self.failover(now);
        }
        if odds(&mut self.rng, 1, 1200) {
            // Other workers of a node spent its breaker for the day.
            let n = self.rng.below(NODES as u64) as usize;
            let key = self.nodes[n].keys.breaker(&vigil::clock::utc_day(now));
            let store = self.store.clone();
            let cap = u64::from(self.nodes[n].cfg.safety.breaker_per_day);
            futures_util::FutureExt::now_or_never(async move {
                for _ in 0..cap {
                    let _ = store.incr_capped(&key, cap, Duration::from_secs(48 * 3600)).await;
                }
            });
            self.stats.breakers_spent += 1;
            self.nodes[n].faulted_at = now;
            self.log(format!("node {n}: its breaker is spent for the day"));
        }
        for g in 0..self.gangs.len() {
            let phase = self.gangs[g].phase.clone();
            match phase {
                Phase::Running if odds(&mut self.rng, 1, 80) => {
                    self.stats.stops += 1;
                    self.gangs[g].hung_pages = 0;
                    self.gangs[g].stopped_at = now;
                    if odds(&mut self.rng, 1, 3) {
                        let member = self.rng.below(NODES as u64) as usize;
                        let until = odds(&mut self.rng, 1, 2)
                            .then(|| now + self.rng.below(400) as Millis * 1_000);
                        self.stats.stragglers += 1;
                        self.log(format!(
                            "gang {g}: member {member} straggles (others stop at {until:?})"
                        ));
                        self.gangs[g].phase = Phase::Straggling { member, until };
                    } else {
                        self.log(format!("gang {g}: the collective stops"));
                        self.gangs[g].phase = Phase::Stopped { at: now };
                    }
                }
                Phase::Straggling { until: Some(t), .. } if now >= t => {
                    self.log(format!("gang {g}: the others block on the straggler"));
                    self.gangs[g].phase = Phase::Stopped { at: now };
                }
                Phase::Straggling { member, until: None } if odds(&mut self.rng, 1, 20) => {
                    self.log(format!("gang {g}: member {member} resumes"));
                    self.gangs[g].phase = Phase::Running;
                }
                Phase::Booting { at: Some(t) } if now >= t + 60_000 => {
                    self.gangs[g].phase = Phase::Running;
                    self.gangs[g].hung_pages = 0;
                    self.gangs[g].stopped_at = now;
                }
                _ => {}
            }
        }
        for g in 0..self.gangs.len() {
            // A person looks at a gang stuck for 45 minutes (its restarts do not help, or are
            // refused) and restarts the job, fixed: not Vigil's restart, no wave.
            let stuck = now - self.gangs[g].progressed_at > 45 * 60_000;
            if stuck && self.gangs[g].wave.is_none() && odds(&mut self.rng, 1, 40) {
                self.stats.fixed_by_people += 1;
                self.log(format!("gang {g}: a person restarts the job, fixed"));
                let back = 1 + self.rng.below(40);
                let truth = &mut self.gangs[g];
                truth.resumed(back);
                truth.stop_at = None;
                truth.phase = Phase::Booting { at: Some(now) };
            }
        }
        for n in 0..NODES {
            if odds(&mut self.rng, 1, 700) {
                self.stats.crashes += 1;
                self.log(format!("node {n}: agent crashes and comes back"));
                self.nodes[n].faulted_at = now;
                let term = now < self.nodes[n].standing_down_until;
                self.start_agent(n, term);
            }
            if odds(&mut self.rng, 1, 1500) {
                self.stats.stand_downs += 1;
                let until = now + self.rng.below(600) as Millis * 1_000;
                self.log(format!("node {n}: stands down until {}", (until - DAY_START) / 1000));
                self.nodes[n].standing_down_until = until;
                self.nodes[n].held_until = until;
                self.nodes[n].faulted_at = now;
                self.start_agent(n, true);
            } else if self.nodes[n].standing_down_until != 0
                && now >= self.nodes[n].standing_down_until
            {
                self.log(format!("node {n}: back"));
                self.nodes[n].standing_down_until = 0;
                self.nodes[n].faulted_at = now;
                self.start_agent(n, false);
            }
        }
        if !self.down.load(Ordering::SeqCst) && odds(&mut self.rng, 1, 800) {
            self.stats.outages += 1;
            self.down_until = now + self.rng.below(90) as Millis * 1_000;
            self.log("the coordinator goes away".into());
            self.down.store(true, Ordering::SeqCst);
        } else if self.down.load(Ordering::SeqCst) && now >= self.down_until {
            self.log("the coordinator is back".into());
            self.down.store(false, Ordering::SeqCst);
        }
    }

    /// The agent that opened the slow gang's episode (by its metrics), if one did, crashes and
    /// comes back.
    fn crash_opener(&mut self, now: Millis) {
        let opened = |m: &Arc<Metrics>| {
            m.encode().lines().any(|l| {
                l.strip_prefix("vigil_gang_slow_episodes_total ").is_some_and(|v| v.trim() != "0")
            })
        };
        let Some(n) = (0..NODES).find(|&n| self.nodes[n].metrics.as_ref().is_some_and(opened))
        else {
            return;
        };
        self.stats.crashes += 1;
        self.log(format!(
            "node {n}: agent crashes and comes back (it opened gang c's slow episode)"
        ));
        self.nodes[n].faulted_at = now;
        let term = now < self.nodes[n].standing_down_until;
        self.start_agent(n, term);
    }

    /// A failover to a replica that had not received the latest writes: one gang's lock,
    /// incident and decision, and every node's lock, are gone.
    fn failover(&mut self, now: Millis) {
        let g = self.rng.below(GANGS.len() as u64) as usize;
        let k = &self.nodes[0].keys;
        let mut gone =
            vec![k.gang_lock(GANGS[g]), k.gang_incident(GANGS[g]), k.gang_decision(GANGS[g])];
        gone.extend(self.nodes.iter().map(|n| n.keys.lock()));
        self.stats.failovers += 1;
        self.gangs[g].failover_at = now;
        self.log(format!("FAILOVER forgets gang {g}'s incident and decision, and the locks"));
        let store = self.store.clone();
        futures_util::FutureExt::now_or_never(async move { store.del(&gone).await })
            .expect("the in-process store answers at once")
            .expect("the in-process store deletes");
    }

    /// Member `n` of gang `g` restarted (or failed for its controller) by Vigil now: never
    /// while its collective moves, never twice in one incident.
    fn judge_restart(
        &self,
        g: usize,
        n: usize,
        now: Millis,
        cooldown: Millis,
        what: &str,
    ) -> Result<(), GangViolation> {
        let truth = &self.gangs[g];
        if matches!(truth.phase, Phase::Running | Phase::Straggling { .. }) {
            return self.fail(
                "never a moving collective",
                format!(
                    "gang {g}: member {n} {what} while the collective progressed ({:?})",
                    truth.phase
                ),
            );
        }
        if let Some(last) = truth.last_restart[n] {
            if truth.progressed_at <= last && now - last < cooldown {
                return self.fail("once per incident", format!("gang {g}: member {n} {what} again {} s after its last restart, the gang not having progressed", (now - last) / 1000));
            }
        }
        Ok(())
    }

    /// A restart of every member of gang `g` begins: never sooner after its stop than the rule
    /// allows.
    fn wave_begins(&mut self, g: usize) -> Result<(), GangViolation> {
        // Unless every member's agent learns, the fixed rule: a member silent for `stale_after`
        // and confirmed, then `restart_delay` (less two polls: the last beat a poll before the
        // stop, the looks a poll apart).
        if let (Phase::Stopped { at }, false) = (&self.gangs[g].phase, self.learned_all) {
            let p = Config::default().policy;
            let least = vigil::clock::ms(p.stale_after + p.restart_delay) - 2 * POLL_MS;
            let after = self.now() - at;
            if after < least {
                return self.fail(
                    "a gang's restart persists",
                    format!("gang {g}: restarted {} s after its collective stopped, though a member's agent holds no learned rule (the fixed rule: {} s at the least)", after / 1000, least / 1000),
                );
            }
        }
        self.gangs[g].at_wave = self.gangs[g].step;
        self.stats.gang_restarts += 1;
        Ok(())
    }

    fn faulted_since(&self, n: usize, since: Millis) -> bool {
        self.nodes[n].faulted_at >= since || self.nodes[n].standing_down_until > since
    }

    /// What the agents did since the last check, against the truth.
    fn check(&mut self) -> Result<(), GangViolation> {
        let now = self.now();
        let cooldown = vigil::clock::ms(Config::default().policy.cooldown);
        self.check_one_for_all(now, cooldown)?;
        for g in 0..self.gangs.len() {
            if g == ONE_FOR_ALL {
                continue;
            }
            for n in 0..NODES {
                let seen = self.nodes[n].runtime.restarts(&container(n, g));
                if seen == self.gangs[g].restarts[n] {
                    continue;
                }
                self.gangs[g].restarts[n] = seen;
                self.log(format!("gang {g}: member {n} restarted"));
                self.judge_restart(g, n, now, cooldown, "restarted")?;
                self.gangs[g].last_restart[n] = Some(now);
                if let Some(i) = self.gangs[g].left_out.iter().position(|m| *m == n) {
                    self.log(format!("gang {g}: member {n} completes the partial restart"));
                    self.gangs[g].left_out.remove(i);
                    // The earliest of the completions in the last four polls.
                    let recent = self.gangs[g].completed_at.filter(|t| now - t <= 4 * POLL_MS);
                    self.gangs[g].completed_at = Some(recent.map_or(now, |t| t.min(now)));
                    continue;
                }
                if self.gangs[g].wave.is_none() {
                    self.wave_begins(g)?;
                    // NB: from the tick's start, or from a left-out member's completion of the
                    // last wave up to four polls before: the new decision may be what restarted
                    // it, before its peers' agents ran (gang seed 2583: a member left out of the
                    // last wave, restarted by a new decision 1.3 s before its peers in one tick —
                    // a slow restart moves the clock — read as out of the new wave).
                    let recent =
                        self.gangs[g].completed_at.filter(|t| self.tick_at - t <= 4 * POLL_MS);
                    self.gangs[g].wave = Some(recent.map_or(self.tick_at, |t| t.min(self.tick_at)));
                    self.gangs[g].completed_at = None;
                    self.gangs[g].wave_cycles = self.cycles.clone();
                }
            }
            if let Some(w) = self.gangs[g].wave {
                let all = (0..NODES).all(|n| self.gangs[g].last_restart[n].is_some_and(|t| t >= w));
                if all {
                    self.gangs[g].wave = None;
                    self.gangs[g].left_out.clear();
                    // Whether the restart helps is the seed's choice: it resumes from its last
                    // checkpoint and trains on, or never beats again, or trains back to where it
                    // stopped and stops there again.
                    let back = 1 + self.rng.below(40);
                    self.gangs[g].resumed(back);
                    let pick = self.rng.below(4);
                    let at = (pick != 0).then(|| now + self.rng.below(120) as Millis * 1_000);
                    let stopped = self.gangs[g].at_wave;
                    self.gangs[g].stop_at = (pick == 1).then_some(stopped);
                    self.gangs[g].phase = Phase::Booting { at };
                } else {
                    // NB: a failover that forgot the decision mid-wave leaves the rest to a new
                    // incident (whose decision waits for the restarted members' cooldown).
                    let excused =
                        self.down_until >= w - POLL_MS || self.gangs[g].failover_at >= w - POLL_MS;
                    let missing: Vec<usize> = (0..NODES)
                        .filter(|n| self.gangs[g].last_restart[*n].is_none_or(|t| t < w))
                        .collect();
                    // A member's agent has four of its own cycles (two poll intervals, twice
                    // over) to carry the decision out: a slow agent that skips cycles is late, not
                    // wrong.
                    let ran = |n: usize| self.cycles[n] - self.gangs[g].wave_cycles[n];
                    // NB: faulted up to four polls before the wave: the entry the decision read
                    // holds its node's breaker as the batch before its write read it, and a slow
                    // agent skips cycles (seed 8166: its breaker spent 45 s before the wave, read
                    // as open in an entry two skipped cycles old; the member then refused).
                    let faulted = |n: usize| self.faulted_since(n, w - 4 * POLL_MS);
                    let overdue: Vec<usize> =
                        missing.iter().copied().filter(|n| !faulted(*n) && ran(*n) >= 4).collect();
                    if !excused && !overdue.is_empty() {
                        return self.fail("all or nothing", format!("gang {g}: the restart that began {} s ago left members {overdue:?} out", (now - w) / 1000));
                    }
                    let settled = missing.iter().all(|n| faulted(*n) || ran(*n) >= 4);
                    if settled || now - w > 40 * POLL_MS {
                        // A partial restart the residual window excuses: the restarted members
                        // are stuck at the rendezvous; the next incident restarts the rest.
                        self.gangs[g].wave = None;
                        self.gangs[g].left_out = missing;
                        self.gangs[g].phase = Phase::Stopped { at: now };
                    }
                }
            }
        }
        let alerts = self.sink.0.lock().unwrap().clone();
        if let Err(v) = self.check_slow(&alerts[self.seen_alerts..]) {
            self.seen_alerts = alerts.len();
            return Err(v);
        }
        for a in &alerts[self.seen_alerts..] {
            let Some(g) = a.gang.as_deref().and_then(|id| GANGS.iter().position(|x| *x == id))
            else {
                continue;
            };
            let line = format!("alert {} gang {g}: {}", a.kind.as_str(), a.detail);
            self.trace.push(line);
            match a.kind {
                AlertKind::Hung => {
                    self.gangs[g].hung_pages += 1;
                    // A failover that forgot the incident makes a new one, with its own page:
                    // more pages, never fewer.
                    let forgotten = self.gangs[g].failover_at >= self.gangs[g].stopped_at;
                    if self.gangs[g].hung_pages > 1 && !forgotten {
                        let detail =
                            format!("gang {g}: a second hung alert in one stop: {}", a.detail);
                        self.seen_alerts = alerts.len();
                        return self.fail("one page per incident", detail);
                    }
                }
                AlertKind::Restarting => {
                    if a.detail.contains("On the learned rhythm") {
                        self.stats.learned_waves += 1;
                    }
                    let max = Config::default().policy.max_fruitless_restarts;
                    if let Err(detail) = self.gangs[g].decided(max) {
                        self.seen_alerts = alerts.len();
                        let detail = format!("gang {g}: {detail}");
                        return self.fail("restarts that do not help stop", detail);
                    }
                }
                AlertKind::GangBlocked => self.stats.blocked_pages += 1,
                AlertKind::Escalation => self.stats.escalations += 1,
                AlertKind::Fruitless => {
                    self.stats.fruitless_pages += 1;
                    let max = Config::default().policy.max_fruitless_restarts;
                    if !self.gangs[g].fruitless_now(max) {
                        let t = &self.gangs[g];
                        let detail = format!(
                            "gang {g}: refused as fruitless after {} wave(s) in a row, though it got past step {:?} since: {}",
                            t.fruitless, t.past, a.detail
                        );
                        self.seen_alerts = alerts.len();
                        return self.fail("restarts that help go on", detail);
                    }
                }
                _ => {}
            }
        }
        self.seen_alerts = alerts.len();
        Ok(())
    }

    fn fail(&self, invariant: &'static str, detail: String) -> Result<(), GangViolation> {
        let mut trace = self.trace.clone();
        // The agents' own account of the gangs, from their trails.
        for (n, node) in self.nodes.iter().enumerate() {
            let store = self.store.clone();
            let key = node.keys.trail();
            let entries =
                futures_util::FutureExt::now_or_never(
                    async move { store.read_recent(&key, 200).await },
                );
            for (_, f) in entries.and_then(Result::ok).unwrap_or_default().iter().rev() {
                let code = f.get("decision").cloned().unwrap_or_default();
                let at = f.get("at").and_then(|t| t.parse::<Millis>().ok()).unwrap_or(0);
                let recent = self.now() - at < 10 * POLL_MS;
                if code.starts_with("gang") || code == "straggler" || recent {
                    let detail = f.get("detail").cloned().unwrap_or_default();
                    let w = f.get("worker").cloned().unwrap_or_default();
                    trace.push(format!(
                        "trail node {n} t={}s {w} {code}: {detail}",
                        (at - DAY_START) / 1000
                    ));
                }
            }
        }
        Err(GangViolation { invariant, detail, trace })
    }

    async fn run(&mut self) -> Result<(), GangViolation> {
        for _ in 0..TICKS {
            self.clock.advance(POLL);
            self.tick_at = self.now();
            self.events();
            self.beats().await;
            self.slow_gang_beats().await;
            let mut order: Vec<usize> = (0..NODES).collect();
            for i in (1..order.len()).rev() {
                let j = self.rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
            for n in order {
                // A slow agent skips a cycle now and then.
                if odds(&mut self.rng, 1, 10) {
                    continue;
                }
                let mut agent = self.nodes[n].agent.take().expect("an agent per node");
                let report = agent.cycle().await;
                self.cycles[n] += 1;
                self.nodes[n].agent = Some(agent);
                if let Some(e) =
                    report.coordinator_error.filter(|_| !self.down.load(Ordering::SeqCst))
                {
                    self.log(format!("node {n}: cycle failed: {e}"));
                }
                self.check()?;
            }
        }
        Ok(())
    }
}

/// Whether node `n`'s agent restarts on learned rhythms (issue 46): the odd seeds' — but in one
/// of four of them node 3's does not learn (learning off there: its members hold no learned
/// rule, and the gang is judged by the fixed rule whatever the others learned).
pub fn learns(seed: u64, n: usize) -> bool {
    let odd = !seed.is_multiple_of(2);
    let node_off = n == 3 && (seed / 2).is_multiple_of(4);
    odd && !node_off
}

/// Run one seed of the gang simulation.
pub fn run_gang_seed(seed: u64, mutant: Option<GangMutant>) -> Result<GangStats, GangViolation> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    rt.block_on(async {
        let mut sim = Sim::new(seed, mutant);
        sim.run().await?;
        sim.stats.slow_pages = sim.slow_seen.pages;
        sim.stats.slow_named = sim.slow_seen.named;
        sim.stats.late_beats = sim.late_beats.load(std::sync::atomic::Ordering::Relaxed);
        Ok(sim.stats)
    })
}

/// Seeds `first..first + count` (on every core); the totals, or the lowest failing seed.
pub fn run_gang_seeds(
    first: u64,
    count: u64,
    mutant: Option<GangMutant>,
) -> Result<GangStats, (u64, GangViolation)> {
    super::spread(first, count, |seed| run_gang_seed(seed, mutant), GangStats::add)
}

/// True with probability `k` / `n`.
fn odds(rng: &mut Rng, k: u64, n: u64) -> bool {
    rng.below(n) < k
}
