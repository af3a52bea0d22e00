//! The ground truth, kept by the harness and never by the agents: what each worker really does,
//! every restart the runtime really ran, every fault and event with the step it happened at;
//! and the invariants, checked against it at every restart command and after every step.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use vigil::clock::{ms, utc_day, Clock, FakeClock, Millis};
use vigil::config::Config;
use vigil::coord::{Coordinator, Keys};
use vigil::runtime::sim::FakeRuntime;
use vigil::runtime::{Container, ContainerRuntime};

use super::rng::Rng;

/// The lock check's margin (`config::LOCK_MARGIN`): the protocol promises the lock only for this
/// long after the check; a pause past it is a deliberate lock break.
pub const LOCK_MARGIN: Millis = 5_000;

/// What a worker process is doing, as only the harness knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Beats with progress every half second.
    Healthy,
    /// Writes nothing: its heartbeat goes stale.
    Hung,
    /// Beats with `state = error`.
    Errored,
    /// Restarted: silent until `boot_until`, then healthy (or hung again when the restart did
    /// not fix it).
    Booting,
}

pub struct WorkerTruth {
    pub node: usize,
    pub worker: String,
    pub container: String,
    pub mode: Mode,
    pub last_beat: Option<Millis>,
    pub state: &'static str,
    pub progress: u64,
    pub boot_until: Millis,
    /// Whether the restart that booted it fixed it.
    pub fixes: bool,
    /// Command time of the last Vigil restart that ran.
    pub last_vigil_restart: Option<Millis>,
    /// That restart's command came after a pause longer than the lock check's margin (a
    /// deliberate break): its cooldown may have started at its claim instead.
    pub last_restart_paused: bool,
    /// Time of the last restart command by Vigil (whether or not it then ran), and whether it
    /// came after a deliberate break of the lock.
    pub last_command: Option<(Millis, bool)>,
    /// The worker beat after Vigil's last restart of it: its booting may end, and a new hang
    /// is a new incident inside the cooldown.
    pub beat_since_restart: bool,
    /// The same, after someone else's last restart of it.
    pub beat_since_external: bool,
    /// Time and step of the last restart, stop or pause by someone else.
    pub last_external: Option<Millis>,
    pub last_external_step: u64,
    /// Stopped by an operator: exited, never to be started by Vigil.
    pub stopped: bool,
    pub paused: bool,
    /// Vigil's restarts that ran in a row without the worker getting past `fr_past`, the
    /// furthest it had got at the first of them (`policy.max_fruitless_restarts`).
    pub fr_count: u32,
    pub fr_past: u64,
}

impl WorkerTruth {
    /// Whether the record, as the worker last wrote it, makes it a restart candidate at `now`:
    /// a processing worker whose heartbeat is older than `stale_after`, or one in error.
    pub fn condemnable(&self, now: Millis, cfg: &Config) -> bool {
        self.stale_past(now, ms(cfg.policy.stale_after))
    }

    /// Whether an incident may open for it at `now`: condemnable, or where the world learns
    /// rhythms (`policy.learned`), silent past the shortest silence a rhythm can teach (its
    /// floor). Its restart must still be condemnable by the fixed rule.
    pub fn suspectable(&self, now: Millis, cfg: &Config) -> bool {
        let l = &cfg.policy.learned;
        let silence = if l.enabled { ms(l.floor) } else { ms(cfg.policy.stale_after) };
        self.stale_past(now, silence)
    }

    fn stale_past(&self, now: Millis, silence: Millis) -> bool {
        match (self.state, self.last_beat) {
            ("error", Some(_)) => true,
            ("processing", Some(hb)) => now - hb > silence,
            _ => false,
        }
    }
}

/// A stand-down condition switched on at a step and maybe off again at (step, time).
pub struct Interval {
    pub on_step: u64,
    pub off: Option<(u64, Millis)>,
}

impl Interval {
    /// Whether the condition was in force at step `step` and time `at`, counting `settle` after
    /// it ended.
    fn covers(&self, step: u64, at: Millis, settle: Millis) -> bool {
        self.on_step < step
            && match self.off {
                None => true,
                Some((off_step, off_at)) => off_step > step || at - off_at < settle,
            }
    }
}

pub struct NodeTruth {
    pub name: String,
    pub keys: Keys,
    pub maintenance: Vec<Interval>,
    pub gpu_failed: Vec<Interval>,
    /// Steps at which a failover forgot this node's lock.
    pub failovers: Vec<u64>,
    /// The UTC day of every restart command on this node (the breaker's truth).
    pub commands: Vec<String>,
}

/// What one agent instance did that the invariants need, logged by its wrappers.
#[derive(Default)]
pub struct InstLog {
    pub node: usize,
    pub term_step: Option<u64>,
    /// The last lock attempt (SET NX of the node lock): step and time.
    pub lock_attempt: Option<(u64, Millis)>,
    /// The token of the lock this instance took last.
    pub lock_token: Option<String>,
    /// When it last checked the lock's TTL.
    pub lock_checked_at: Option<Millis>,
    /// Status reads since the lock attempt: worker → condemnable at the read.
    pub reads: HashMap<String, bool>,
    /// The last status read of each worker (any time): suspectable at the read.
    pub last_read: HashMap<String, bool>,
    /// The breaker day and fleet window of the units this pipeline took (from the keys it
    /// incremented): a restart counts in the day and window its unit was taken in, since a
    /// command can follow its unit across midnight or a window's end by a few round trips.
    pub breaker_unit: Option<String>,
    pub budget_unit: Option<i64>,
    /// Inspects requested since the lock attempt: container → (step, time) of the request.
    pub inspects: HashMap<String, (u64, Millis)>,
    /// A restart command issued and not yet carried out (a slow restart).
    pub pending: Option<Pending>,
}

/// A restart command on its way: the target decided on, when it was issued, and the
/// container's incarnation at that moment.
#[derive(Clone)]
pub struct Pending {
    pub target: Container,
    pub commanded: Millis,
    pub seen: Option<String>,
    /// More than the lock check's margin passed between the check and the command.
    pub paused: bool,
}

/// Fault rates, per mille per call, during the fault phase.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub coord_error: u64,
    pub coord_lost_reply: u64,
    pub runtime_error: u64,
    pub restart_refused: u64,
    pub restart_lost_reply: u64,
    pub restart_slow: u64,
    /// World events (hangs, operator actions, crashes...) per mille per world step.
    pub events: u64,
}

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub steps: u64,
    pub commands: u64,
    pub restarts: u64,
    pub refused: u64,
    pub lost_restart_replies: u64,
    pub slow_restarts: u64,
    pub coord_errors: u64,
    pub coord_lost_replies: u64,
    pub runtime_errors: u64,
    pub crashes: u64,
    pub crashes_mid_restart: u64,
    pub sigterms: u64,
    pub failovers: u64,
    pub stalls: u64,
    pub external_restarts: u64,
    pub stops: u64,
    pub pauses: u64,
    pub maintenance: u64,
    pub gpu_failures: u64,
    pub hangs: u64,
    pub recoveries: u64,
    /// Restarts that ran with the lock no longer held, after a deliberate break.
    pub broken_lock_restarts: u64,
    /// The world changed between the last check and the command (the documented windows).
    pub races: u64,
    pub liveness_checked: u64,
    /// Calms that began with the fleet budget spent, and so ran on past its window's end.
    pub calm_budget_waits: u64,
    /// Restart commands whose revalidation read was condemnable by the learned rule only
    /// (`policy.learned.restarts`: before the fixed `stale_after`).
    pub learned_restarts: u64,
    /// Hangs whose rhythm the coordinator lost as they began (a failover, an eviction).
    pub rhythms_lost: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        macro_rules! sum {
            ($($f:ident),*) => { $( self.$f += o.$f; )* };
        }
        sum!(
            steps,
            commands,
            restarts,
            refused,
            lost_restart_replies,
            slow_restarts,
            coord_errors,
            coord_lost_replies,
            runtime_errors,
            crashes,
            crashes_mid_restart,
            sigterms,
            failovers,
            stalls,
            external_restarts,
            stops,
            pauses,
            maintenance,
            gpu_failures,
            hangs,
            recoveries,
            broken_lock_restarts,
            races,
            liveness_checked,
            calm_budget_waits,
            learned_restarts,
            rhythms_lost
        );
    }
}

#[derive(Debug, Clone)]
pub struct Violation {
    /// Which invariant, in a few words (the mutant tests match on it).
    pub invariant: &'static str,
    pub detail: String,
    pub step: u64,
    pub at: Millis,
}

/// Everything the harness shares between the world and the wrappers.
pub struct Ctl {
    pub store: Arc<dyn Coordinator>,
    pub rng: Rng,
    pub step: u64,
    pub clock: FakeClock,
    pub cfg: Config,
    pub faults_on: bool,
    pub faults: Faults,
    /// In the calm phase every restart fixes its worker.
    pub calm: bool,
    pub workers: Vec<WorkerTruth>,
    pub nodes: Vec<NodeTruth>,
    pub insts: Vec<InstLog>,
    /// The fleet window of every restart command (the fleet budget's truth).
    pub fleet_commands: Vec<i64>,
    /// Steps at which the clock jumped (a pause, a slow restart): deliberate lock breaks.
    pub stalls: Vec<u64>,
    /// Lock tokens → the instance that took them.
    pub tokens: HashMap<String, usize>,
    pub trace: VecDeque<String>,
    /// Every trace line, when replaying one seed.
    pub full_trace: Option<Vec<String>>,
    /// Whether to keep a trace at all.
    pub tracing: bool,
    pub violation: Option<Violation>,
    pub stats: Stats,
}

const TRACE_KEEP: usize = 400;

impl Ctl {
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    /// Add a line to the trace (built only when a trace is kept: a bulk run keeps none, and a
    /// failing seed is run again with one).
    pub fn log(&mut self, line: impl FnOnce() -> String) {
        if !self.tracing {
            return;
        }
        let line = line();
        let line = format!("#{:<6} t+{:>7.3}s {line}", self.step, self.rel(self.now()));
        if let Some(all) = &mut self.full_trace {
            all.push(line.clone());
        }
        if self.trace.len() == TRACE_KEEP {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }

    /// Seconds since the start of the day the run began in, for readable traces.
    fn rel(&self, t: Millis) -> f64 {
        (t.rem_euclid(86_400_000)) as f64 / 1000.0
    }

    pub fn violate(&mut self, invariant: &'static str, detail: String) {
        self.log(|| format!("VIOLATION {invariant}: {detail}"));
        if self.violation.is_none() {
            self.violation = Some(Violation { invariant, detail, step: self.step, at: self.now() });
        }
    }

    pub fn worker_idx(&self, node: usize, worker: &str) -> Option<usize> {
        self.workers.iter().position(|w| w.node == node && w.worker == worker)
    }

    /// The worker a status key belongs to, on `node`.
    pub fn worker_of_status_key(&self, node: usize, key: &str) -> Option<usize> {
        let keys = &self.nodes[node].keys;
        self.workers.iter().position(|w| w.node == node && keys.status(&w.worker) == key)
    }

    /// Every check of a restart command, at the moment it is issued. Returns the command, to be
    /// carried out now or (a slow restart) later.
    pub fn check_command(&mut self, inst: usize, rt: &FakeRuntime, target: &Container) -> Pending {
        let now = self.now();
        let checked = self.insts[inst].lock_checked_at;
        let pending = Pending {
            target: target.clone(),
            commanded: now,
            seen: rt.container(&target.id).map(|c| c.started_at),
            paused: checked.is_none_or(|t| now - t > LOCK_MARGIN),
        };
        self.check_command_inner(inst, rt, target, pending.paused);
        pending
    }

    fn check_command_inner(
        &mut self,
        inst: usize,
        rt: &FakeRuntime,
        target: &Container,
        paused: bool,
    ) {
        let now = self.now();
        let node = self.insts[inst].node;
        self.stats.commands += 1;
        self.log(|| {
            format!(
                "i{inst} RESTART COMMAND {} ({}) of {}",
                target.id, target.started_at, target.worker
            )
        });
        let Some(w) = self.worker_idx(node, &target.worker) else {
            self.violate(
                "opt-in label",
                format!("restart of {} which is no worker's container", target.id),
            );
            return;
        };
        if !rt.labelled(&target.id) {
            self.violate(
                "opt-in label",
                format!("restart of {}, which lacks the opt-in label", target.id),
            );
        }
        let raced = self.check_incarnation(inst, rt, target, w);
        self.check_health(inst, w, now);
        self.check_cooldown(w, now, raced);
        self.check_retry_spacing(w, now, paused);
        let (day, window) = self.units(inst, now);
        self.check_caps(node, &day, window);
        self.check_node_state(inst, node, &target.id);
        self.check_lock(inst, node, now);
        self.nodes[node].commands.push(day);
        self.fleet_commands.push(window);
    }

    /// The point the instance last looked before the command: its inspect after the lock
    /// attempt (compare-and-restart), else the lock attempt itself.
    fn last_look(&self, inst: usize, container: &str) -> (u64, Millis) {
        let l = &self.insts[inst];
        l.inspects.get(container).copied().or(l.lock_attempt).unwrap_or((0, 0))
    }

    /// True when someone else acted on the container inside the window between the last
    /// compare and the command (the documented window of two runtime calls).
    fn check_incarnation(
        &mut self,
        inst: usize,
        rt: &FakeRuntime,
        target: &Container,
        w: usize,
    ) -> bool {
        let actual = rt.container(&target.id);
        let ok = matches!(&actual, Some(a)
            if a.started_at == target.started_at && a.running && !a.paused);
        if ok {
            return false;
        }
        let looked = self.insts[inst].inspects.get(&target.id).copied();
        if looked.is_some_and(|(step, _)| self.workers[w].last_external_step > step) {
            self.stats.races += 1;
            return true;
        }
        let what = match &actual {
            None => "a container that no longer exists".to_string(),
            Some(a) if a.started_at != target.started_at => {
                format!("incarnation {} while {} was decided on", a.started_at, target.started_at)
            }
            Some(a) if a.paused => "a paused container".into(),
            Some(_) => "a stopped container".into(),
        };
        self.violate(
            "compare-and-restart",
            format!("restart command for {} hits {what}", target.id),
        );
        false
    }

    fn check_health(&mut self, inst: usize, w: usize, now: Millis) {
        let cfg = self.cfg.clone();
        let worker = self.workers[w].worker.clone();
        let condemnable_now = self.condemnable(w, now);
        match self.insts[inst].reads.get(&worker).copied() {
            Some(true) if !condemnable_now => self.stats.races += 1,
            Some(true) if !self.workers[w].condemnable(now, &cfg) => {
                self.stats.learned_restarts += 1
            }
            Some(true) => {}
            Some(false) => self.violate(
                "restart only of a hung worker",
                format!("{worker}: the revalidation read showed it fresh, and it was restarted"),
            ),
            None if !condemnable_now => self.violate(
                "restart only of a hung worker",
                format!(
                    "{worker} was healthy at the command (mode {:?}) and no revalidation read came after the decision",
                    self.workers[w].mode
                ),
            ),
            None => {}
        }
    }

    /// No restart inside the cooldown of the last one — unless the restarted worker beat
    /// since (issue 27: booting ends at the first beat, and what hangs after it is new).
    fn check_cooldown(&mut self, w: usize, now: Millis, raced: bool) {
        let cooldown = ms(self.cfg.policy.cooldown);
        let t = &self.workers[w];
        let paused = t.last_restart_paused;
        let booted = t.beat_since_restart;
        if let Some(last) = t.last_vigil_restart.filter(|l| !booted && now - l < cooldown) {
            if paused {
                self.stats.races += 1;
                return;
            }
            let detail = format!(
                "{}: restarted {} ms after the previous restart (cooldown {} ms)",
                t.worker,
                now - last,
                cooldown
            );
            self.violate("cooldown", detail);
        } else if let Some(ext) =
            t.last_external.filter(|e| !raced && !t.beat_since_external && now - e < cooldown)
        {
            let detail = format!(
                "{}: restarted {} ms after someone else's restart: an operator's restart gets a full cooldown",
                t.worker,
                now - ext
            );
            self.violate("cooldown", detail);
        }
    }

    /// Every command takes a breaker unit, and a worker that ignores SIGTERM takes the whole
    /// stop grace to stop: no worker's commands (so no incident's units) come closer than one
    /// stop grace, whatever failed in between. Commands past a deliberately broken lock are
    /// the documented race.
    fn check_retry_spacing(&mut self, w: usize, now: Millis, paused: bool) {
        let grace = ms(self.cfg.runtime.stop_grace);
        let t = &mut self.workers[w];
        let last = t.last_command.replace((now, paused));
        let Some((at, was_paused)) = last.filter(|(at, _)| now - at < grace) else {
            return;
        };
        if paused || was_paused {
            self.stats.races += 1;
            return;
        }
        let detail = format!(
            "{}: restart command {} ms after the previous one (stop grace {grace} ms): a second breaker unit within one stop grace",
            t.worker,
            now - at
        );
        self.violate("retry spacing", detail);
    }

    /// The day and window this command counts in: those of its units, else its own time's.
    fn units(&self, inst: usize, now: Millis) -> (String, i64) {
        let l = &self.insts[inst];
        let window = now.div_euclid(ms(self.cfg.safety.fleet_window));
        (l.breaker_unit.clone().unwrap_or_else(|| utc_day(now)), l.budget_unit.unwrap_or(window))
    }

    fn check_caps(&mut self, node: usize, day: &str, this: i64) {
        let s = self.cfg.safety.clone();
        let today = self.nodes[node].commands.iter().filter(|d| *d == day).count();
        if today + 1 > s.breaker_per_day as usize {
            let detail = format!(
                "node {}: restart {} today (UTC {day}), breaker_per_day {}",
                self.nodes[node].name,
                today + 1,
                s.breaker_per_day
            );
            self.violate("breaker", detail);
        }
        if s.fleet_budget > 0 {
            let used = self.fleet_commands.iter().filter(|w| **w == this).count();
            if used + 1 > s.fleet_budget as usize {
                let detail = format!(
                    "restart {} in this fleet window, fleet_budget {}",
                    used + 1,
                    s.fleet_budget
                );
                self.violate("fleet budget", detail);
            }
        }
    }

    fn check_node_state(&mut self, inst: usize, node: usize, container: &str) {
        let (step, at) = self.last_look(inst, container);
        let settle = ms(self.cfg.metadata.settle);
        let n = &self.nodes[node];
        let why = if n.maintenance.iter().any(|i| i.covers(step, at, settle)) {
            Some("the node was in maintenance (or its settle period)")
        } else if n.gpu_failed.iter().any(|i| i.covers(step, at, 0)) {
            Some("the worker's GPU had failed")
        } else if self.insts[inst].term_step.is_some_and(|t| t < step) {
            Some("the agent had received SIGTERM")
        } else {
            None
        };
        if let Some(why) = why {
            self.violate(
                "no restart in maintenance, on a failed GPU, or at shutdown",
                format!("i{inst} restarted {container} although {why} before its last check"),
            );
        }
    }

    fn check_lock(&mut self, inst: usize, node: usize, now: Millis) {
        let key = self.nodes[node].keys.lock();
        let holder = self.lock_holder(&key);
        let l = &self.insts[inst];
        if holder.is_some() && holder == l.lock_token {
            return;
        }
        let since = l.lock_attempt.map_or(0, |(s, _)| s);
        let broken = self.nodes[node].failovers.iter().any(|s| *s > since)
            || self.stalls.iter().any(|s| *s > since)
            || l.lock_checked_at.is_none_or(|t| now - t > LOCK_MARGIN);
        if broken {
            // Deliberately broken: compare-and-restart and the cooldown claim must still hold
            // (checked by the incarnation and cooldown invariants).
            self.stats.broken_lock_restarts += 1;
            return;
        }
        let held_by = holder
            .as_ref()
            .and_then(|t| self.tokens.get(t))
            .map_or("nobody".to_string(), |i| format!("i{i}"));
        self.violate(
            "lock held at the command",
            format!("i{inst} ran a restart while the node lock was held by {held_by}"),
        );
    }

    /// The lock's value in the store right now.
    pub fn lock_holder(&self, key: &str) -> Option<String> {
        let read = self.store.get_many(&[key.to_string()]).now_or_never();
        read.and_then(Result::ok).and_then(|mut v| v.pop()).flatten()
    }
}

/// The restart really runs (at the command, or later for a slow one): the runtime's truth.
/// A restart of an incarnation other than the one the command found can only be another
/// restart that ran in between (the world leaves a container with a command in flight alone).
pub fn apply_restart(ctl: &mut Ctl, rt: &FakeRuntime, p: &Pending) {
    let (target, commanded) = (&p.target, p.commanded);
    let actual = rt.container(&target.id).map(|a| a.started_at);
    if actual != p.seen {
        let detail = format!(
            "{} restarted twice: it is incarnation {} now, the command found {}",
            target.id,
            actual.unwrap_or_default(),
            p.seen.clone().unwrap_or_default()
        );
        ctl.violate("one restart per incarnation", detail);
    }
    let _ = rt
        .restart(target, Duration::from_secs(1))
        .now_or_never()
        .expect("the simulated runtime answers at once");
    ctl.stats.restarts += 1;
    let boot = ctl.rng.range(500, 6_000) as Millis;
    let fixes = ctl.calm || ctl.rng.chance(700);
    let now = ctl.now();
    let new = rt.container(&target.id).map(|c| c.started_at).unwrap_or_default();
    ctl.log(|| format!("runtime: {} restarted, now {new}", target.id));
    check_fruitless(ctl, &target.id);
    if let Some(w) = ctl.workers.iter_mut().find(|w| w.container == target.id) {
        w.mode = Mode::Booting;
        w.boot_until = now + boot;
        w.fixes = fixes;
        w.last_vigil_restart = Some(commanded);
        w.beat_since_restart = false;
        w.last_restart_paused = p.paused;
        w.paused = false;
        w.stopped = false;
    }
}

/// A restart that runs must not be one more than `policy.max_fruitless_restarts` in a row
/// without the worker getting past where it stopped (its progress, as it wrote it). Counts it.
fn check_fruitless(ctl: &mut Ctl, container: &str) {
    let max = ctl.cfg.policy.max_fruitless_restarts;
    let Some(i) = ctl.workers.iter().position(|w| w.container == container) else {
        return;
    };
    let w = &mut ctl.workers[i];
    if w.fr_count > 0 && w.progress > w.fr_past {
        w.fr_count = 0;
    }
    let (count, past, worker) = (w.fr_count, w.fr_past, w.worker.clone());
    w.fr_past = if count == 0 { w.progress } else { past.max(w.progress) };
    w.fr_count += 1;
    if max > 0 && count >= max {
        ctl.violate(
            "fruitless restarts",
            format!("{worker} restarted after {count} restarts in a row brought no progress past {past}"),
        );
    }
}
