//! The restart caps, in one place: the node's circuit breaker for the UTC day and the fleet's
//! budget for the window — their keys, their rules (pure: `Caps::breaker_open`,
//! `Caps::budget_exhausted`, on the coordinator's clock) and their counters. Each unit is one atomic capped increment,
//! taken immediately before the command (never at pipeline start: a run that fails earlier must
//! not consume budget), and given back for a restart that did not run. The heartbeat reads both
//! counters in its one batch ([`Caps::counter_ops`]) for the metrics.
//!
//! NB: every time is the coordinator's (Redis `TIME`), so two nodes with skewed clocks count the
//! same day and the same window.

use std::time::Duration;

use crate::clock::{ms, utc_day, Millis};
use crate::config::SafetyConfig;
use crate::coord::{CoordError, Coordinator, Keys, Op};

/// How long a day's breaker counter lives (past the day, for the operator's eyes).
pub(crate) const BREAKER_TTL: Duration = Duration::from_secs(48 * 3600);

/// The fleet budget's window number: windows of `window` length since the epoch.
pub(crate) fn fleet_window(now: Millis, window: Duration) -> i64 {
    now.div_euclid(ms(window).max(1))
}

/// Which breaker a restart counts against: a restart unit's own. One worker's restart takes a
/// unit of its node's breaker; a gang's one decision, a unit of the gang's (and then each
/// member's restart a unit of its own node's, [`Caps::fleet`] off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Breaker<'a> {
    /// The node's: `safety.breaker_per_day` a UTC day, off with `safety.breaker_disabled`.
    Node,
    /// The gang `id`'s: `per_day` decisions a UTC day (`gang.breaker_per_day`).
    Gang { id: &'a str, per_day: u32 },
}

/// What a restart's caps say: both let it through, or which refuses (the breaker is asked
/// first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Allowance {
    Granted,
    BreakerOpen,
    BudgetExhausted,
}

/// One counter of a restart's caps: its cap, its key at the time asked, the TTL it is made with.
type Counter = (u64, String, Duration);

/// The caps of one restart unit, as the safety settings size them.
pub(crate) struct Caps<'a> {
    pub(crate) coord: &'a dyn Coordinator,
    pub(crate) keys: &'a Keys,
    pub(crate) safety: &'a SafetyConfig,
    pub(crate) breaker: Breaker<'a>,
    /// Whether a restart takes a unit of the fleet budget too: not a gang member's, whose
    /// gang took one unit for all its members (the node's breaker is each member's own).
    pub(crate) fleet: bool,
}

impl<'a> Caps<'a> {
    /// A node's caps: its breaker and the fleet budget.
    pub(crate) fn node(
        coord: &'a dyn Coordinator,
        keys: &'a Keys,
        safety: &'a SafetyConfig,
    ) -> Self {
        Caps { coord, keys, safety, breaker: Breaker::Node, fleet: true }
    }

    /// The breaker's limit for a day, `None` when it is off.
    pub(crate) fn per_day(&self) -> Option<u32> {
        match self.breaker {
            Breaker::Node => (!self.safety.breaker_disabled).then_some(self.safety.breaker_per_day),
            Breaker::Gang { per_day, .. } => Some(per_day),
        }
    }

    /// The fleet budget this restart is held to, `None` when there is no fleet cap (a budget of
    /// 0, or a restart outside its scope).
    fn fleet_cap(&self) -> Option<u32> {
        (self.fleet && self.safety.fleet_budget > 0).then_some(self.safety.fleet_budget)
    }

    /// Whether `used` restarts today open the breaker (never, when it is off).
    pub(crate) fn breaker_open(&self, used: u64) -> bool {
        self.per_day().is_some_and(|cap| used >= u64::from(cap))
    }

    /// Whether the fleet budget of this window is used up (a budget of 0 means no fleet cap).
    pub(crate) fn budget_exhausted(&self, used: u64) -> bool {
        self.fleet_cap().is_some_and(|cap| used >= u64::from(cap))
    }

    /// The breaker's counter for the day of `now`.
    pub(crate) fn breaker_key(&self, now: Millis) -> String {
        let day = utc_day(now);
        match self.breaker {
            Breaker::Node => self.keys.breaker(&day),
            Breaker::Gang { id, .. } => self.keys.gang_breaker(id, &day),
        }
    }

    /// The fleet budget's counter for the window of `now`.
    pub(crate) fn budget_key(&self, now: Millis) -> String {
        self.keys.fleet_budget(fleet_window(now, self.safety.fleet_window))
    }

    /// The counter reads of the heartbeat's batch: the breaker's, then the budget's (when there
    /// is a fleet cap). [`Caps::read`] turns their values into (used, open) pairs.
    pub(crate) fn counter_ops(&self, now: Millis) -> Vec<Op> {
        let mut ops = vec![Op::Counter { key: self.breaker_key(now) }];
        if self.fleet_cap().is_some() {
            ops.push(Op::Counter { key: self.budget_key(now) });
        }
        ops
    }

    /// The values of [`Caps::counter_ops`]: the breaker's (used, open) and the budget's (used,
    /// exhausted; `(0, false)` without a fleet cap).
    pub(crate) fn read(&self, values: &[u64]) -> ((u64, bool), (u64, bool)) {
        let at = |i: usize| values.get(i).copied().unwrap_or(0);
        let (breaker, budget) = (at(0), at(1));
        ((breaker, self.breaker_open(breaker)), (budget, self.budget_exhausted(budget)))
    }

    /// The breaker's and the fleet budget's counters at `now`; `None`: that cap is off.
    fn counters(&self, now: Millis) -> [Option<Counter>; 2] {
        let breaker =
            self.per_day().map(|cap| (u64::from(cap), self.breaker_key(now), BREAKER_TTL));
        let ttl = self.safety.fleet_window * 2;
        let budget = self.fleet_cap().map(|cap| (u64::from(cap), self.budget_key(now), ttl));
        [breaker, budget]
    }

    /// Whether `counter` would let a restart through now; nothing is taken.
    async fn free(&self, counter: Option<&Counter>) -> Result<bool, CoordError> {
        let Some((cap, key, _)) = counter else { return Ok(true) };
        Ok(self.coord.counter(key).await? < *cap)
    }

    /// Take `counter`'s unit; `false` when it refuses (nothing taken then).
    async fn take_one(&self, counter: Option<&Counter>) -> Result<bool, CoordError> {
        let Some((cap, key, ttl)) = counter else { return Ok(true) };
        Ok(self.coord.incr_capped(key, *cap, *ttl).await?.is_some())
    }

    /// Give `counter`'s unit back (a restart that will not run).
    async fn give_back(&self, counter: Option<&Counter>) -> Result<(), CoordError> {
        let Some((_, key, _)) = counter else { return Ok(()) };
        self.coord.decr(key).await
    }

    /// Take one unit of the breaker, then one of the fleet budget, as one step: `Granted` holds
    /// both; a refusal holds nothing, and a budget that does not answer gives the breaker's unit
    /// back (best-effort: one that stays taken only makes the breaker stricter, but a Redis blip
    /// must not cost a node one of its few restarts of the day). NB: the budget's own unit, when
    /// its increment landed and only the reply was lost, stays taken: a blind decrement could
    /// give back a unit that was never taken (the fleet's cap, stricter for one window).
    pub(crate) async fn take(&self, now: Millis) -> Result<Allowance, CoordError> {
        let [breaker, budget] = self.counters(now);
        if !self.take_one(breaker.as_ref()).await? {
            return Ok(Allowance::BreakerOpen);
        }
        match self.take_one(budget.as_ref()).await {
            Ok(true) => Ok(Allowance::Granted),
            Ok(false) => {
                self.give_back(breaker.as_ref()).await?;
                Ok(Allowance::BudgetExhausted)
            }
            Err(e) => {
                let _ = self.give_back(breaker.as_ref()).await;
                Err(e)
            }
        }
    }

    /// What [`Caps::take`] would say now; nothing is taken.
    pub(crate) async fn look(&self, now: Millis) -> Result<Allowance, CoordError> {
        let [breaker, budget] = self.counters(now);
        Ok(if !self.free(breaker.as_ref()).await? {
            Allowance::BreakerOpen
        } else if !self.free(budget.as_ref()).await? {
            Allowance::BudgetExhausted
        } else {
            Allowance::Granted
        })
    }

    /// Give back one breaker and one fleet unit taken for a restart that will not run
    /// (best-effort: a unit that stays taken only makes the caps stricter).
    pub(crate) async fn refund(&self, now: Millis) {
        for counter in self.counters(now) {
            let _ = self.give_back(counter.as_ref()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The breaker's and the budget's counters in [`Caps::counters`].
    const BREAKER: usize = 0;
    const BUDGET: usize = 1;

    async fn free(caps: &Caps<'_>, which: usize) -> bool {
        caps.free(caps.counters(0)[which].as_ref()).await.unwrap()
    }

    async fn take_one(caps: &Caps<'_>, which: usize) -> bool {
        caps.take_one(caps.counters(0)[which].as_ref()).await.unwrap()
    }

    #[test]
    fn windows_and_days_follow_the_shared_clock() {
        let hour = Duration::from_secs(3600);
        assert_eq!(fleet_window(0, hour), 0);
        assert_eq!(fleet_window(3_599_999, hour), 0);
        assert_eq!(fleet_window(3_600_000, hour), 1);
        assert_eq!(fleet_window(5, Duration::ZERO), 5, "a zero window cannot divide by zero");
        assert_eq!(utc_day(0), "1970-01-01");
    }

    #[test]
    fn caps_open_at_their_limit() {
        let s = SafetyConfig { breaker_per_day: 3, fleet_budget: 2, ..SafetyConfig::default() };
        let keys = Keys::new("p", "n");
        let coord = crate::coord::memory::MemoryCoordinator::new(std::sync::Arc::new(
            crate::clock::FakeClock::at(0),
        ));
        let caps = Caps::node(&coord, &keys, &s);
        assert!(!caps.breaker_open(2) && caps.breaker_open(3));
        assert!(!caps.budget_exhausted(1) && caps.budget_exhausted(2));
        let off = SafetyConfig { breaker_disabled: true, fleet_budget: 0, ..s };
        let caps = Caps::node(&coord, &keys, &off);
        assert!(!caps.breaker_open(100) && !caps.budget_exhausted(100));
    }

    #[test]
    fn the_heartbeat_reads_what_the_caps_count() {
        let keys = Keys::new("p", "n");
        let coord = crate::coord::memory::MemoryCoordinator::new(std::sync::Arc::new(
            crate::clock::FakeClock::at(0),
        ));
        let s = SafetyConfig { breaker_per_day: 2, fleet_budget: 5, ..SafetyConfig::default() };
        let caps = Caps::node(&coord, &keys, &s);
        let ops = caps.counter_ops(0);
        assert_eq!(ops[0].key(), caps.breaker_key(0));
        assert_eq!(ops[1].key(), caps.budget_key(0));
        assert_eq!(caps.read(&[2, 1]), ((2, true), (1, false)));
        let none = SafetyConfig { fleet_budget: 0, ..s };
        let caps = Caps { safety: &none, ..caps };
        assert_eq!(caps.counter_ops(0).len(), 1, "no fleet cap, no budget read");
        assert_eq!(caps.read(&[0]), ((0, false), (0, false)));
    }

    #[tokio::test]
    async fn a_restart_outside_the_fleets_scope_takes_the_breaker_only() {
        let keys = Keys::new("p", "n");
        let coord = crate::coord::memory::MemoryCoordinator::new(std::sync::Arc::new(
            crate::clock::FakeClock::at(0),
        ));
        let s = SafetyConfig { breaker_per_day: 2, fleet_budget: 1, ..SafetyConfig::default() };
        let node_only = Caps { fleet: false, ..Caps::node(&coord, &keys, &s) };
        let c: &dyn Coordinator = &coord;
        // The fleet's one unit is spent: a gang member's restart still passes, on its breaker.
        c.set(&node_only.budget_key(0), "1", Duration::from_secs(60)).await.unwrap();
        assert!(free(&node_only, BUDGET).await);
        assert!(take_one(&node_only, BUDGET).await);
        assert!(take_one(&node_only, BREAKER).await);
        node_only.refund(0).await;
        assert_eq!(c.counter(&node_only.budget_key(0)).await.unwrap(), 1, "untouched");
        assert_eq!(c.counter(&node_only.breaker_key(0)).await.unwrap(), 0);
        let whole = Caps { fleet: true, ..node_only };
        assert!(!free(&whole, BUDGET).await && !take_one(&whole, BUDGET).await);
    }

    /// Both units or none: a budget that refuses or does not answer leaves the breaker as it was.
    #[tokio::test]
    async fn taking_the_caps_holds_both_units_or_none() {
        let keys = Keys::new("p", "n");
        let memory = || {
            crate::coord::memory::MemoryCoordinator::new(std::sync::Arc::new(
                crate::clock::FakeClock::at(0),
            ))
        };
        let s = SafetyConfig { breaker_per_day: 2, fleet_budget: 1, ..SafetyConfig::default() };
        let coord = memory();
        let caps = Caps::node(&coord, &keys, &s);
        assert_eq!(caps.look(0).await.unwrap(), Allowance::Granted);
        assert_eq!(caps.take(0).await.unwrap(), Allowance::Granted);
        assert_eq!(caps.look(0).await.unwrap(), Allowance::BudgetExhausted);
        assert_eq!(caps.take(0).await.unwrap(), Allowance::BudgetExhausted);
        let c: &dyn Coordinator = &coord;
        assert_eq!(c.counter(&caps.breaker_key(0)).await.unwrap(), 1, "given back");
        // The fleet budget's capped increments get no answer.
        let failing = crate::coord::memory::Failing {
            inner: memory(),
            fails: Box::new(
                |r| matches!(r, crate::coord::Request::IncrCapped { key, .. } if key.contains("budget")),
            ),
        };
        let caps = Caps::node(&failing, &keys, &s);
        assert!(caps.take(0).await.is_err());
        let c: &dyn Coordinator = &failing;
        assert_eq!(c.counter(&caps.breaker_key(0)).await.unwrap(), 0, "given back");
        let tight = SafetyConfig { breaker_per_day: 1, ..s };
        let coord = memory();
        let caps = Caps::node(&coord, &keys, &tight);
        assert_eq!(caps.take(0).await.unwrap(), Allowance::Granted);
        assert_eq!(caps.take(1).await.unwrap(), Allowance::BreakerOpen);
        assert_eq!(caps.look(1).await.unwrap(), Allowance::BreakerOpen);
    }

    #[tokio::test]
    async fn a_gangs_breaker_is_its_own_and_counts_whatever_the_nodes_setting() {
        let keys = Keys::new("p", "n");
        let coord = crate::coord::memory::MemoryCoordinator::new(std::sync::Arc::new(
            crate::clock::FakeClock::at(0),
        ));
        let s = SafetyConfig { breaker_disabled: true, ..SafetyConfig::default() };
        let gang = Caps {
            breaker: Breaker::Gang { id: "ml/job", per_day: 1 },
            ..Caps::node(&coord, &keys, &s)
        };
        assert_eq!(gang.breaker_key(0), keys.gang_breaker("ml/job", "1970-01-01"));
        assert!(free(&gang, BREAKER).await);
        assert!(take_one(&gang, BREAKER).await);
        assert!(!free(&gang, BREAKER).await && !take_one(&gang, BREAKER).await);
        gang.refund(0).await;
        assert!(take_one(&gang, BREAKER).await, "given back, taken again");
        let c: &dyn Coordinator = &coord;
        let node = Caps::node(&coord, &keys, &s);
        assert_eq!(c.counter(&node.breaker_key(0)).await.unwrap(), 0, "not the node's");
        assert!(take_one(&node, BREAKER).await, "the node's is off");
    }
}
