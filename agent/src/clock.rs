//! Time as Vigil sees it: milliseconds since the Unix epoch *on the coordinator's clock* (Redis
//! `TIME`), never the node's. Pure code takes `now` as an argument; only adapters read a clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// A point on the process's monotonic clock, for bounds local to the process (the start-up wait
/// for the first reads): tokio's, so the tests that pause time drive it too.
pub type Monotonic = tokio::time::Instant;

/// Wait for `tick`'s next tick: `false` when `stop` comes first. A task that works every tick
/// until stopped runs `while ticked(&mut tick, &stop).await { .. }`.
pub(crate) async fn ticked(tick: &mut tokio::time::Interval, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tick.tick() => true,
    }
}

pub fn ms(d: Duration) -> Millis {
    d.as_millis().min(i64::MAX as u128) as Millis
}

/// A span of milliseconds as a `Duration`; a negative one (a clock gone back) is none.
pub(crate) fn duration(span: Millis) -> Duration {
    Duration::from_millis(span.max(0) as u64)
}

/// UTC calendar day of a timestamp, `YYYY-MM-DD`: the breaker's unit.
pub fn utc_day(now: Millis) -> String {
    strftime(now, "%Y-%m-%d").unwrap_or_else(|| "invalid-day".into())
}

/// A timestamp in `format` (UTC); `None` for one out of the calendar's range.
fn strftime(now: Millis, format: &str) -> Option<String> {
    jiff::Timestamp::from_millisecond(now).ok().map(|t| t.strftime(format).to_string())
}

/// `HH:MM:SS` (UTC) of a timestamp, for compact timelines (`vigil demo`'s).
#[cfg_attr(not(feature = "demo"), allow(dead_code))]
pub(crate) fn hhmmss(now: Millis) -> String {
    strftime(now, "%H:%M:%S").unwrap_or_default()
}

/// Milliseconds of an RFC 3339 timestamp (any offset), or `None` when it is not one.
pub(crate) fn parse_rfc3339(text: &str) -> Option<Millis> {
    text.trim().parse::<jiff::Timestamp>().ok().map(|t| t.as_millisecond())
}

/// RFC 3339 rendering for alerts and the trail.
pub(crate) fn rfc3339(now: Millis) -> String {
    strftime(now, "%Y-%m-%dT%H:%M:%S%.3fZ").unwrap_or_else(|| now.to_string())
}

/// Human duration (`3m 12s`) from milliseconds, rounded to seconds.
pub(crate) fn human(d: Millis) -> String {
    let secs = (d.max(0) as u64 + 500) / 1000;
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// A measured duration as a person reads it: `850ms`, `2.5s`, `25s`, `3m 12s` — never
/// `24s 998ms 324us 296ns`.
pub(crate) fn brief(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let tenths = (ms + 50) / 100;
    if tenths < 100 {
        return format!("{}.{}s", tenths / 10, tenths % 10);
    }
    human(Millis::try_from(ms).unwrap_or(Millis::MAX))
}

/// A clock the in-process coordinator reads. Production uses the system clock; tests move a fake.
pub trait Clock: Send + Sync {
    fn now(&self) -> Millis;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        jiff::Timestamp::now().as_millisecond()
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
}

#[cfg(any(test, feature = "bench"))]
impl FakeClock {
    pub fn set(&self, t: Millis) {
        self.0.store(t, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }
}

/// A time and what happened then, as the coordinator keeps a mark: `"<ms>:<rest>"` — a
/// worker's incident timer, a gang's incident and restart decision, a progress or suspect mark,
/// a cooldown marker, an alert claim. The one codec of that shape: the rest may hold `:` itself
/// (a restart claim names an incarnation), the time never does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub at: Millis,
    pub rest: String,
}

impl Stamp {
    pub fn new(at: Millis, rest: impl Into<String>) -> Stamp {
        Stamp { at, rest: rest.into() }
    }

    /// `None` for anything that is not a time, a `:` and the rest.
    pub fn parse(s: &str) -> Option<Stamp> {
        let (at, rest) = s.split_once(':')?;
        Some(Stamp::new(at.parse().ok()?, rest))
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.at, self.rest)
    }
}

#[cfg(test)]
mod stamp_tests {
    use super::Stamp;

    #[test]
    fn a_stamp_reads_back_what_it_wrote_and_nothing_else() {
        let s = Stamp::new(1_800_000_000_025, "inc-1:c1:2026-12-01T00:00:00Z");
        assert_eq!(s.to_string(), "1800000000025:inc-1:c1:2026-12-01T00:00:00Z");
        assert_eq!(Stamp::parse(&s.to_string()), Some(s));
        assert_eq!(Stamp::parse("-5:x"), Some(Stamp::new(-5, "x")));
        assert_eq!(Stamp::parse("12:"), Some(Stamp::new(12, "")));
        for junk in ["", "12", "x:12", ":12", "1.5:x"] {
            assert_eq!(Stamp::parse(junk), None, "{junk:?}");
        }
    }
}

#[cfg(test)]
mod brief_tests {
    use super::brief;
    use std::time::Duration;

    #[test]
    fn measured_durations_read_as_a_person_says_them() {
        let ms = Duration::from_millis;
        assert_eq!(brief(ms(850)), "850ms");
        assert_eq!(brief(ms(2_449)), "2.4s");
        assert_eq!(brief(ms(9_960)), "10s");
        assert_eq!(brief(Duration::new(24, 998_324_296)), "25s");
        assert_eq!(brief(ms(192_400)), "3m 12s");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_both_ways() {
        let t = 1_796_032_800_000; // 2026-11-30T10:00:00Z
        assert_eq!(rfc3339(t), "2026-11-30T10:00:00.000Z");
        assert_eq!(parse_rfc3339("2026-11-30T10:00:00Z"), Some(t));
        assert_eq!(parse_rfc3339("2026-11-30T11:00:00+01:00"), Some(t));
        assert_eq!(parse_rfc3339(" 2026-11-30T10:00:00.000Z\n"), Some(t));
        assert_eq!(parse_rfc3339("tomorrow"), None);
        assert_eq!(hhmmss(t + 61_000), "10:01:01");
    }

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
