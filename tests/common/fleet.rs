//! One fleet for the in-process suites (issue 43, item 4): one clock, one coordinator (the
//! in-process one, switchable off like a Redis outage), one alert sink, and nodes — each with its
//! config, keys, fake runtime and one agent or more (two instances on one node: a rolling
//! update), and, asked for, its maintenance controller writing a recording Node API. Built by
//! [`Fleet::builder`]; driven one poll interval at a time ([`Fleet::tick`]) on the fake clock, or
//! in real time on the system clock for the suites whose controllers wait on real time.
//!
//! The suites keep only what is theirs: what a worker writes (a gang's rank, a container of
//! several ranks) and their assertions. tests/scenarios.rs, tests/gang.rs,
//! tests/gang_checkpoint.rs, tests/maintenance.rs, tests/gpu_agent.rs and tests/cri.rs (its
//! agents on the private containerd) stand on it. The simulation keeps its own world: it
//! interleaves the agents' coordinator calls under a seeded scheduler, with faulty and mutant
//! adapters the fleet has no use for.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use vigil::alerts::Notifier;
use vigil::clock::{Clock, FakeClock, Millis, SystemClock};
use vigil::config::Config;
use vigil::coord::memory::MemoryCoordinator;
use vigil::coord::{Coordinator, Keys};
use vigil::cycle::agent::{Agent, CycleReport};
use vigil::metrics::Metrics;
use vigil::node::controller::{Controller, SharedFacts};
use vigil::runtime::ContainerRuntime;

use super::fakes::{FakeRuntime, RecordingNodeApi, RecordingSink, Switchable};
use super::wiring::{node_config, trail_decisions, write_record};

/// 2026-11-30T00:00:00Z: a fleet on the fake clock starts at the beginning of a UTC day.
pub const DAY_START: Millis = 1_796_083_200_000 - 86_400_000;

/// A config tweak, told the node's index.
type Tweak = Box<dyn Fn(usize, &mut Config)>;

/// How a fleet is built: see [`Fleet::builder`].
pub struct Builder {
    names: Vec<String>,
    agents_per_node: usize,
    tweak: Tweak,
    poll: Duration,
    system_clock: bool,
    controllers: bool,
    alerts: bool,
    validate: bool,
    start: Millis,
    runtime: Option<Arc<dyn ContainerRuntime>>,
}

impl Builder {
    /// `n` nodes, `gpu-0` … `gpu-{n-1}`.
    pub fn nodes(mut self, n: usize) -> Builder {
        self.names = (0..n).map(|i| format!("gpu-{i}")).collect();
        self
    }

    /// One node of this name.
    pub fn node(mut self, name: &str) -> Builder {
        self.names = vec![name.to_string()];
        self
    }

    /// `n` agents on each node, sharing its runtime (a rolling update).
    pub fn agents_per_node(mut self, n: usize) -> Builder {
        self.agents_per_node = n;
        self
    }

    /// Each node's config from the defaults, then `tweak(index, cfg)`; validated (unless
    /// [`Builder::unvalidated`]).
    pub fn config(mut self, tweak: impl Fn(usize, &mut Config) + 'static) -> Builder {
        self.tweak = Box::new(tweak);
        self
    }

    /// How far [`Fleet::tick`] moves the fake clock (15 s unless told).
    pub fn poll(mut self, d: Duration) -> Builder {
        self.poll = d;
        self
    }

    /// The system clock instead of the fake one: for controllers that wait in real time.
    pub fn system_clock(mut self) -> Builder {
        self.system_clock = true;
        self
    }

    /// A maintenance controller on each node, writing a recording Node API.
    pub fn controllers(mut self) -> Builder {
        self.controllers = true;
        self
    }

    /// Configs not validated: for a suite that compresses durations below what an operator
    /// may set (a GPU sampled every 50 ms).
    pub fn unvalidated(mut self) -> Builder {
        self.validate = false;
        self
    }

    /// The fake clock starts at `at` (the start of a UTC day unless told).
    pub fn start_at(mut self, at: Millis) -> Builder {
        self.start = at;
        self
    }

    /// Every agent and controller on this runtime (a real one: containerd through CRI) instead
    /// of its node's fake one ([`Node::runtime`] is then unused).
    pub fn runtime(mut self, rt: Arc<dyn ContainerRuntime>) -> Builder {
        self.runtime = Some(rt);
        self
    }

    /// No alert sink (the agents' pages go nowhere).
    pub fn without_alerts(mut self) -> Builder {
        self.alerts = false;
        self
    }

    pub fn build(self) -> Fleet {
        let clock = FakeClock::at(self.start);
        let time: Arc<dyn Clock> = match self.system_clock {
            true => Arc::new(SystemClock),
            false => Arc::new(clock.clone()),
        };
        let store: Arc<dyn Coordinator> = Arc::new(MemoryCoordinator::new(time.clone()));
        let mut fleet = Fleet {
            clock,
            fake: !self.system_clock,
            time,
            store,
            sink: RecordingSink::default(),
            down: Arc::new(AtomicBool::new(false)),
            blips: Default::default(),
            nodes: Vec::new(),
            poll: self.poll,
        };
        for (i, name) in self.names.iter().enumerate() {
            let mut cfg = node_config(name);
            (self.tweak)(i, &mut cfg);
            if self.validate {
                cfg.validate().expect("the fleet's config is valid");
            }
            let node = fleet.node(cfg, &self);
            fleet.nodes.push(node);
        }
        fleet
    }
}

/// A node of the fleet.
pub struct Node {
    pub cfg: Config,
    pub keys: Keys,
    /// Its fake runtime (unused on a fleet built with [`Builder::runtime`]).
    pub runtime: FakeRuntime,
    /// The runtime its agents and controller use: the fake one, or the builder's.
    rt: Arc<dyn ContainerRuntime>,
    pub agents: Vec<Agent>,
    /// Its maintenance controller and the Node it writes (with [`Builder::controllers`]).
    pub controller: Option<Controller>,
    pub node_api: RecordingNodeApi,
    /// The metrics its first agent and its controller share.
    pub metrics: Arc<Metrics>,
    /// The maintenance facts its controller writes and its first agent reads.
    pub facts: SharedFacts,
    /// Its agents run their cycles (false: they are silent, as when the node is gone).
    pub alive: bool,
}

impl Node {
    /// Its maintenance controller (a fleet built with [`Builder::controllers`]).
    pub fn controller(&mut self) -> &mut Controller {
        self.controller.as_mut().expect("a fleet built with controllers()")
    }
}

/// Where the fleet's agents read the host's pressure: nowhere (a deterministic fleet).
const NO_PROCFS: &str = "/nonexistent/vigil-fleet-procfs";

pub struct Fleet {
    /// The fake clock (moved by [`Fleet::tick`]; unused on the system clock).
    pub clock: FakeClock,
    fake: bool,
    time: Arc<dyn Clock>,
    pub store: Arc<dyn Coordinator>,
    pub sink: RecordingSink,
    /// While set, every agent's coordinator fails (a Redis outage).
    pub down: Arc<AtomicBool>,
    /// Writes that fail once (see `Switchable::blips`): [`Fleet::blip`].
    pub blips: Arc<std::sync::Mutex<Vec<String>>>,
    pub nodes: Vec<Node>,
    poll: Duration,
}

impl Fleet {
    pub fn builder() -> Builder {
        Builder {
            names: vec!["gpu-1".to_string()],
            agents_per_node: 1,
            tweak: Box::new(|_, _| {}),
            poll: Duration::from_secs(15),
            system_clock: false,
            controllers: false,
            alerts: true,
            validate: true,
            start: DAY_START,
            runtime: None,
        }
    }

    /// The next SET NX or capped increment of a key holding `part` fails, unanswered (see
    /// `Switchable::blips` for `set:` and `landed:`).
    pub fn blip(&self, part: &str) {
        self.blips.lock().unwrap().push(part.to_string());
    }

    fn node(&self, cfg: Config, b: &Builder) -> Node {
        let runtime = FakeRuntime::default();
        let rt: Arc<dyn ContainerRuntime> = match &b.runtime {
            Some(rt) => rt.clone(),
            None => Arc::new(runtime.clone()),
        };
        let mut node = Node {
            keys: Keys::new(&cfg.redis.key_prefix, &cfg.node_name),
            runtime,
            rt,
            agents: Vec::new(),
            controller: None,
            node_api: RecordingNodeApi::default(),
            metrics: Arc::new(Metrics::new()),
            facts: SharedFacts::default(),
            alive: true,
            cfg,
        };
        for i in 0..b.agents_per_node {
            let metrics = match i {
                0 => node.metrics.clone(),
                _ => Arc::new(Metrics::new()),
            };
            let agent = self.new_agent(node.cfg.clone(), node.rt.clone(), b.alerts, metrics);
            node.agents.push(agent);
        }
        if b.controllers {
            // The controller writes the facts its node's first agent reads, into its trail.
            let (slow_tx, slow_rx) = tokio::sync::watch::channel(Default::default());
            let agent =
                node.agents.remove(0).with_facts(node.facts.clone()).with_slow_named(slow_tx);
            let controller = Controller::new(
                node.cfg.clone(),
                self.store.clone(),
                node.rt.clone(),
                node.metrics.clone(),
                agent.trail(),
            )
            .with_node_api(Arc::new(node.node_api.clone()))
            .with_facts(node.facts.clone())
            .with_slow_named(slow_rx)
            .with_dry_run(agent.dry_run());
            node.agents.insert(0, agent);
            node.controller = Some(controller);
        }
        node
    }

    /// An agent on `cfg` and `runtime`, through the fleet's (switchable) coordinator, paging
    /// the fleet's sink when `alerts`, counting in `metrics`.
    fn new_agent(
        &self,
        cfg: Config,
        runtime: Arc<dyn ContainerRuntime>,
        alerts: bool,
        metrics: Arc<Metrics>,
    ) -> Agent {
        let coord: Arc<dyn Coordinator> = Arc::new(Switchable {
            inner: self.store.clone(),
            down: self.down.clone(),
            blips: self.blips.clone(),
        });
        let sink = alerts.then(|| Arc::new(self.sink.clone()) as _);
        let notifier = Notifier::new(sink, metrics.clone());
        // NB: the fleet's nodes share this machine, whose pressure is no node's own: none read.
        Agent::new(cfg, coord, runtime, notifier, metrics).with_host_procfs(NO_PROCFS)
    }

    /// Another agent on node `i` (a rolling update's new instance), with its own config.
    pub fn add_agent(&mut self, i: usize, cfg: Config) {
        let metrics = Arc::new(Metrics::new());
        let agent = self.new_agent(cfg, self.nodes[i].rt.clone(), true, metrics);
        self.nodes[i].agents.push(agent);
    }

    /// Node `i`'s agents restarted (a rolling update, a crash): one new agent on its config,
    /// remembering nothing, counting in new metrics (the node's `metrics` from now on).
    pub fn restart_agents(&mut self, i: usize) {
        let metrics = Arc::new(Metrics::new());
        let (cfg, rt) = (self.nodes[i].cfg.clone(), self.nodes[i].rt.clone());
        let agent = self.new_agent(cfg, rt, true, metrics.clone());
        let node = &mut self.nodes[i];
        node.agents = vec![agent];
        node.metrics = metrics;
    }

    /// The coordinator's clock.
    pub fn now(&self) -> Millis {
        self.time.now()
    }

    /// One poll interval on the fake clock, then one cycle of every agent of every live node,
    /// node by node: their reports, in that order.
    pub async fn tick(&mut self) -> Vec<CycleReport> {
        if self.fake {
            self.clock.advance(self.poll);
        }
        let mut out = Vec::new();
        for node in self.nodes.iter_mut().filter(|n| n.alive) {
            for a in node.agents.iter_mut() {
                out.push(a.cycle().await);
            }
        }
        out
    }

    /// Tick until `d` has passed on the coordinator's clock.
    pub async fn run_for(&mut self, d: Duration) {
        let end = self.now() + d.as_millis() as Millis;
        while self.now() < end {
            self.tick().await;
        }
    }

    /// Worker `worker` of node `i` writes its record: `state`, a heartbeat stamped `at`, and
    /// `fields`.
    pub async fn write(
        &self,
        i: usize,
        worker: &str,
        state: &str,
        at: Millis,
        fields: &[(&str, &str)],
    ) {
        let key = self.nodes[i].keys.status(worker);
        write_record(self.store.as_ref(), &key, state, at, fields).await;
    }

    /// A key's value, if any.
    pub async fn get(&self, key: &str) -> Option<String> {
        let mut v = self.store.get_many(&[key.to_string()]).await.unwrap();
        v.pop().flatten()
    }

    /// A counter's value (0 when absent).
    pub async fn counter(&self, key: &str) -> u64 {
        self.store.counter(key).await.unwrap()
    }

    /// Node `i`'s trail: its decisions, oldest first.
    pub async fn decisions(&self, i: usize) -> Vec<String> {
        trail_decisions(self.store.as_ref(), &self.nodes[i].keys).await
    }
}
