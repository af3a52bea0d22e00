//! Time lost, by cause: the counter and the time-to-recovery histogram a goodput dashboard reads,
//! and an hourly ledger of the last day that the node record carries (`vigil status` sums it per
//! pool). The causes are fixed words ([`CAUSES`]), so the cardinality is seven series.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::clock::Millis;

/// Every cause, in the order `vigil status` shows them.
pub const CAUSES: [&str; 7] =
    ["hang", "error", "restart", "maintenance", "preemption", "gpu-failed", "slow"];

const HOUR: Millis = 3_600_000;
/// Hours the ledger keeps: the last day and the hour under way.
const HOURS: i64 = 25;

/// Seconds lost per cause in each hour (hours since the epoch).
pub type Ledger = BTreeMap<i64, BTreeMap<String, f64>>;

pub(crate) struct LostMetrics {
    pub(crate) seconds: Family<super::Labels<1>, Counter<f64, AtomicU64>>,
    pub(crate) recovery: Histogram,
    ledger: Mutex<Ledger>,
}

impl LostMetrics {
    pub(crate) fn register(reg: &mut Registry) -> Self {
        // 10 s to about 2 days.
        let recovery = Histogram::new(exponential_buckets(10.0, 2.0, 15));
        let m = LostMetrics { seconds: Family::default(), recovery, ledger: Mutex::default() };
        for cause in CAUSES {
            let _ = m.seconds.get_or_create(&[("cause", cause)]);
        }
        register!(reg;
            "lost" in Unit::Seconds => m.seconds,
                "Time lost, by cause: hang and error (a worker's last beat or error to the restart command), restart (the command to the new incarnation's first beat), maintenance and preemption (a notice to its end or the node's going), gpu-failed (each failed GPU, while failed), slow (a slow gang member's deficit against its pace)";
            "time_to_recovery" in Unit::Seconds => m.recovery,
                "From a worker's last beat before a hang (or the start of its error) to the first beat of the incarnation Vigil's restart started";
        );
        m
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `ms` lost to `cause` (one of [`CAUSES`]) up to `at` (coordinator clock).
    pub(crate) fn add(&self, cause: &'static str, ms: Millis, at: Millis) {
        if ms <= 0 {
            return;
        }
        let secs = ms as f64 / 1000.0;
        self.seconds.get_or_create(&[("cause", cause)]).inc_by(secs);
        let mut l = self.ledger();
        *l.entry(at.div_euclid(HOUR)).or_default().entry(cause.to_string()).or_default() += secs;
        let oldest = at.div_euclid(HOUR) - HOURS;
        l.retain(|&h, _| h > oldest);
    }

    /// An incident's time to recovery (ms).
    pub(crate) fn recovered(&self, ms: Millis) {
        self.recovery.observe(ms.max(0) as f64 / 1000.0);
    }

    /// Seconds lost per cause in the 24 hours before `now` (whole hours: the hour under way and
    /// the 23 before it, plus the part of the 24th still within the day, pro rata).
    pub(crate) fn last_day(&self, now: Millis) -> BTreeMap<String, f64> {
        let this = now.div_euclid(HOUR);
        let into = now.rem_euclid(HOUR) as f64 / HOUR as f64;
        let mut out = BTreeMap::new();
        for (&h, causes) in self.ledger().iter() {
            let share = match this - h {
                0..=23 => 1.0,
                24 => 1.0 - into,
                _ => 0.0,
            };
            for (cause, s) in causes {
                *out.entry(cause.clone()).or_insert(0.0) += s * share;
            }
        }
        out.retain(|_, s| *s > 0.0);
        out
    }

    /// The ledger, to keep in the node record.
    pub(crate) fn hours(&self) -> Ledger {
        self.ledger().clone()
    }

    /// Take a ledger kept before this process started (the node's previous record): each hour
    /// keeps the larger of the two counts, so reading it twice adds nothing.
    pub(crate) fn seed(&self, kept: &Ledger, now: Millis) {
        let mut l = self.ledger();
        let oldest = now.div_euclid(HOUR) - HOURS;
        for (&h, causes) in kept.iter().filter(|(&h, _)| h > oldest) {
            let mine = l.entry(h).or_default();
            for (cause, &s) in causes {
                let e = mine.entry(cause.clone()).or_default();
                *e = e.max(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Millis = 1_800_000_000_000; // on an hour

    #[test]
    fn the_last_day_sums_whole_hours_and_the_oldest_pro_rata() {
        let mut reg = Registry::default();
        let m = LostMetrics::register(&mut reg);
        m.add("hang", 60_000, T - 24 * HOUR); // 24 h before the hour under way
        m.add("hang", 30_000, T - HOUR);
        m.add("restart", 12_500, T + 10);
        m.add("restart", 0, T + 10);
        let at = |into: Millis| m.last_day(T + into);
        assert_eq!(at(0).get("hang"), Some(&90.0), "the whole 24th hour");
        assert_eq!(at(HOUR / 2).get("hang"), Some(&60.0), "half of it");
        assert_eq!(at(HOUR / 2).get("restart"), Some(&12.5));
        assert_eq!(at(HOUR).get("hang"), Some(&30.0), "gone a day later");
        assert!(!at(0).contains_key("maintenance"));
    }

    #[test]
    fn a_kept_ledger_seeds_without_counting_twice() {
        let mut reg = Registry::default();
        let m = LostMetrics::register(&mut reg);
        m.add("hang", 10_000, T);
        let kept = m.hours();
        m.seed(&kept, T);
        m.seed(&kept, T);
        assert_eq!(m.last_day(T).get("hang"), Some(&10.0));
        let mut old = Ledger::new();
        old.entry(T / HOUR - 40).or_default().insert("hang".into(), 99.0);
        m.seed(&old, T);
        assert_eq!(m.hours().len(), 1, "older than a day: not taken");
    }
}
