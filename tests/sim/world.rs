//! The simulated fleet: nodes sharing one coordinator and one clock, agent instances (one or two
//! per node: a rolling update), workers that hang, recover, error and boot, operators, maintenance,
//! GPUs, crashes and SIGTERM — and the seeded scheduler that decides, step by step, who moves.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use vigil::accel::gpu::model::{GpuHealth, GpuReport, GpuStatus};
use vigil::alerts::{AlertKind, Notifier};
use vigil::clock::{ms, utc_day, FakeClock, Millis};
use vigil::config::Config;
use vigil::coord::memory::MemoryCoordinator;
use vigil::coord::{heartbeat_value, Coordinator, Keys};
use vigil::cycle::agent::{Agent, CycleReport};
use vigil::metrics::Metrics;
use vigil::node::controller::{NodeFacts, SharedFacts};
use vigil::recording::RecordingSink;
use vigil::runtime::sim::FakeRuntime;
use vigil::vocab::maintenance::Phase;

use super::gate::{lock, Shared, SimCoord, SimRuntime};
use super::mutant::{Lies, Mutant};
use super::rng::Rng;
use super::truth::{apply_restart, Ctl, Faults, InstLog, Interval, Mode, NodeTruth, WorkerTruth};
use super::{Failure, Options};

/// 2026-11-30T00:00:00Z; each seed starts somewhere in that day, so some runs cross midnight.
const DAY_START: Millis = 1_796_083_200_000 - 86_400_000;
/// A step limit per seed, far above what a run needs: past it the harness itself is stuck.
const MAX_STEPS: u64 = 60_000;

type CycleFuture = Pin<Box<dyn Future<Output = (Agent, CycleReport)>>>;

struct Node {
    rt: FakeRuntime,
    facts: SharedFacts,
    gpu: watch::Sender<GpuReport>,
    gpu_rx: watch::Receiver<GpuReport>,
}

struct Inst {
    id: usize,
    node: usize,
    agent: Option<Agent>,
    cycle: Option<CycleFuture>,
    next_at: Millis,
    term: CancellationToken,
    alive: bool,
}

pub struct World {
    ctl: Shared,
    store: Arc<dyn Coordinator>,
    clock: FakeClock,
    cfg: Config,
    nodes: Vec<Node>,
    insts: Vec<Inst>,
    sink: RecordingSink,
    metrics: Arc<Metrics>,
    mutant: Option<Mutant>,
    fault_steps: u64,
    /// Alerts sent before the calm phase began.
    calm_alerts: usize,
}

/// How long a world that restarts on learned rhythms runs calm before its faults (`warm_up`).
const WARM_UP: Millis = 15_000;

/// The configuration every simulated node runs: the brief's durations scaled down so that a
/// hang, its restart, the cooldown and the breaker all happen within a few hundred steps.
fn sim_config(rng: &mut Rng) -> Config {
    let mut cfg = Config { poll_interval: Duration::from_secs(1), ..Config::default() };
    let p = &mut cfg.policy;
    p.stale_after = Duration::from_secs(4);
    p.confirm_after = Duration::from_secs(1);
    p.restart_delay = Duration::from_secs(3);
    p.error_for = Duration::from_secs(5);
    p.cooldown = Duration::from_secs(20);
    p.escalate_after = Duration::from_secs(10);
    let r = &mut cfg.runtime;
    r.log_timeout = Duration::from_secs(1);
    // NB: a stop grace of several cycles, so that a failed restart retried before its
    // backoff shows (the retry-spacing invariant).
    r.call_timeout = Duration::from_secs(1);
    r.stop_grace = Duration::from_secs(3);
    r.restart_timeout = Duration::from_secs(5);
    cfg.alerts.timeout = Duration::from_secs(1);
    cfg.alerts.attempts = 1;
    let s = &mut cfg.safety;
    s.lock_ttl = Duration::from_secs(15);
    s.breaker_per_day = rng.range(2, 6) as u32;
    s.fleet_budget = if rng.chance(300) { 0 } else { rng.range(2, 6) as u32 };
    s.fleet_window = Duration::from_secs(60);
    cfg.metadata.settle = Duration::from_secs(5);
    // 0 (no limit) now and then; else restarts that do not help stop after 1 to 3.
    cfg.policy.max_fruitless_restarts = rng.range(0, 4) as u32;
    // Half the worlds learn each worker's rhythm (issue 31, item 5), learned within seconds,
    // with a restart delay short enough that the fixed stale_after, not the delay, is what
    // holds a restart back: "restart only of a hung worker" (by the fixed rule) then checks
    // that learning moves alerts and timers, never a restart.
    if rng.chance(500) {
        let l = &mut cfg.policy.learned;
        l.enabled = true;
        l.floor = Duration::from_secs(1);
        l.min_samples = 5;
        cfg.policy.restart_delay = Duration::from_secs(1);
    }
    cfg
}

fn gpu_report(failed: bool) -> GpuReport {
    let health = if failed { GpuHealth::Failed } else { GpuHealth::Healthy };
    GpuReport {
        state: vigil::accel::gpu::model::GpuMonitorState::On,
        gpus: vec![GpuStatus { index: 0, uuid: "GPU-sim-0".into(), health, ..Default::default() }],
        node: health,
        node_reasons: Vec::new(),
        ..GpuReport::default()
    }
}

impl World {
    pub fn new(seed: u64, opts: &Options) -> World {
        let mut rng = Rng::new(seed);
        let mut cfg = sim_config(&mut rng);
        // NB: after the configuration's draws: the same nodes, budgets and limits with or
        // without learning.
        if opts.learned {
            super::learned::configure(&mut cfg);
        }
        let start = DAY_START + rng.below(86_400) as Millis * 1000;
        let clock = FakeClock::at(start);
        let store: Arc<dyn Coordinator> = Arc::new(MemoryCoordinator::new(Arc::new(clock.clone())));
        let intensity = rng.range(1, 4);
        let faults = Faults {
            coord_error: 6 * intensity,
            coord_lost_reply: 4 * intensity,
            runtime_error: 5 * intensity,
            restart_refused: 40 * intensity,
            restart_lost_reply: 40 * intensity,
            restart_slow: 60 * intensity,
            events: 12 * intensity,
        };
        let n_nodes = rng.range(1, 3) as usize;
        let ctl = Ctl {
            store: store.clone(),
            rng,
            step: 0,
            clock: clock.clone(),
            cfg: cfg.clone(),
            faults_on: true,
            faults,
            calm: false,
            workers: Vec::new(),
            nodes: Vec::new(),
            insts: Vec::new(),
            fleet_commands: Vec::new(),
            stalls: Vec::new(),
            tokens: Default::default(),
            trace: Default::default(),
            full_trace: opts.full_trace.then(Vec::new),
            tracing: opts.trace,
            violation: None,
            stats: Default::default(),
        };
        let mut w = World {
            ctl: Arc::new(std::sync::Mutex::new(ctl)),
            store,
            clock,
            cfg,
            nodes: Vec::new(),
            insts: Vec::new(),
            sink: RecordingSink::default(),
            metrics: Arc::new(Metrics::new()),
            mutant: opts.mutant,
            fault_steps: opts.fault_steps,
            calm_alerts: 0,
        };
        for n in 0..n_nodes {
            w.add_node(n);
        }
        w
    }

    fn rng(&self, n: u64) -> u64 {
        lock(&self.ctl).rng.below(n)
    }

    fn chance(&self, per_mille: u64) -> bool {
        lock(&self.ctl).rng.chance(per_mille)
    }

    fn now(&self) -> Millis {
        use vigil::clock::Clock;
        self.clock.now()
    }

    fn add_node(&mut self, n: usize) {
        let name = format!("gpu-{n}");
        let keys = Keys::new(&self.cfg.redis.key_prefix, &name);
        let (gpu, gpu_rx) = watch::channel(gpu_report(false));
        let node = Node {
            rt: FakeRuntime::default(),
            facts: Arc::new(RwLock::new(NodeFacts::default())),
            gpu,
            gpu_rx,
        };
        let workers = 1 + self.rng(2);
        for i in 0..workers {
            let (id, worker) = (format!("n{n}-c{i}"), format!("trainer-{i}"));
            node.rt.add(&id, &worker);
            let now = self.now();
            if self.cfg.policy.learned.restarts {
                // The rhythm it brings from its earlier life, in the coordinator.
                let life = super::learned::earlier_life(now);
                let ttl = Duration::from_secs(86_400);
                let _ = self.store.set(&keys.rhythm(&worker), &life, ttl).now_or_never();
            }
            let mut c = lock(&self.ctl);
            c.workers.push(WorkerTruth {
                node: n,
                worker,
                container: id,
                mode: Mode::Healthy,
                last_beat: None,
                state: "processing",
                progress: 0,
                boot_until: now,
                fixes: true,
                last_vigil_restart: None,
                beat_since_restart: false,
                beat_since_external: false,
                last_command: None,
                last_restart_paused: false,
                last_external: None,
                last_external_step: 0,
                stopped: false,
                paused: false,
                fr_count: 0,
                fr_past: 0,
            });
        }
        if self.chance(500) {
            node.rt.add_unlabelled(&format!("n{n}-sidecar"));
        }
        lock(&self.ctl).nodes.push(NodeTruth {
            name,
            keys,
            maintenance: Vec::new(),
            gpu_failed: Vec::new(),
            failovers: Vec::new(),
            commands: Vec::new(),
        });
        self.nodes.push(node);
        self.beat_all(true);
        for _ in 0..1 + self.rng(2) {
            self.add_instance(n);
        }
    }

    /// A new agent process on `node`, with empty memory.
    fn add_instance(&mut self, node: usize) {
        let id = {
            let mut c = lock(&self.ctl);
            c.insts.push(InstLog { node, ..Default::default() });
            let id = c.insts.len() - 1;
            c.log(|| format!("start instance i{id} on gpu-{node}"));
            id
        };
        let mut cfg = self.cfg.clone();
        cfg.node_name = format!("gpu-{node}");
        // A planted mutant is told to the agent by its adapters, never planted in the agent.
        let lies = Arc::new(Lies::new(self.mutant));
        let coord = Arc::new(SimCoord {
            inner: self.store.clone(),
            ctl: self.ctl.clone(),
            inst: id,
            node,
            lies: lies.clone(),
        });
        let runtime = Arc::new(SimRuntime {
            inner: self.nodes[node].rt.clone(),
            ctl: self.ctl.clone(),
            inst: id,
            lies,
        });
        let notifier = Notifier::new(Some(Arc::new(self.sink.clone())), self.metrics.clone());
        let term = CancellationToken::new();
        let agent = Agent::new(cfg, coord, runtime, notifier, self.metrics.clone())
            .with_facts(self.nodes[node].facts.clone())
            .with_gpu(self.nodes[node].gpu_rx.clone())
            .with_shutdown(term.clone());
        let next_at = self.now() + self.rng(1000) as Millis;
        self.insts.push(Inst {
            id,
            node,
            agent: Some(agent),
            cycle: None,
            next_at,
            term,
            alive: true,
        });
    }

    /// Workers write their records (straight to the store: a worker is not an agent and its
    /// writes are not faulted), and booting ones come up.
    fn beat_all(&mut self, force: bool) {
        let now = self.now();
        let mut writes = Vec::new();
        {
            let mut c = lock(&self.ctl);
            let Ctl { workers, nodes, .. } = &mut *c;
            for w in workers.iter_mut() {
                if w.mode == Mode::Booting && now >= w.boot_until {
                    w.mode = if w.fixes { Mode::Healthy } else { Mode::Hung };
                }
                if w.stopped || w.paused {
                    continue;
                }
                let state = match w.mode {
                    Mode::Healthy => "processing",
                    Mode::Errored => "error",
                    Mode::Hung | Mode::Booting => continue,
                };
                if !force && w.state == state && w.last_beat.is_some_and(|b| now - b < 500) {
                    continue;
                }
                w.state = state;
                w.last_beat = Some(now);
                w.beat_since_restart = true;
                w.beat_since_external = true;
                w.progress += 1;
                let fields = vec![
                    ("state".to_string(), state.to_string()),
                    ("heartbeat".to_string(), heartbeat_value(now)),
                    ("progress".to_string(), w.progress.to_string()),
                    ("job".to_string(), "job-sim".to_string()),
                ];
                writes.push((nodes[w.node].keys.status(&w.worker), fields));
            }
        }
        for (key, fields) in writes {
            self.store
                .hset(&key, &fields, None)
                .now_or_never()
                .expect("in-process store answers at once")
                .expect("in-process store never fails");
        }
    }

    /// Run the seed: a fault phase, then a calm one in which every hang must be resolved.
    pub fn run(mut self, seed: u64) -> Result<super::truth::Stats, Failure> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("tokio runtime");
        let _guard = rt.enter();
        if self.cfg.policy.learned.restarts {
            self.warm_up();
        }
        let until = lock(&self.ctl).step + self.fault_steps;
        while lock(&self.ctl).step < until && !self.violated() {
            self.step();
        }
        let calm = self.begin_calm();
        let calm_len = self.calm_len();
        let mut end = calm.0 + calm_len;
        let (mut waits, mut rolled) = (0, false);
        while !self.violated() {
            if self.now() >= end && !rolled && utc_day(calm.0) != utc_day(self.now()) {
                // NB: a UTC day rolled in the calm: a node breaker spent the day before (whose
                // alert excused the hang then) allows restarts again from the roll, and the
                // hang must be restarted from there, so the calm runs on for its length past
                // the roll (seed 190200: it ended 1.5 s past midnight, the restart mid-pipeline).
                rolled = true;
                let now = self.now();
                end = now - now.rem_euclid(86_400_000) + calm_len;
                continue;
            }
            if self.now() >= end {
                // A budget spent in the calm (or before it, in the window it began in) holds a
                // skipped hang until its window rolls: the calm runs on from there.
                let since = if waits == 0 { calm.0 } else { self.now() };
                match self.budget_wait(since, self.now()) {
                    Some(roll) if waits < 5 => {
                        waits += 1;
                        end = roll + calm_len;
                        continue;
                    }
                    _ => break,
                }
            }
            self.step();
            if lock(&self.ctl).step > MAX_STEPS {
                lock(&self.ctl).violate(
                    "liveness",
                    "the run did not reach the end of the calm phase within the step limit".into(),
                );
            }
        }
        if !self.violated() {
            self.check_liveness(&calm.1, calm.0);
        }
        let mut c = lock(&self.ctl);
        c.stats.steps = c.step;
        match c.violation.take() {
            None => {
                // A replay that passes prints its trace too when asked (`VIGIL_SIM_TRACE=1`).
                if std::env::var("VIGIL_SIM_TRACE").is_ok_and(|v| v == "1") {
                    for line in c.full_trace.iter().flatten() {
                        println!("{line}");
                    }
                }
                Ok(c.stats.clone())
            }
            Some(v) => Err(Failure {
                seed,
                violation: v,
                trace: c.trace.iter().cloned().collect(),
                full_trace: c.full_trace.take(),
                learned: c.cfg.policy.learned.restarts,
            }),
        }
    }

    /// A world that restarts on learned rhythms begins with its workers beating and its agents
    /// looking, without faults or events, for `WARM_UP`: long enough for each agent to learn
    /// its workers' current incarnations past their settling (`learned.min_samples` twice), so
    /// the fault phase's hangs can meet a learned rule.
    fn warm_up(&mut self) {
        lock(&self.ctl).faults_on = false;
        let end = self.now() + WARM_UP;
        while self.now() < end && !self.violated() {
            self.step();
        }
        lock(&self.ctl).faults_on = true;
    }

    fn violated(&self) -> bool {
        lock(&self.ctl).violation.is_some()
    }

    /// One step: an instance makes its next call, or the world moves.
    fn step(&mut self) {
        let now = self.now();
        let ready: Vec<usize> = (0..self.insts.len())
            .filter(|i| {
                let s = &self.insts[*i];
                s.alive && (s.cycle.is_some() || now >= s.next_at)
            })
            .collect();
        if !ready.is_empty() && self.chance(650) {
            let pick = ready[self.rng(ready.len() as u64) as usize];
            self.poll_instance(pick);
        } else {
            self.world_step();
        }
    }

    fn poll_instance(&mut self, i: usize) {
        let now = self.now();
        let poll = ms(self.cfg.poll_interval);
        let inst = &mut self.insts[i];
        if inst.cycle.is_none() {
            let Some(mut agent) = inst.agent.take() else {
                return;
            };
            inst.cycle = Some(Box::pin(async move {
                let report = agent.cycle().await;
                (agent, report)
            }));
        }
        let fut = inst.cycle.as_mut().expect("a cycle in flight");
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready((agent, report)) = fut.as_mut().poll(&mut cx) {
            inst.cycle = None;
            inst.agent = Some(agent);
            let pause = if report.coordinator_error.is_some() { 250 } else { poll };
            inst.next_at = now + pause;
            if inst.term.is_cancelled() {
                // SIGTERM: the process exits after its cycle; its replacement starts.
                inst.alive = false;
                let (id, node) = (inst.id, inst.node);
                lock(&self.ctl).log(|| format!("i{id} exits after SIGTERM"));
                self.add_instance(node);
            }
        }
    }

    fn world_step(&mut self) {
        let (events, in_flight) = {
            let c = lock(&self.ctl);
            let in_flight = self.insts.iter().any(|i| i.alive && c.insts[i.id].pending.is_some());
            if c.faults_on {
                (c.faults.events, in_flight)
            } else {
                (0, false)
            }
        };
        // NB: an agent that dies with its restart command in flight is the window the claim
        // and the cooldown exist for, and it lasts a few steps: left to the ordinary events
        // alone, a sweep of a couple of thousand seeds may never land in it. Aimed at while a
        // command is in flight (the rest of the history draws no more from the seed).
        if in_flight && self.chance(40) {
            lock(&self.ctl).step += 1;
            self.crash_instance();
            return;
        }
        if self.chance(events) {
            lock(&self.ctl).step += 1;
            self.event();
            return;
        }
        let d = self.rng(200);
        self.clock.advance(Duration::from_millis(d));
        self.beat_all(false);
    }

    /// Something happens in the world, chosen by the seed.
    fn event(&mut self) {
        let n_workers = lock(&self.ctl).workers.len() as u64;
        let w = self.rng(n_workers) as usize;
        match self.rng(15) {
            0..=2 => self.set_mode(w, Mode::Hung),
            3 | 4 => self.set_mode(w, Mode::Healthy),
            5 => self.set_mode(w, Mode::Errored),
            6 => self.external_restart(w),
            7 => self.operator_stop_or_pause(w),
            8 => self.toggle_maintenance(),
            9 => self.toggle_gpu(),
            10 => self.crash_instance(),
            11 => self.sigterm_instance(),
            12 => self.failover(),
            13 => self.stall(),
            _ => self.scale(),
        }
    }

    fn set_mode(&mut self, w: usize, mode: Mode) {
        let mut c = lock(&self.ctl);
        let t = &mut c.workers[w];
        if t.stopped || t.mode == Mode::Booting || t.mode == mode {
            return;
        }
        t.mode = mode;
        let name = t.worker.clone();
        let node = t.node;
        match mode {
            Mode::Hung => c.stats.hangs += 1,
            _ => c.stats.recoveries += 1,
        }
        c.log(|| format!("world: {name} now {mode:?}"));
        // NB: every other hang of a world that restarts on learned rhythms begins with the
        // worker's rhythm lost by the coordinator (a failover, an eviction): what an agent
        // alone remembers of it must restart nothing before the fixed rule.
        if mode == Mode::Hung && c.cfg.policy.learned.restarts && c.stats.hangs.is_multiple_of(2) {
            c.stats.rhythms_lost += 1;
            let key = c.nodes[node].keys.rhythm(&name);
            c.log(|| format!("world: the coordinator loses {key}"));
            let _ = c.store.del(&[key]).now_or_never();
        }
    }

    /// An operator's `docker restart` (or the runtime's restart policy).
    fn external_restart(&mut self, w: usize) {
        let (node, id) = {
            let c = lock(&self.ctl);
            (c.workers[w].node, c.workers[w].container.clone())
        };
        if self.restart_in_flight(&id) {
            return;
        }
        self.nodes[node].rt.restart_externally(&id);
        let now = self.now();
        let mut c = lock(&self.ctl);
        // NB: an agent can tell someone else's restart only from an incarnation it recorded
        // before: a restart before any agent saw the container is its first start to them.
        let key = c.nodes[node].keys.incarnation(&c.workers[w].worker);
        let recorded = self.store.get_many(&[key]).now_or_never();
        let seen_before = matches!(recorded, Some(Ok(v)) if v.first().is_some_and(Option::is_some));
        let step = c.step;
        let t = &mut c.workers[w];
        t.mode = Mode::Booting;
        t.boot_until = now + 2_000;
        t.fixes = true;
        t.beat_since_external = false;
        if seen_before {
            t.last_external = Some(now);
        }
        t.last_external_step = step;
        t.stopped = false;
        t.paused = false;
        c.stats.external_restarts += 1;
        c.log(|| format!("world: operator restarted {id}"));
    }

    /// A restart command issued by an instance and not yet carried out (Docker serialises
    /// operations on one container, so the operator's waits for it).
    fn restart_in_flight(&self, id: &str) -> bool {
        lock(&self.ctl).insts.iter().any(|l| l.pending.as_ref().is_some_and(|p| p.target.id == id))
    }

    fn operator_stop_or_pause(&mut self, w: usize) {
        let (node, id, paused, stopped) = {
            let c = lock(&self.ctl);
            let t = &c.workers[w];
            (t.node, t.container.clone(), t.paused, t.stopped)
        };
        if self.restart_in_flight(&id) || stopped {
            return;
        }
        let rt = &self.nodes[node].rt;
        let what = match self.rng(4) {
            0 => {
                rt.stop(&id);
                "stopped"
            }
            _ if paused => {
                rt.set_paused(&id, false);
                "unpaused"
            }
            _ => {
                rt.set_paused(&id, true);
                "paused"
            }
        };
        let mut c = lock(&self.ctl);
        let step = c.step;
        let t = &mut c.workers[w];
        t.last_external_step = step;
        match what {
            "stopped" => {
                t.stopped = true;
                c.stats.stops += 1;
            }
            "paused" => {
                t.paused = true;
                c.stats.pauses += 1;
            }
            _ => t.paused = false,
        }
        c.log(|| format!("world: operator {what} {id}"));
    }

    fn toggle_maintenance(&mut self) {
        let n = self.rng(self.nodes.len() as u64) as usize;
        let now = self.now();
        let mut f = self.nodes[n].facts.write().unwrap();
        let mut c = lock(&self.ctl);
        let step = c.step;
        if f.maintenance.phase == Phase::None {
            f.maintenance.phase =
                if c.rng.chance(500) { Phase::Ongoing } else { Phase::Terminating };
            c.nodes[n].maintenance.push(Interval { on_step: step, off: None });
            c.stats.maintenance += 1;
            c.log(|| format!("world: maintenance notice on gpu-{n}"));
        } else {
            f.maintenance.phase = Phase::None;
            f.interruption_ended = Some(now);
            if let Some(i) = c.nodes[n].maintenance.last_mut() {
                i.off = Some((step, now));
            }
            c.log(|| format!("world: maintenance over on gpu-{n}"));
        }
    }

    fn toggle_gpu(&mut self) {
        let n = self.rng(self.nodes.len() as u64) as usize;
        let now = self.now();
        let failed = self.nodes[n].gpu.borrow().node == GpuHealth::Failed;
        self.nodes[n].gpu.send_replace(gpu_report(!failed));
        let mut c = lock(&self.ctl);
        let step = c.step;
        if failed {
            if let Some(i) = c.nodes[n].gpu_failed.last_mut() {
                i.off = Some((step, now));
            }
            c.log(|| format!("world: GPU healthy again on gpu-{n}"));
        } else {
            c.nodes[n].gpu_failed.push(Interval { on_step: step, off: None });
            c.stats.gpu_failures += 1;
            c.log(|| format!("world: GPU failed on gpu-{n}"));
        }
    }

    fn alive(&self) -> Vec<usize> {
        (0..self.insts.len()).filter(|i| self.insts[*i].alive).collect()
    }

    /// An instance dies at whatever call it is at (its memory with it) and starts again.
    fn crash_instance(&mut self) {
        let alive = self.alive();
        // Half the crashes hit an instance with a restart command in flight when there is one:
        // the window is short, and the next agent must find that restart.
        let mid_restart: Vec<usize> = {
            let c = lock(&self.ctl);
            alive.iter().copied().filter(|i| c.insts[self.insts[*i].id].pending.is_some()).collect()
        };
        let i = if !mid_restart.is_empty() && self.chance(500) {
            mid_restart[self.rng(mid_restart.len() as u64) as usize]
        } else {
            alive[self.rng(alive.len() as u64) as usize]
        };
        let (id, node) = (self.insts[i].id, self.insts[i].node);
        self.insts[i].alive = false;
        self.insts[i].cycle = None;
        self.insts[i].agent = None;
        {
            let mut c = lock(&self.ctl);
            c.stats.crashes += 1;
            c.log(|| format!("world: i{id} CRASHED"));
            // A restart command already sent runs to its end without its caller.
            if let Some(p) = c.insts[id].pending.take() {
                c.stats.crashes_mid_restart += 1;
                apply_restart(&mut c, &self.nodes[node].rt, &p);
            }
        }
        self.add_instance(node);
    }

    fn sigterm_instance(&mut self) {
        let alive = self.alive();
        let i = alive[self.rng(alive.len() as u64) as usize];
        if self.insts[i].term.is_cancelled() {
            return;
        }
        self.insts[i].term.cancel();
        let id = self.insts[i].id;
        let mut c = lock(&self.ctl);
        let step = c.step;
        c.insts[id].term_step = Some(step);
        c.stats.sigterms += 1;
        c.log(|| format!("world: SIGTERM to i{id}"));
    }

    /// A failover to a replica that had not received the latest writes: every node's lock and
    /// some incident timers are gone.
    fn failover(&mut self) {
        let mut gone = Vec::new();
        {
            let mut c = lock(&self.ctl);
            let step = c.step;
            for n in 0..c.nodes.len() {
                gone.push(c.nodes[n].keys.lock());
                c.nodes[n].failovers.push(step);
            }
            for w in 0..c.workers.len() {
                if c.rng.chance(500) {
                    let t = &c.workers[w];
                    gone.push(c.nodes[t.node].keys.incident(&t.worker));
                }
            }
            c.stats.failovers += 1;
            c.log(|| format!("world: FAILOVER forgets {}", gone.join(" ")));
        }
        let _ = self.store.del(&gone).now_or_never();
    }

    /// The clock jumps: a long pause of the whole machine (or a slow call).
    fn stall(&mut self) {
        let d = 3_000 + self.rng(12_000);
        self.clock.advance(Duration::from_millis(d));
        let mut c = lock(&self.ctl);
        let step = c.step;
        c.stalls.push(step);
        c.stats.stalls += 1;
        c.log(|| format!("world: STALL +{d} ms"));
    }

    /// A rolling update: a second instance on a node, or one fewer.
    fn scale(&mut self) {
        let n = self.rng(self.nodes.len() as u64) as usize;
        let on_node: Vec<usize> =
            self.alive().into_iter().filter(|i| self.insts[*i].node == n).collect();
        if on_node.len() < 2 {
            self.add_instance(n);
        } else {
            let i = on_node[self.rng(on_node.len() as u64) as usize];
            self.insts[i].term.cancel();
            let id = self.insts[i].id;
            let mut c = lock(&self.ctl);
            let step = c.step;
            c.insts[id].term_step = Some(step);
            c.log(|| format!("world: rolling update ends i{id}"));
        }
    }

    /// Faults stop; the world is left as it is, except what a calm period undoes: maintenance
    /// ends, GPUs recover, paused containers resume. Returns when it began and the workers hung
    /// (or in error) then.
    fn begin_calm(&mut self) -> (Millis, Vec<usize>) {
        let now = self.now();
        self.calm_alerts = self.sink.0.lock().unwrap().len();
        for n in 0..self.nodes.len() {
            let on = self.nodes[n].facts.read().unwrap().maintenance.phase != Phase::None;
            if on {
                self.toggle_maintenance_of(n);
            }
            if self.nodes[n].gpu.borrow().node == GpuHealth::Failed {
                self.nodes[n].gpu.send_replace(gpu_report(false));
                let mut c = lock(&self.ctl);
                let step = c.step;
                if let Some(i) = c.nodes[n].gpu_failed.last_mut() {
                    i.off = Some((step, now));
                }
            }
        }
        let mut c = lock(&self.ctl);
        c.faults_on = false;
        c.calm = true;
        let paused: Vec<(usize, String)> =
            c.workers.iter().filter(|w| w.paused).map(|w| (w.node, w.container.clone())).collect();
        for (node, id) in paused {
            self.nodes[node].rt.set_paused(&id, false);
        }
        for w in c.workers.iter_mut() {
            w.paused = false;
        }
        let hung: Vec<usize> = (0..c.workers.len())
            .filter(|i| matches!(c.workers[*i].mode, Mode::Hung | Mode::Errored))
            .filter(|i| !c.workers[*i].stopped)
            .collect();
        c.log(|| format!("CALM from here; hung or errored: {hung:?}"));
        (now, hung)
    }

    fn toggle_maintenance_of(&mut self, n: usize) {
        let now = self.now();
        let mut f = self.nodes[n].facts.write().unwrap();
        f.maintenance.phase = Phase::None;
        f.interruption_ended = Some(now);
        let mut c = lock(&self.ctl);
        let step = c.step;
        if let Some(i) = c.nodes[n].maintenance.last_mut() {
            i.off = Some((step, now));
        }
    }

    /// Long enough for any hang to reach its restart from any state the fault phase left:
    /// maintenance settle, a cooldown, detection, the persistence delay, a stale lock's TTL,
    /// and a few cycles.
    fn calm_len(&self) -> Millis {
        let c = &self.cfg;
        let p = &c.policy;
        [
            c.metadata.settle,
            p.cooldown,
            p.stale_after,
            p.confirm_after,
            p.restart_delay,
            p.error_for,
            c.safety.lock_ttl,
            c.poll_interval * 5,
        ]
        .iter()
        .map(|d| ms(*d))
        .sum()
    }

    /// When the calm must run on to, because the fleet budget is spent in the window now in force
    /// or was in the one the calm began in: a worker skipped for the budget rightly waits for
    /// its window to roll, and the budget's one alert per window may have gone out before the
    /// calm. So the calm runs past the roll, and liveness then asks for the restart (or an alert
    /// sent in the calm) rather than excusing the hang with an old window's alert (seeds 5013596,
    /// 5042020, 5892; issue 28). `None`: neither window is spent.
    fn budget_wait(&mut self, calm_start: Millis, now: Millis) -> Option<Millis> {
        let s = &self.cfg.safety;
        if s.fleet_budget == 0 {
            return None;
        }
        let window = ms(s.fleet_window).max(1);
        let keys = Keys::new(&self.cfg.redis.key_prefix, "");
        let spent = |index: i64| {
            let used = match self.store.counter(&keys.fleet_budget(index)).now_or_never() {
                Some(Ok(n)) => n,
                _ => unreachable!("the in-process store answers at once and never fails"),
            };
            used >= u64::from(s.fleet_budget)
        };
        let (first, current) = (calm_start.div_euclid(window), now.div_euclid(window));
        if !spent(first) && !spent(current) {
            return None;
        }
        let mut c = lock(&self.ctl);
        c.stats.calm_budget_waits += 1;
        c.log(|| "CALM runs on past a spent fleet budget's window".to_string());
        Some((current + 1) * window)
    }

    /// Every worker hung when the faults stopped ended in a restart, a page, or an alert that
    /// says why automation may not act (breaker, budget).
    fn check_liveness(&mut self, hung: &[usize], calm_start: Millis) {
        let now = self.now();
        let all = self.sink.0.lock().unwrap().clone();
        let (before, alerts) = all.split_at(self.calm_alerts.min(all.len()));
        // The fruitless runs as the agents left them in the store (count, past), and each
        // worker's open incident.
        #[allow(clippy::type_complexity)]
        let runs: std::collections::HashMap<usize, (u32, u64, String)> = {
            let c = lock(&self.ctl);
            hung.iter()
                .filter_map(|&w| {
                    let t = &c.workers[w];
                    let keys = &c.nodes[t.node].keys;
                    let read = [keys.fruitless(&t.worker), keys.incident(&t.worker)];
                    let values = match self.store.get_many(&read).now_or_never() {
                        Some(Ok(v)) => v,
                        _ => unreachable!("the in-process store answers at once and never fails"),
                    };
                    let run = values[0].clone()?;
                    let mut parts = run.split(':');
                    let count = parts.next()?.parse().ok()?;
                    let past = parts.nth(2)?.parse().ok()?;
                    let incident = values[1].clone()?.split_once(':')?.1.to_string();
                    Some((w, (count, past, incident)))
                })
                .collect()
        };
        let mut c = lock(&self.ctl);
        for &w in hung {
            c.stats.liveness_checked += 1;
            let t = &c.workers[w];
            let node = c.nodes[t.node].name.clone();
            let about = |a: &&vigil::alerts::Alert| a.worker.as_deref() == Some(&t.worker);
            let on_node = |a: &&vigil::alerts::Alert| a.node == node;
            // Restarted in the calm (or by a command issued just before it that ran since).
            let resolved = !matches!(t.mode, Mode::Hung | Mode::Errored);
            if resolved || t.last_vigil_restart.is_some_and(|r| r >= calm_start) {
                continue;
            }
            let paged = alerts
                .iter()
                .filter(on_node)
                .filter(about)
                .any(|a| matches!(a.kind, AlertKind::Escalation | AlertKind::RestartFailed));
            // Restarts that did not help: the run stands (a failed restart counts in it too) and
            // this incident's page said so (maybe before the calm: it is once per incident).
            // NB: not the truth's progress: an errored worker's beats move it, and are no
            // progress to the agent.
            let max = c.cfg.policy.max_fruitless_restarts;
            let fruitless = runs.get(&w).is_some_and(|(count, _, incident)| {
                max > 0
                    && *count >= max
                    && before.iter().chain(alerts).filter(on_node).filter(about).any(|a| {
                        a.kind == AlertKind::Fruitless
                            && a.incident.as_deref() == Some(incident.as_str())
                    })
            });
            // NB: not the count of restarts that ran: a unit taken by an increment whose reply
            // was lost stays taken (fail safe), so the breaker can open before the count does.
            let today = vigil::clock::utc_day(now);
            let capped = before
                .iter()
                .chain(alerts)
                .filter(on_node)
                .any(|a| a.kind == AlertKind::BreakerOpen && a.detail.contains(&today));
            let budget = alerts.iter().any(|a| a.kind == AlertKind::BudgetExhausted);
            if paged || capped || fruitless || (budget && c.cfg.safety.fleet_budget > 0) {
                continue;
            }
            let detail = format!(
                "{} on {node} was hung or in error when faults stopped and is still {:?} after {} s of calm: no restart, no page, no breaker or budget alert",
                t.worker,
                t.mode,
                (now - calm_start) / 1000
            );
            c.violate("liveness", detail);
            return;
        }
    }
}
