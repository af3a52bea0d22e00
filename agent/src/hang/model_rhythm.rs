//! A worker's learned rhythm as the coordinator keeps it (`P:{N}:worker:W:rhythm`): a histogram
//! of the silences the worker came back from (and the longest of them exactly), over all its incarnations and every agent that
//! watched it, and since when it is learned. Pure data and its codec; what it means is
//! `crate::hang::policy_rhythm`.
//!
//! NB: why a histogram and not the samples: it is read with the worker's marks every cycle, so
//! it must be small (a few dozen bytes, not 256 numbers), and two agents that watched the same
//! worker (a failover, an agent restarted) merge theirs by the larger count of each bucket
//! without counting a silence twice.

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

/// A learned restart rule (`crate::hang::policy_rhythm::learned_rule`): the worker is stale
/// after `silence` (ms), and its incident persists for `wait` (ms) before the restart. A gang
/// member's entry carries it (`lr`: `{"s": …, "w": …}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Learned {
    #[serde(rename = "s")]
    pub(crate) silence: Millis,
    #[serde(rename = "w")]
    pub(crate) wait: Millis,
}

/// Buckets of the histogram.
pub(crate) const BUCKETS: usize = 48;

/// The longest silence bucket `i` holds (ms): 250 ms × 1.2^i, so a silence is known to within
/// 20 % (rounded up: the learned silence errs long), from a quarter second to 22 minutes; a
/// longer one counts in the last bucket.
pub(crate) fn upper(i: usize) -> Millis {
    (250.0 * 1.2f64.powi(i.min(BUCKETS - 1) as i32)).round() as Millis
}

/// The bucket of a silence of `ms`.
pub(crate) fn bucket(ms: Millis) -> usize {
    (0..BUCKETS).find(|&i| ms <= upper(i)).unwrap_or(BUCKETS - 1)
}

/// The silences a worker came back from, and since when they are learned. (Also, in an agent's
/// memory, the times between the heartbeats it saw: `crate::hang::policy_rhythm::Own::beats`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, educe::Educe)]
#[educe(Default)]
pub(crate) struct History {
    /// When the first of them was learned (ms, the coordinator's clock).
    pub(crate) since: Millis,
    /// The longest of them, exactly (the margin over it is the rule's, not the rounding's); 0
    /// when none is known.
    pub(crate) longest: Millis,
    #[educe(Default(expression = [0; BUCKETS]))]
    counts: [u32; BUCKETS],
}

impl History {
    pub(crate) fn new(since: Millis) -> History {
        History { since, longest: 0, counts: [0; BUCKETS] }
    }

    /// One more silence come back from.
    pub(crate) fn add(&mut self, silence: Millis) {
        let silence = silence.max(0);
        let b = &mut self.counts[bucket(silence)];
        *b = b.saturating_add(1);
        self.longest = self.longest.max(silence);
    }

    /// How many silences are known.
    pub(crate) fn total(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }

    /// Another agent's copy merged in: the larger count of each bucket (the same silence seen
    /// by both is one), the earlier start.
    pub(crate) fn merge(&mut self, other: &History) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine = (*mine).max(*theirs);
        }
        self.since = self.since.min(other.since);
        self.longest = self.longest.max(other.longest);
    }

    /// The `q` quantile of the silences (the bound of its bucket); 0 when none is known.
    pub(crate) fn quantile(&self, q: f64) -> Millis {
        let total = self.total();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        let i = self.counts.iter().position(|&c| {
            seen += u64::from(c);
            seen >= rank
        });
        upper(i.unwrap_or(BUCKETS - 1))
    }

    /// `<since>|<longest>|<bucket>:<count>,…` (the buckets that hold any).
    pub(crate) fn encode(&self) -> String {
        let held = self.counts.iter().enumerate().filter(|(_, &c)| c > 0);
        let counts: Vec<String> = held.map(|(i, c)| format!("{i}:{c}")).collect();
        format!("{}|{}|{}", self.since, self.longest, counts.join(","))
    }

    /// The value `encode` wrote; `None` for anything else (read as no history: the fixed rule).
    pub(crate) fn decode(raw: &str) -> Option<History> {
        let mut parts = raw.splitn(3, '|');
        let mut h = History::new(parts.next()?.parse().ok()?);
        h.longest = parts.next()?.parse().ok().filter(|&l: &Millis| l >= 0)?;
        for pair in parts.next()?.split(',').filter(|p| !p.is_empty()) {
            let (i, c) = pair.split_once(':')?;
            let i: usize = i.parse().ok()?;
            *h.counts.get_mut(i)? = c.parse().ok()?;
        }
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_a_quarter_second_to_22_minutes_within_a_fifth() {
        assert_eq!(upper(0), 250);
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(250), 0);
        assert_eq!(bucket(251), 1);
        assert_eq!(upper(1), 300);
        for i in 1..BUCKETS {
            assert!(upper(i) > upper(i - 1));
            assert!(upper(i) as f64 <= upper(i - 1) as f64 * 1.2 + 1.0);
        }
        assert!(upper(BUCKETS - 1) > 20 * 60_000);
        assert_eq!(bucket(24 * 3_600_000), BUCKETS - 1);
        for ms in [1, 999, 1_000, 1_001, 17_777, 90_000] {
            let b = bucket(ms);
            assert!(ms <= upper(b) && (b == 0 || ms > upper(b - 1)), "{ms}");
        }
    }

    #[test]
    fn the_quantile_errs_long_by_at_most_a_bucket_and_the_longest_is_exact() {
        let mut h = History::new(5);
        assert_eq!((h.quantile(0.99), h.longest, h.total()), (0, 0, 0));
        for _ in 0..99 {
            h.add(1_000);
        }
        h.add(18_000);
        assert_eq!(h.total(), 100);
        assert_eq!(h.quantile(0.99), upper(bucket(1_000)));
        assert_eq!(h.quantile(1.0), upper(bucket(18_000)));
        assert_eq!(h.longest, 18_000);
    }

    #[test]
    fn two_agents_copies_merge_without_counting_a_silence_twice() {
        let mut a = History::new(100);
        let mut b = History::new(50);
        for _ in 0..10 {
            a.add(1_000);
            b.add(1_000);
        }
        b.add(30_000);
        a.merge(&b);
        assert_eq!(a.total(), 11, "the ten silences both saw count once");
        assert_eq!((a.since, a.longest), (50, 30_000));
        let again = a;
        a.merge(&again);
        assert_eq!(a, again, "merging is idempotent");
    }

    #[test]
    fn the_codec_round_trips_and_refuses_what_it_did_not_write() {
        let mut h = History::new(1_700_000_000_000);
        h.add(900);
        h.add(900);
        h.add(45_000);
        let raw = h.encode();
        assert_eq!(raw, format!("1700000000000|45000|{}:2,{}:1", bucket(900), bucket(45_000)));
        assert_eq!(History::decode(&raw), Some(h));
        assert_eq!(History::decode("7|0|").map(|h| (h.since, h.total())), Some((7, 0)));
        for bad in [
            "", "x|0|1:1", "7", "7|0", "7|0|1", "7|0|99:1", "7|0|1:-1", "7|0|a:1", "7|-1|", "7|1:1",
        ] {
            assert_eq!(History::decode(bad), None, "{bad:?}");
        }
    }
}
