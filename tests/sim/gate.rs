//! The agents' view of the world: the in-process coordinator and the simulated runtime behind a
//! gate at every call. A call first yields to the scheduler; when the scheduler picks this
//! instance again, the call runs — as one atomic step, with the fault the seed decides (an error,
//! or a write applied with its reply lost) — and the instance runs on to its next call. So the
//! scheduler interleaves the instances at every coordinator and runtime call.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use vigil::clock::{ms, Millis};
use vigil::coord::{
    read_workers_by_parts, CoordError, Coordinator, Op, Reply, Request, TrailEntry,
};
use vigil::runtime::sim::FakeRuntime;
use vigil::runtime::{Container, ContainerRuntime, RuntimeError};

use super::hgetall_many_by_parts;
use super::mutant::{Lies, Told};
use super::truth::{apply_restart, Ctl};

/// Pending once, ready the next time it is polled.
#[derive(Default)]
pub struct Gate(bool);

impl Future for Gate {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

pub type Shared = Arc<Mutex<Ctl>>;

pub fn lock(ctl: &Shared) -> std::sync::MutexGuard<'_, Ctl> {
    ctl.lock().unwrap_or_else(|p| p.into_inner())
}

/// The answer an instance gets, the lie (if any) noted in the trace.
fn told<T>(ctl: &Shared, inst: usize, (answer, lie): Told<T>) -> T {
    if let Some(lie) = lie {
        lock(ctl).log(|| format!("i{inst}   planted mutant: {lie}"));
    }
    answer
}

/// What the seed decided for one coordinator call.
#[derive(PartialEq)]
enum Fate {
    Ok,
    /// Not applied; the caller sees a timeout.
    Fail,
    /// Applied; the reply is lost and the caller sees a timeout.
    LoseReply,
}

fn timeout() -> CoordError {
    CoordError::Timeout { addr: "sim".into(), timeout: Duration::from_secs(1) }
}

/// One agent instance's coordinator.
pub struct SimCoord {
    pub inner: Arc<dyn Coordinator>,
    pub ctl: Shared,
    pub inst: usize,
    pub node: usize,
    /// The planted mutant's lies to this instance (shared with its runtime).
    pub lies: Arc<Lies>,
}

impl SimCoord {
    /// Yield to the scheduler, then decide this call's fate.
    async fn enter(&self, op: &str, key: &str, write: bool) -> Fate {
        Gate::default().await;
        let mut c = lock(&self.ctl);
        c.step += 1;
        let f = c.faults;
        let fate = if !c.faults_on {
            Fate::Ok
        } else if c.rng.chance(f.coord_error) {
            c.stats.coord_errors += 1;
            Fate::Fail
        } else if write && c.rng.chance(f.coord_lost_reply) {
            c.stats.coord_lost_replies += 1;
            Fate::LoseReply
        } else {
            Fate::Ok
        };
        let tag = match fate {
            Fate::Ok => "",
            Fate::Fail => " -> ERROR (not applied)",
            Fate::LoseReply => " -> applied, REPLY LOST",
        };
        c.log(|| format!("i{} {op} {key}{tag}", self.inst));
        fate
    }

    /// Run `call` unless the fate says it failed; lose its reply if the fate says so.
    async fn around<T>(
        &self,
        op: &str,
        key: &str,
        write: bool,
        call: impl Future<Output = Result<T, CoordError>> + Send,
    ) -> Result<T, CoordError> {
        match self.enter(op, key, write).await {
            Fate::Fail => Err(timeout()),
            Fate::Ok => call.await,
            Fate::LoseReply => {
                let _ = call.await;
                Err(timeout())
            }
        }
    }

    fn is_lock(&self, key: &str) -> bool {
        lock(&self.ctl).nodes[self.node].keys.lock() == key
    }

    fn is_breaker(&self, key: &str) -> bool {
        let c = lock(&self.ctl);
        key.starts_with(&c.nodes[self.node].keys.breaker(""))
    }

    fn told<T>(&self, t: Told<T>) -> T {
        told(&self.ctl, self.inst, t)
    }
}

#[async_trait]
impl Coordinator for SimCoord {
    fn describe(&self) -> String {
        "simulated coordinator".into()
    }
    /// Each request as one gated step (a batch: one per op); the worker read and the many-hash
    /// read as their parts, each gated, as a backend without scripts would send them.
    async fn execute(&self, request: Request) -> Result<Reply, CoordError> {
        Ok(match request {
            Request::Time => Reply::Time(self.time().await?),
            Request::GetMany(keys) => Reply::Values(self.get_many(&keys).await?),
            Request::SetNx { key, value, ttl } => {
                Reply::Done(self.set_nx(&key, &value, ttl).await?)
            }
            Request::Del(keys) => {
                self.del(&keys).await?;
                Reply::Ok
            }
            Request::OwnerTtl { key, token } => Reply::Ttl(self.owner_ttl(&key, &token).await?),
            Request::DelIfOwner { key, token } => {
                Reply::Done(self.del_if_owner(&key, &token).await?)
            }
            Request::RenewIfOwner { key, token, ttl } => {
                Reply::Done(self.renew_if_owner(&key, &token, ttl).await?)
            }
            Request::HdelIfEqual { key, fields } => {
                let store = self.store().hdel_if_equal(&key, &fields);
                Reply::Removed(self.around("HDEL IF EQUAL", &key, true, store).await?)
            }
            Request::IncrCapped { key, cap, ttl } => {
                Reply::Taken(self.incr_capped(&key, cap, ttl).await?)
            }
            Request::Decr(key) => {
                self.decr(&key).await?;
                Reply::Ok
            }
            Request::Hgetall(key) => Reply::Hash(self.hgetall(&key).await?),
            Request::Hget { key, field } => {
                let store = self.store().hget(&key, &field);
                Reply::Values(vec![self.around("HGET", &key, false, store).await?])
            }
            Request::HgetallMany(keys) => Reply::Hashes(hgetall_many_by_parts(self, &keys).await?),
            Request::Append { key, fields, max_len } => {
                self.append(&key, &fields, max_len).await?;
                Reply::Ok
            }
            Request::ReadRecent { key, count } => {
                Reply::Entries(self.read_recent(&key, count).await?)
            }
            Request::IndexMembers(key) => Reply::Members(self.index_members(&key).await?),
            Request::Batch(ops) => Reply::Counters(self.batch(&ops).await?),
            Request::ReadWorkers(workers) => {
                Reply::Workers(read_workers_by_parts(self, &workers).await?)
            }
        })
    }
}

/// The gated requests, each passed to the in-process store.
impl SimCoord {
    fn store(&self) -> &dyn Coordinator {
        &*self.inner
    }
    async fn time(&self) -> Result<Millis, CoordError> {
        self.around("TIME", "", false, self.store().time()).await
    }
    async fn get_many(&self, keys: &[String]) -> Result<Vec<Option<String>>, CoordError> {
        let first = keys.first().cloned().unwrap_or_default();
        let r = self.around("MGET", &first, false, self.store().get_many(keys)).await;
        let retry = |k: &str| {
            let c = lock(&self.ctl);
            let keys = &c.nodes[self.node].keys;
            c.workers.iter().any(|w| w.node == self.node && keys.retry(&w.worker) == k)
        };
        let cooldown = |k: &str| {
            let c = lock(&self.ctl);
            let keys = &c.nodes[self.node].keys;
            c.workers.iter().any(|w| w.node == self.node && keys.cooldown(&w.worker) == k)
        };
        self.told(self.lies.get_many(keys, retry, cooldown, r))
    }
    async fn set_nx(&self, key: &str, value: &str, ttl: Duration) -> Result<bool, CoordError> {
        let is_lock = self.is_lock(key);
        let r = self.around("SET NX", key, true, self.store().set_nx(key, value, ttl)).await;
        let mut c = lock(&self.ctl);
        if is_lock {
            // A new pipeline: what it reads and inspects from here on is its last look.
            let (step, now) = (c.step, c.now());
            let l = &mut c.insts[self.inst];
            l.lock_attempt = Some((step, now));
            l.reads.clear();
            l.inspects.clear();
            l.breaker_unit = None;
            l.budget_unit = None;
            l.lock_checked_at = None;
            l.lock_token = None;
            if matches!(r, Ok(true)) {
                l.lock_token = Some(value.to_string());
                c.tokens.insert(value.to_string(), self.inst);
            }
        } else if matches!(r, Ok(true)) {
            check_incident_opened(&mut c, self.inst, self.node, key);
        }
        drop(c);
        self.told(self.lies.set_nx(is_lock, r))
    }
    async fn del(&self, keys: &[String]) -> Result<(), CoordError> {
        let first = keys.first().cloned().unwrap_or_default();
        self.around("DEL", &first, true, self.store().del(keys)).await
    }
    async fn owner_ttl(&self, key: &str, token: &str) -> Result<Option<Millis>, CoordError> {
        let r = self.around("OWNER TTL", key, false, self.store().owner_ttl(key, token)).await;
        if r.is_ok() && self.is_lock(key) {
            let mut c = lock(&self.ctl);
            let now = c.now();
            c.insts[self.inst].lock_checked_at = Some(now);
        }
        let full = ms(lock(&self.ctl).cfg.safety.lock_ttl);
        self.told(self.lies.owner_ttl(self.is_lock(key), full, r))
    }
    /// A compare-and-renew; of this node's lock, a check of it too (the pipeline renews it right
    /// before the command).
    async fn renew_if_owner(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, CoordError> {
        let store = self.store().renew_if_owner(key, token, ttl);
        let r = self.around("RENEW IF OWNER", key, true, store).await;
        if r.is_ok() && self.is_lock(key) {
            let mut c = lock(&self.ctl);
            let now = c.now();
            c.insts[self.inst].lock_checked_at = Some(now);
        }
        self.told(self.lies.renew_if_owner(self.is_lock(key), r))
    }

    async fn del_if_owner(&self, key: &str, token: &str) -> Result<bool, CoordError> {
        let token = self.lies.del_if_owner(self.is_lock(key), token);
        self.around("DEL IF OWNER", key, true, self.store().del_if_owner(key, &token)).await
    }
    async fn incr_capped(
        &self,
        key: &str,
        cap: u64,
        ttl: Duration,
    ) -> Result<Option<u64>, CoordError> {
        let r =
            self.around("INCR CAPPED", key, true, self.store().incr_capped(key, cap, ttl)).await;
        if matches!(r, Ok(Some(_))) {
            let mut c = lock(&self.ctl);
            let keys = c.nodes[self.node].keys.clone();
            let l = &mut c.insts[self.inst];
            if let Some(day) = key.strip_prefix(&keys.breaker("")) {
                l.breaker_unit = Some(day.to_string());
            } else if let Some(w) = key.strip_prefix(keys.fleet_budget(0).trim_end_matches('0')) {
                l.budget_unit = w.parse().ok();
            }
        }
        self.told(self.lies.incr_capped(self.is_breaker(key), cap, r))
    }
    async fn decr(&self, key: &str) -> Result<(), CoordError> {
        self.around("DECR", key, true, self.store().decr(key)).await
    }
    async fn hgetall(&self, key: &str) -> Result<HashMap<String, String>, CoordError> {
        let r = self.around("HGETALL", key, false, self.store().hgetall(key)).await;
        if r.is_ok() {
            let mut c = lock(&self.ctl);
            if let Some(w) = c.worker_of_status_key(self.node, key) {
                let cfg = c.cfg.clone();
                let seen = c.condemnable(w, c.now());
                let suspectable = c.workers[w].suspectable(c.now(), &cfg);
                let worker = c.workers[w].worker.clone();
                let l = &mut c.insts[self.inst];
                if l.lock_attempt.is_some() {
                    l.reads.insert(worker.clone(), seen);
                }
                l.last_read.insert(worker, suspectable);
            }
        }
        self.told(self.lies.hgetall(key, r))
    }
    async fn append(
        &self,
        key: &str,
        fields: &[(String, String)],
        max_len: usize,
    ) -> Result<(), CoordError> {
        let what = fields
            .iter()
            .find(|(k, _)| k == "decision")
            .map_or(String::new(), |(_, v)| format!(" {v}"));
        let op = format!("XADD{what}");
        self.around(&op, key, true, self.store().append(key, fields, max_len)).await
    }
    async fn read_recent(&self, key: &str, count: usize) -> Result<Vec<TrailEntry>, CoordError> {
        self.around("XREVRANGE", key, false, self.store().read_recent(key, count)).await
    }
    async fn index_members(&self, key: &str) -> Result<Vec<(String, Millis)>, CoordError> {
        self.around("ZRANGE", key, false, self.store().index_members(key)).await
    }
    /// One scheduling step per op (a pipeline's commands interleave with other instances'),
    /// stopping at the first that fails. A single `set`, `hset`, index touch or `counter`
    /// comes here as a batch of one.
    async fn batch(&self, ops: &[Op]) -> Result<Vec<u64>, CoordError> {
        let mut counters = Vec::new();
        for op in ops {
            let one = self.store().batch(std::slice::from_ref(op));
            let name = match op {
                Op::Counter { key } => {
                    let r = self.around("GET", key, false, one).await;
                    let r = r.map(|v| v.first().copied().unwrap_or(0));
                    let cap = u64::from(lock(&self.ctl).cfg.safety.breaker_per_day);
                    counters.push(self.told(self.lies.counter(self.is_breaker(key), cap, r))?);
                    continue;
                }
                Op::Set { key, value, .. } => {
                    self.lies.wrote(key, value);
                    "SET"
                }
                Op::Hset { ttl: None, .. } => "HSET",
                Op::Hset { ttl: Some(_), .. } => "HSET+EXPIRE",
                Op::IndexTouch { .. } => "ZADD",
                Op::Hdel { .. } => "HDEL",
                Op::Expire { .. } => "PEXPIRE",
            };
            self.around(name, op.key(), true, one).await?;
        }
        Ok(counters)
    }
}

/// An incident timer opened: the worker must have been hung (or in error) at the read the
/// decision was made on.
fn check_incident_opened(c: &mut Ctl, inst: usize, node: usize, key: &str) {
    let keys = &c.nodes[node].keys;
    let Some(w) = c.workers.iter().position(|w| w.node == node && keys.incident(&w.worker) == key)
    else {
        return;
    };
    let worker = c.workers[w].worker.clone();
    if c.insts[inst].last_read.get(&worker) != Some(&true) {
        c.violate(
            "restart only of a hung worker",
            format!("i{inst} confirmed an incident for {worker}, whose last read record was fresh"),
        );
    }
}

/// One agent instance's container runtime.
pub struct SimRuntime {
    pub inner: FakeRuntime,
    pub ctl: Shared,
    pub inst: usize,
    /// The planted mutant's lies to this instance (shared with its coordinator).
    pub lies: Arc<Lies>,
}

impl SimRuntime {
    /// Yield, then decide whether this call fails.
    async fn enter(&self, op: &str, id: &str) -> Result<(), RuntimeError> {
        Gate::default().await;
        let mut c = lock(&self.ctl);
        c.step += 1;
        let f = c.faults;
        let fail = c.faults_on && c.rng.chance(f.runtime_error);
        if fail {
            c.stats.runtime_errors += 1;
        }
        let tag = if fail { " -> ERROR" } else { "" };
        c.log(|| format!("i{} runtime {op} {id}{tag}", self.inst));
        if fail {
            return Err(RuntimeError::Unreachable {
                runtime: "sim".into(),
                source: "connection reset".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl ContainerRuntime for SimRuntime {
    fn describe(&self) -> String {
        "simulated runtime".into()
    }
    async fn list_workers(&self) -> Result<Vec<Container>, RuntimeError> {
        self.enter("list", "").await?;
        let r = self.inner.list_workers().await;
        if let Ok(listed) = &r {
            self.lies.listed(listed);
        }
        r
    }
    async fn inspect(&self, id: &str) -> Result<Option<Container>, RuntimeError> {
        {
            // The request: what the agent checked just before it (stand-down, revalidation)
            // saw the world as of this step.
            let mut c = lock(&self.ctl);
            let (step, now) = (c.step, c.now());
            let l = &mut c.insts[self.inst];
            if l.lock_attempt.is_some() {
                l.inspects.insert(id.to_string(), (step, now));
            }
        }
        let r = match self.enter("inspect", id).await {
            Ok(()) => self.inner.inspect(id).await,
            Err(e) => Err(e),
        };
        told(&self.ctl, self.inst, self.lies.inspect(id, r))
    }
    async fn logs(&self, id: &str, lines: usize) -> Result<String, RuntimeError> {
        self.enter("logs", id).await?;
        self.inner.logs(id, lines).await
    }
    async fn restart(&self, target: &Container, _grace: Duration) -> Result<(), RuntimeError> {
        Gate::default().await;
        self.lies.commanded();
        let (refused, slow, lost, pending) = {
            let mut c = lock(&self.ctl);
            c.step += 1;
            let pending = c.check_command(self.inst, &self.inner, target);
            let (faults, f) = (c.faults_on, c.faults);
            let refused = faults && c.rng.chance(f.restart_refused);
            let slow = if faults && !refused && c.rng.chance(f.restart_slow) {
                c.rng.range(1, 4)
            } else {
                0
            };
            let lost = faults && !refused && c.rng.chance(f.restart_lost_reply);
            if refused {
                c.stats.refused += 1;
                c.log(|| format!("i{} runtime restart REFUSED", self.inst));
            }
            (refused, slow, lost, pending)
        };
        if refused {
            return Err(RuntimeError::Refused {
                runtime: "sim".into(),
                op: "restart",
                container: target.id.clone(),
                detail: "device or resource busy".into(),
            });
        }
        if slow > 0 {
            lock(&self.ctl).insts[self.inst].pending = Some(pending.clone());
            lock(&self.ctl).stats.slow_restarts += 1;
            for _ in 0..slow {
                // The restart takes a while: the world (and the other instances) move on.
                {
                    let mut c = lock(&self.ctl);
                    let d = c.rng.range(1_000, 6_000);
                    c.clock.advance(Duration::from_millis(d));
                    let step = c.step;
                    c.stalls.push(step);
                    c.log(|| format!("i{} restart in progress (+{d} ms)", self.inst));
                }
                Gate::default().await;
                lock(&self.ctl).step += 1;
            }
        }
        {
            let mut c = lock(&self.ctl);
            c.insts[self.inst].pending = None;
            apply_restart(&mut c, &self.inner, &pending);
            if lost {
                c.stats.lost_restart_replies += 1;
                c.log(|| format!("i{} runtime restart: REPLY LOST", self.inst));
            }
        }
        if lost {
            return Err(RuntimeError::Timeout {
                op: "restart",
                container: target.id.clone(),
                timeout: Duration::from_secs(2),
            });
        }
        Ok(())
    }
    async fn kill(&self, id: &str, signal: &str) -> Result<(), RuntimeError> {
        self.enter("kill", id).await?;
        self.inner.kill(id, signal).await
    }
    async fn ping(&self) -> Result<(), RuntimeError> {
        self.enter("ping", "").await?;
        self.inner.ping().await
    }
}
