//! One backoff for every retry loop in the agent, built on `backon`: exponential from `min` to
//! `max` (factor 2), jittered where many agents may retry the same server at the same moment.
//!
//! Users: the metadata watcher's reconnects, the Node patch's conflict retries, the agent loop
//! after a coordinator error, and the alert webhook's attempts (which the lock TTL budget sums,
//! so that one has no jitter: [`nth_delay`]).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// A stateful backoff: each [`Backoff::next_delay`] is the next step; [`Backoff::reset`] after a
/// success starts over.
#[derive(Debug)]
pub(crate) struct Backoff {
    builder: ExponentialBuilder,
    steps: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    /// `min`, `2·min`, `4·min` … capped at `max`: for one process retrying its own dependency.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff::with(builder(min, max), max)
    }

    /// As [`Backoff::new`], each step plus a random part of itself (`[step, 2·step)`), so agents
    /// started together (a DaemonSet rollout) do not retry in lockstep.
    pub(crate) fn jittered(min: Duration, max: Duration) -> Backoff {
        Backoff::with(builder(min, max).with_jitter(), max.saturating_mul(2))
    }

    fn with(builder: ExponentialBuilder, max: Duration) -> Backoff {
        Backoff { steps: builder.build(), builder, max }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        whole_ms(self.steps.next().unwrap_or(self.max))
    }

    pub(crate) fn reset(&mut self) {
        self.steps = self.builder.build();
    }
}

fn builder(min: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max.max(min))
        .with_factor(2.0)
        .without_max_times()
}

/// The pause before retry `n` (1-based) of a backoff without jitter: deterministic, so a budget
/// can add the pauses up in advance.
pub(crate) fn nth_delay(min: Duration, max: Duration, n: u32) -> Duration {
    if n == 0 {
        return Duration::ZERO;
    }
    whole_ms(builder(min, max).build().nth(n as usize - 1).unwrap_or(max))
}

/// backon multiplies by an `f32` factor: `200.000003ms` is 200 ms.
fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_and_caps_and_starts_over() {
        let mut b = Backoff::new(100 * MS, 800 * MS);
        let got: Vec<_> = (0..6).map(|_| b.next_delay()).collect();
        let want: Vec<_> = [100, 200, 400, 800, 800, 800].map(|m| m * MS).into();
        assert_eq!(got, want);
        b.reset();
        assert_eq!(b.next_delay(), 100 * MS);
    }

    #[test]
    fn jitter_stays_within_one_step_above() {
        let mut b = Backoff::jittered(100 * MS, 800 * MS);
        for step in [100u32, 200, 400, 800, 800, 800] {
            let d = b.next_delay();
            assert!(d >= step * MS && d < 2 * step * MS, "{d:?} for step {step}ms");
        }
    }

    #[test]
    fn nth_delay_is_the_same_sequence_without_state() {
        let d = |n| nth_delay(500 * MS, 8000 * MS, n);
        assert_eq!(d(0), Duration::ZERO);
        assert_eq!(d(1), 500 * MS);
        assert_eq!(d(2), 1000 * MS);
        assert_eq!(d(5), 8000 * MS);
        assert_eq!(d(9), 8000 * MS);
    }
}
