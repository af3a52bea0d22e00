//! Each worker's own rhythm (pure): a silence learned from the silences it has come back from,
//! so a job that beats every second is found hung in seconds, not after `policy.stale_after`.
//!
//! What is learned, and why it cannot hide a hang: the agent sees a worker's record once a cycle.
//! A *sample* is the longest silence (now − heartbeat) observed after one heartbeat, taken only
//! once a newer heartbeat shows the worker came back from it — a silence that has not ended is
//! never learned, so a hung worker never teaches Vigil that hanging is normal. Only silences in
//! `processing` are learned; any other state word (`eval`, `loading`, a `busy(...)` phase) is
//! judged by the fixed rule, and the silence after a record announcing a grace (`busy(...)`) is
//! never a sample, whatever its state. A new incarnation (a restart) starts everything over: the
//! rhythm of a new process may differ.
//!
//! The learned silence is `multiplier` × the `quantile` of the samples, at least `floor`, at
//! least 1.5 × the longest silence the worker came back from in this incarnation (a long phase
//! it does not announce is then not called hung twice), and never more than `stale_after`: it
//! only ever finds a hang sooner. It holds for `processing` records without a grace, once
//! `min_samples` samples are known. The confirming observation then comes after half of it (or
//! `confirm_after`, when shorter). A restart still needs the fixed rule: the last-moment
//! revalidation judges the worker with `stale_after` (`crate::hang::restart`), so learning moves
//! the alert and the incident timer, never a restart before the fixed rule allows one.

use std::borrow::Cow;
use std::collections::VecDeque;

use crate::clock::{ms, Millis};
use crate::config::{LearnedConfig, PolicyConfig};
use crate::hang::model::{WorkerState, WorkerStatus};

/// Samples kept per worker (the newest).
pub(crate) const MAX_SAMPLES: usize = 256;

/// What has been learned of one worker's rhythm in this agent process.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Rhythm {
    /// Silences the worker came back from (ms), newest last.
    samples: VecDeque<Millis>,
    /// The last heartbeat seen, the longest silence observed after it so far, and whether the
    /// record was `processing` (only those silences are learned).
    open: Option<(Millis, Millis, bool)>,
    /// The longest silence in `processing` the worker came back from in this incarnation.
    longest: Millis,
}

impl Rhythm {
    /// One look at the worker's record at `now` (coordinator clock).
    pub(crate) fn observe(&mut self, status: Option<&WorkerStatus>, now: Millis) {
        let Some(s) = status else {
            self.open = None;
            return;
        };
        if s.grace.is_some_and(|g| g > 0) {
            // A busy phase: its silence is announced, not the worker's rhythm (never a sample).
            self.open = None;
            return;
        }
        let Some(hb) = s.heartbeat else {
            self.open = None;
            return;
        };
        let age = (now - hb).max(0);
        let processing = s.state == WorkerState::Processing;
        self.open = match self.open {
            Some((seen, longest, p)) if seen == hb => Some((hb, longest.max(age), p)),
            Some((seen, longest, p)) if hb > seen => {
                if p {
                    self.learn(longest);
                }
                Some((hb, age, processing))
            }
            // No earlier look, or a heartbeat older than the last one (a record rewritten).
            _ => Some((hb, age, processing)),
        };
    }

    fn learn(&mut self, silence: Millis) {
        self.samples.push_back(silence);
        if self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.longest = self.longest.max(silence);
    }

    /// Forget everything (a new incarnation).
    pub(crate) fn reset(&mut self) {
        *self = Rhythm::default();
    }

    /// How many silences are known.
    #[cfg(test)]
    pub(crate) fn samples(&self) -> usize {
        self.samples.len()
    }

    /// The learned silence (ms) under `cfg`, once enough is known; `None`: the fixed rule.
    pub(crate) fn silence(&self, cfg: &PolicyConfig) -> Option<Millis> {
        let l: &LearnedConfig = &cfg.learned;
        if !l.enabled || self.samples.len() < l.min_samples as usize {
            return None;
        }
        let mut sorted: Vec<Millis> = self.samples.iter().copied().collect();
        sorted.sort_unstable();
        let rank = ((sorted.len() as f64 * l.quantile).ceil() as usize).clamp(1, sorted.len());
        let q = sorted[rank - 1];
        let learned = ((q as f64 * l.multiplier) as Millis)
            .max(ms(l.floor))
            .max(self.longest + self.longest / 2);
        Some(learned.min(ms(cfg.stale_after)))
    }
}

/// The policy a worker is judged by: `base`, with its learned silence (when there is one and
/// its record is `processing` without a grace) as `stale_after`, and the confirming
/// observation after at most half of it.
pub(crate) fn judged_by<'a>(
    base: &'a PolicyConfig,
    rhythm: &Rhythm,
    status: Option<&WorkerStatus>,
) -> Cow<'a, PolicyConfig> {
    let plain = status.is_some_and(|s| s.state == WorkerState::Processing && s.grace.is_none());
    match rhythm.silence(base).filter(|_| plain) {
        Some(t) if t < ms(base.stale_after) => {
            let mut c = base.clone();
            c.stale_after = std::time::Duration::from_millis(t as u64);
            c.confirm_after = c.confirm_after.min(c.stale_after / 2);
            Cow::Owned(c)
        }
        _ => Cow::Borrowed(base),
    }
}

#[cfg(test)]
#[path = "policy_rhythm_tests.rs"]
mod tests;
