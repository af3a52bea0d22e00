//! `[safety]`: the per-node lock, the per-node circuit breaker and the fleet's restart budget.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{at_least_a_second, bad_if, ConfigError};

/// Room the lock must still have when the restart command starts, beyond the restart timeout.
pub(crate) const LOCK_MARGIN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct SafetyConfig {
    /// TTL of the per-node execution lock.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(180)))]
    pub lock_ttl: Duration,
    /// Restarts allowed per node per UTC day (the circuit breaker).
    #[educe(Default(expression = 3))]
    pub breaker_per_day: u32,
    /// Remove the per-node cap entirely (not recommended; must be said explicitly).
    pub(crate) breaker_disabled: bool,
    /// Restarts allowed across the whole fleet per `fleet_window`; 0 disables the fleet cap.
    #[educe(Default(expression = 10))]
    pub fleet_budget: u32,
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(3600)))]
    pub fleet_window: Duration,
}

impl SafetyConfig {
    /// A breaker that is a number or explicitly off, a fleet window a budget can count in. The
    /// lock's TTL against the durations it must cover is checked by `Config::validate`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let why = "0 is ambiguous: use dry_run = true to never restart, or safety.breaker_disabled = true to remove the cap";
        bad_if(self.breaker_per_day == 0 && !self.breaker_disabled, "safety.breaker_per_day", why)?;
        if self.fleet_budget > 0 {
            at_least_a_second("safety.fleet_window", self.fleet_window)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{key_of, parse};

    #[test]
    fn breaker_zero_needs_explicit_disable() {
        assert_eq!(key_of(parse("[safety]\nbreaker_per_day = 0\n")), "safety.breaker_per_day");
        assert!(parse("[safety]\nbreaker_per_day = 0\nbreaker_disabled = true\n").is_ok());
    }

    #[test]
    fn a_fleet_budget_needs_a_window() {
        assert_eq!(key_of(parse("[safety]\nfleet_window = \"500ms\"\n")), "safety.fleet_window");
        assert!(parse("[safety]\nfleet_budget = 0\nfleet_window = \"0s\"\n").is_ok());
    }
}
