//! Time as Vigil sees it: milliseconds since the Unix epoch *on the coordinator's clock* (Redis
//! `TIME`), never the node's. Pure code takes `now` as an argument; only adapters read a clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

pub fn ms(d: Duration) -> Millis {
    d.as_millis().min(i64::MAX as u128) as Millis
}

/// UTC calendar day of a timestamp, `YYYY-MM-DD`: the breaker's unit.
pub fn utc_day(now: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(now)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_else(|| "invalid-day".into())
}

/// RFC 3339 rendering for alerts and the trail.
pub fn rfc3339(now: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(now)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| now.to_string())
}

/// Human duration (`3m 12s`) from milliseconds, rounded to seconds.
pub fn human(d: Millis) -> String {
    let secs = (d.max(0) as u64 + 500) / 1000;
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// A clock the in-process coordinator reads. Production uses the system clock; tests move a fake.
pub trait Clock: Send + Sync {
    fn now(&self) -> Millis;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        chrono::Utc::now().timestamp_millis()
    }
}

/// A clock that only moves when told to.
#[derive(Clone, Default)]
pub struct FakeClock(Arc<AtomicI64>);

impl FakeClock {
    pub fn at(start: Millis) -> Self {
        FakeClock(Arc::new(AtomicI64::new(start)))
    }
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(ms(d), Ordering::SeqCst);
    }
    pub fn set(&self, t: Millis) {
        self.0.store(t, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_day_changes_exactly_at_midnight() {
        // 2026-11-30T23:59:59.999Z and one millisecond later.
        let before = 1_796_083_199_999;
        assert_eq!(utc_day(before), "2026-11-30");
        assert_eq!(utc_day(before + 1), "2026-12-01");
    }

    #[test]
    fn human_rounds_to_seconds() {
        assert_eq!(human(192_400), "3m 12s");
        assert_eq!(human(-5), "0s");
    }
}
