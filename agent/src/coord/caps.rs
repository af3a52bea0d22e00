//! The restart caps in the coordinator: the node's circuit breaker for the UTC day and the
//! fleet's budget for the window. Each is one atomic capped increment, taken immediately before
//! the command (never at pipeline start: a run that fails earlier must not consume budget), and
//! given back for a unit taken for a restart that did not run.

use std::time::Duration;

use crate::clock::Millis;
use crate::config::SafetyConfig;
use crate::coord::{CoordError, Coordinator, Keys};
use crate::policy::caps;

/// How long a day's breaker counter lives (past the day, for the operator's eyes).
pub const BREAKER_TTL: Duration = Duration::from_secs(48 * 3600);

/// The caps of one node, as the safety settings size them.
pub struct Caps<'a> {
    pub coord: &'a dyn Coordinator,
    pub keys: &'a Keys,
    pub safety: &'a SafetyConfig,
}

impl Caps<'_> {
    fn breaker_key(&self, now: Millis) -> String {
        self.keys.breaker(&caps::breaker_day(now))
    }

    fn budget_key(&self, now: Millis) -> String {
        let s = self.safety;
        self.keys
            .fleet_budget(caps::fleet_window(now, s.fleet_window))
    }

    /// Whether the breaker would let a restart through now; nothing is taken.
    pub async fn breaker_free(&self, now: Millis) -> Result<bool, CoordError> {
        let s = self.safety;
        if s.breaker_disabled {
            return Ok(true);
        }
        let used = self.coord.counter(&self.breaker_key(now)).await?;
        Ok(!caps::breaker_open(used, s))
    }

    /// Whether the fleet budget would let a restart through now; nothing is taken.
    pub async fn budget_free(&self, now: Millis) -> Result<bool, CoordError> {
        let s = self.safety;
        if s.fleet_budget == 0 {
            return Ok(true);
        }
        let used = self.coord.counter(&self.budget_key(now)).await?;
        Ok(!caps::budget_exhausted(used, s))
    }

    /// Take the breaker's unit; `false` when the breaker refuses (nothing taken then).
    pub async fn take_breaker(&self, now: Millis) -> Result<bool, CoordError> {
        let s = self.safety;
        if s.breaker_disabled {
            return Ok(true);
        }
        let cap = u64::from(s.breaker_per_day);
        let key = self.breaker_key(now);
        Ok(self
            .coord
            .incr_capped(&key, cap, BREAKER_TTL)
            .await?
            .is_some())
    }

    /// Take the fleet budget's unit; `false` when the budget refuses (nothing taken then).
    pub async fn take_budget(&self, now: Millis) -> Result<bool, CoordError> {
        let s = self.safety;
        if s.fleet_budget == 0 {
            return Ok(true);
        }
        let cap = u64::from(s.fleet_budget);
        let key = self.budget_key(now);
        let taken = self
            .coord
            .incr_capped(&key, cap, s.fleet_window * 2)
            .await?;
        Ok(taken.is_some())
    }

    /// Give the breaker's unit back (a restart that will not run).
    pub async fn refund_breaker(&self, now: Millis) -> Result<(), CoordError> {
        if self.safety.breaker_disabled {
            return Ok(());
        }
        self.coord.decr(&self.breaker_key(now)).await
    }

    /// Give back one breaker and one fleet unit taken for a restart that will not run
    /// (best-effort: a unit that stays taken only makes the caps stricter).
    pub async fn refund(&self, now: Millis) {
        let _ = self.refund_breaker(now).await;
        if self.safety.fleet_budget > 0 {
            let _ = self.coord.decr(&self.budget_key(now)).await;
        }
    }
}
