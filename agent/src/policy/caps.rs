//! The caps on automation (pure): the breaker's UTC day, the fleet budget's window, and whether
//! the node lock has room left for a restart.
//!
//! NB: every input is on the coordinator's clock (Redis `TIME`), so two nodes with skewed clocks
//! count the same day and the same window.

use std::time::Duration;

use crate::clock::{ms, utc_day, Millis};
use crate::config::SafetyConfig;

/// The breaker's day: one counter per node per UTC day.
pub(crate) fn breaker_day(now: Millis) -> String {
    utc_day(now)
}

/// The fleet budget's window number: windows of `window` length since the epoch.
pub(crate) fn fleet_window(now: Millis, window: Duration) -> i64 {
    now.div_euclid(ms(window).max(1))
}

/// Whether `used` restarts today open the breaker.
pub(crate) fn breaker_open(used: u64, s: &SafetyConfig) -> bool {
    !s.breaker_disabled && used >= u64::from(s.breaker_per_day)
}

/// Whether the fleet budget of this window is used up (a budget of 0 means no fleet cap).
pub(crate) fn budget_exhausted(used: u64, s: &SafetyConfig) -> bool {
    s.fleet_budget > 0 && used >= u64::from(s.fleet_budget)
}

/// Whether a lock with `left` of its TTL still covers a restart that may take `needed`.
pub(crate) fn lock_covers(left: Option<Millis>, needed: Duration) -> bool {
    matches!(left, Some(ttl) if ttl >= ms(needed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_days_follow_the_shared_clock() {
        let hour = Duration::from_secs(3600);
        assert_eq!(fleet_window(0, hour), 0);
        assert_eq!(fleet_window(3_599_999, hour), 0);
        assert_eq!(fleet_window(3_600_000, hour), 1);
        assert_eq!(
            fleet_window(5, Duration::ZERO),
            5,
            "a zero window cannot divide by zero"
        );
        assert_eq!(breaker_day(0), "1970-01-01");
    }

    #[test]
    fn caps_open_at_their_limit() {
        let s = SafetyConfig {
            breaker_per_day: 3,
            fleet_budget: 2,
            ..SafetyConfig::default()
        };
        assert!(!breaker_open(2, &s) && breaker_open(3, &s));
        assert!(!budget_exhausted(1, &s) && budget_exhausted(2, &s));
        let off = SafetyConfig {
            breaker_disabled: true,
            fleet_budget: 0,
            ..s
        };
        assert!(!breaker_open(100, &off) && !budget_exhausted(100, &off));
    }

    #[test]
    fn a_lock_must_cover_the_whole_restart() {
        let need = Duration::from_secs(10);
        assert!(lock_covers(Some(10_000), need));
        assert!(!lock_covers(Some(9_999), need));
        assert!(!lock_covers(None, need), "a lost lock covers nothing");
    }
}
