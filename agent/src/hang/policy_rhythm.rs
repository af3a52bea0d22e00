//! Each worker's own rhythm (pure): a silence learned from the silences it has come back from,
//! so a job that beats every second is found hung in seconds, not after `policy.stale_after`,
//! and — with `policy.learned.restarts` — restarted within a minute of its last beat, not after
//! `policy.restart_delay`.
//!
//! What is learned, and why it cannot hide a hang: the agent sees a worker's record once a cycle.
//! A *sample* is the longest silence (now − heartbeat) observed after one heartbeat, taken only
//! once a newer heartbeat shows the worker came back from it — a silence that has not ended is
//! never learned, so a hung worker never teaches Vigil that hanging is normal. Only silences in
//! `processing` are learned; any other state word (`eval`, `loading`, a `busy(...)` phase) is
//! judged by the fixed rule, and the silence after a record announcing a grace (`busy(...)`) is
//! never a sample, whatever its state. Nor are the first `min_samples` of an incarnation: its
//! compile and warm-up are not the job's rhythm (they are judged by the fixed rule).
//!
//! The samples are the worker's, not one process's: a histogram of them
//! (`crate::hang::model_rhythm::History`) is kept in the coordinator with the worker's marks,
//! over all its incarnations and every agent that watched it, so an unannounced save or a silent
//! evaluation the job survived yesterday, in another incarnation, is not a hang today. A new
//! incarnation (a restart) keeps that history but is judged by the fixed rule until it has shown
//! this agent `min_samples` silences past its settling (a compile, a warm-up, a new program with
//! another rhythm, an agent just restarted: the fixed rule), and a restart allows it at least
//! 1.5 × the longest of those. A copy gone from the coordinator after this agent wrote one is
//! gone for the agent too: the coordinator's copy is the history.
//!
//! The learned silence is `multiplier` × the `quantile` of the samples, at least `floor`, at
//! least 1.5 × the longest silence the worker ever came back from (a long phase it does not
//! announce is then not called hung twice), at least 1.5 × the median time between the
//! heartbeats this agent saw ([`Own::beats`]), and never more than `stale_after`: it only ever finds
//! a hang sooner. It holds for `processing` records without a grace. The confirming observation
//! then comes after half of it (or `confirm_after`, when shorter).
//!
//! A restart from it ([`restart_policy`]) asks more, and only of what the coordinator holds
//! (never of what one process saw and did not write): `learned.restarts` on, the history learned
//! for at least `learned.history` (a rare phase — an hourly save — is in it), and the silence
//! computed from the coordinator's copy alone; then the incident persists for the worker's usual
//! silence (`multiplier` × `quantile`, at least `floor`, at most `restart_delay`) before the
//! restart, and the last-moment revalidation judges the fresh record by the same copy, read
//! again. A restart so comes at the earliest when the silence is 1.5 × the longest the worker
//! ever survived, plus the confirming observation, plus its usual silence. Anything short of that: the
//! fixed rule, `stale_after` and `restart_delay`, as without learning.
//!
//! A gang member is judged by the fixed rule for its own verdict; the learned rule its agent
//! holds for it ([`learned_rule`]) rides in its entry of the gang's view, and the gang restarts
//! on it only when every member's entry carries one (`crate::hang::policy_gang::learned_stop`).

use std::borrow::Cow;
use std::time::Duration;

use crate::clock::{ms, Millis};
use crate::config::PolicyConfig;
use crate::hang::model::{WorkerState, WorkerStatus};
use crate::hang::model_rhythm::History;
pub(crate) use crate::hang::model_rhythm::Learned;

/// How often an agent writes what it learned back to the coordinator (with its cycle's batch):
/// at most this often per worker, and only when it learned something since — at once when the
/// longest silence grew (the sample a restart most depends on).
pub(crate) const WRITE_EVERY: Millis = 60_000;

/// What has been learned of one worker's rhythm: the coordinator's history with this agent's
/// samples merged in, and what this agent saw of the worker's current incarnation.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Rhythm {
    /// Silences the worker came back from, in any incarnation (ours merged with the
    /// coordinator's).
    history: Option<History>,
    /// The incarnation the samples below are of (`crate::hang::marks::incarnation`).
    incarnation: Option<String>,
    /// Samples this agent took of the current incarnation (the settling ones too).
    fresh: u32,
    /// Those it learned (past the settling), and the longest of them.
    own: Own,
    /// The last heartbeat seen, the longest silence observed after it so far, and whether the
    /// record was `processing` (only those silences are learned).
    open: Option<(Millis, Millis, bool)>,
    /// When this agent last wrote the history back, how many samples it held then and its
    /// longest.
    written: Option<(Millis, u64, Millis)>,
}

/// What one agent learned of a worker's current incarnation itself: how many silences (past
/// its settling), the longest, and how far apart the heartbeats it saw were.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Own {
    pub(crate) samples: u32,
    pub(crate) longest: Millis,
    /// How far apart the heartbeats it saw were, on the silences' histogram.
    ///
    /// NB: a silence is sampled as the agent sees it (the age of a heartbeat at its looks), which
    /// is short of the worker's real silence when the looks fall just after the beats: a worker
    /// beating every 15 s looked at every 15 s, in step, shows ages of a second. The time
    /// between two heartbeats seen one after the other is never shorter than the worker's real
    /// beat, so a learned silence is never under 1.5 × their median ([`Own::beat_margin`]):
    /// looks in step with the beats teach no silence the worker's next late beat would break.
    pub(crate) beats: History,
}

impl Own {
    /// The least learned silence the beats this agent saw allow: 1.5 × their median gap.
    pub(crate) fn beat_margin(&self) -> Millis {
        let m = self.beats.quantile(0.5);
        m + m / 2
    }
}

impl Rhythm {
    /// One look at the worker's record at `now` (coordinator clock). The first `settle`
    /// samples of an incarnation only count towards its settling (a compile, a warm-up: judged
    /// by the fixed rule, and not the job's rhythm); the later ones are learned.
    pub(crate) fn observe(&mut self, status: Option<&WorkerStatus>, now: Millis, settle: u32) {
        // NB: a busy phase (a grace): its silence is announced, not the worker's rhythm (never a
        // sample). Nor is anything with no record or no heartbeat.
        let unannounced = status.filter(|s| s.grace.is_none_or(|g| g <= 0));
        let Some((s, hb)) = unannounced.and_then(|s| Some((s, s.heartbeat?))) else {
            self.open = None;
            return;
        };
        let age = (now - hb).max(0);
        // A newer heartbeat ends the silence after the last one: learned, if it was processing.
        if let Some((seen, longest, true)) = self.open.filter(|&(seen, _, _)| hb > seen) {
            self.learn(longest, hb - seen, now, settle);
        }
        self.open = match self.open {
            Some((seen, longest, p)) if seen == hb => Some((hb, longest.max(age), p)),
            // A newer heartbeat, no earlier look, or one older than the last (a record rewritten).
            _ => Some((hb, age, s.state == WorkerState::Processing)),
        };
    }

    fn learn(&mut self, silence: Millis, gap: Millis, now: Millis, settle: u32) {
        if self.fresh >= settle {
            self.history.get_or_insert_with(|| History::new(now)).add(silence);
            self.own.samples = self.own.samples.saturating_add(1);
            self.own.longest = self.own.longest.max(silence);
            self.own.beats.add(gap);
        }
        self.fresh = self.fresh.saturating_add(1);
    }

    /// The coordinator's copy (read with the worker's marks this cycle) merged in. NB: a copy
    /// gone after this agent wrote one (deleted by an operator, lost in a failover, or a write
    /// that failed) is gone for this agent too: the coordinator's copy is the worker's history,
    /// and what this agent alone remembers must not bring it back.
    pub(crate) fn adopt(&mut self, shared: Option<&History>) {
        match (shared, &mut self.history) {
            (None, _) if self.written.is_some() => (self.history, self.written) = (None, None),
            (None, _) => {}
            (Some(theirs), Some(mine)) => mine.merge(theirs),
            (Some(theirs), None) => self.history = Some(*theirs),
        }
    }

    /// The worker's incarnation at this look: a new one starts its own samples over (the
    /// worker's history stays), whoever recorded it and whenever this agent first sees it.
    pub(crate) fn see_incarnation(&mut self, incarnation: &str) {
        if self.incarnation.as_deref() != Some(incarnation) {
            self.new_incarnation();
            self.incarnation = Some(incarnation.to_string());
        }
    }

    /// A new incarnation (or our restart booting): its own samples start over, the worker's
    /// history stays.
    pub(crate) fn new_incarnation(&mut self) {
        (self.open, self.fresh, self.own) = (None, 0, Own::default());
    }

    /// How many silences are known, in any incarnation.
    #[cfg(test)]
    pub(crate) fn samples(&self) -> u64 {
        self.history.as_ref().map_or(0, History::total)
    }

    /// What this agent learned of the current incarnation itself.
    pub(crate) fn own(&self) -> Own {
        self.own
    }

    /// The learned silence (ms) under `cfg`, once enough is known (in the worker's history, and
    /// by this agent of the current incarnation past its settling); `None`: the fixed rule.
    pub(crate) fn silence(&self, cfg: &PolicyConfig) -> Option<Millis> {
        let l = &cfg.learned;
        if !l.enabled || self.own.samples < l.min_samples {
            return None;
        }
        let s = silence_of(self.history.as_ref()?, &self.own, cfg)?.silence;
        Some(s.min(ms(cfg.stale_after)))
    }

    /// The history to write back with this cycle's batch (`P:{N}:worker:W:rhythm`): when this
    /// agent learned something since it last wrote, at most every [`WRITE_EVERY`] — at once
    /// when the longest silence grew.
    pub(crate) fn write_due(&mut self, now: Millis) -> Option<String> {
        let h = self.history.as_ref()?;
        let (total, longest) = (h.total(), h.longest);
        let learned_since = |(at, n, l)| total > n && (now - at >= WRITE_EVERY || longest > l);
        if !self.written.is_none_or(learned_since) {
            return None;
        }
        self.written = Some((now, total, longest));
        Some(h.encode())
    }
}

/// The rule `history` teaches under `cfg` (see the module's text), with what this agent saw of
/// the current incarnation (`own`), uncapped (the verdict caps its silence at `stale_after`, a
/// restart needs it under and waits at most `restart_delay`): stale after the worker's usual
/// silence, at least 1.5 × the longest silence it came back from (in the history or seen by this
/// agent) and 1.5 × the time between the heartbeats this agent saw; its incident persisting for
/// the usual silence (`multiplier` × the `quantile` of its silences, at least `floor`: a learned
/// hang's restart waits as long again, the persistence learned from its rhythm). `None` while
/// fewer than `min_samples` are known. One rule for the verdict ([`Rhythm::silence`]) and the
/// restart ([`learned_rule`]).
pub(crate) fn silence_of(history: &History, own: &Own, cfg: &PolicyConfig) -> Option<Learned> {
    let l = &cfg.learned;
    if history.total() < u64::from(l.min_samples) {
        return None;
    }
    let usual = ((history.quantile(l.quantile) as f64 * l.multiplier) as Millis).max(ms(l.floor));
    let longest = history.longest.max(own.longest);
    Some(Learned { silence: usual.max(longest + longest / 2).max(own.beat_margin()), wait: usual })
}

/// The policy a worker is judged by: `base`, with its learned silence (when there is one and
/// its record is `processing` without a grace) as `stale_after`, and the confirming
/// observation after at most half of it.
///
/// NB: a gang member's own verdict (its entry's `v`) keeps `base`, the fixed rule: one member
/// stopped on its learned silence beside members judged by the fixed one would read as a
/// straggler. Its learned rule rides in its entry (`Member::learned`), and the gang decides on
/// learned evidence only when every member's has one.
pub(crate) fn judged_by<'a>(
    base: &'a PolicyConfig,
    rhythm: &Rhythm,
    status: Option<&WorkerStatus>,
) -> Cow<'a, PolicyConfig> {
    let plain = status.is_some_and(|s| s.state == WorkerState::Processing && s.grace.is_none());
    let alone = status.is_some_and(|s| s.gang.is_none());
    match rhythm.silence(base).filter(|_| plain && alone) {
        Some(t) if t < ms(base.stale_after) => Cow::Owned(stale_after(base, t)),
        _ => Cow::Borrowed(base),
    }
}

/// `base` judging by a learned silence of `t` ms: stale after it, the confirming observation
/// after at most half of it.
fn stale_after(base: &PolicyConfig, t: Millis) -> PolicyConfig {
    let mut c = base.clone();
    c.stale_after = Duration::from_millis(t as u64);
    c.confirm_after = c.confirm_after.min(c.stale_after / 2);
    c
}

/// The learned rule a hang's restart may stand on, if any: when `learned.restarts` is on, the
/// record is plain `processing` (no grace), this agent learned `min_samples` silences of the
/// worker's current incarnation past its settling (`own`: a new program with another rhythm
/// shows it first), and the coordinator's history (`shared`, read with the marks in this pass)
/// spans `learned.history` and teaches a silence shorter than `stale_after` — that silence, and
/// the worker's usual silence (`multiplier` × `quantile`, at least `floor`, at most
/// `restart_delay`) as the wait. `None`: the fixed rule. Never slower than it.
///
/// NB: only the coordinator's copy counts here, never this process's samples: a restart must
/// stand on what every instance reads (an agent that learned alone and died, or a copy lost in
/// a failover, leaves the fixed rule).
pub(crate) fn learned_rule(
    base: &PolicyConfig,
    shared: Option<&History>,
    own: Own,
    status: Option<&WorkerStatus>,
    now: Millis,
) -> Option<Learned> {
    let l = &base.learned;
    let plain = status.is_some_and(|s| s.state == WorkerState::Processing && s.grace.is_none());
    let trusted = l.enabled && l.restarts && plain && own.samples >= l.min_samples;
    let h = shared.filter(|_| trusted).filter(|h| now - h.since >= ms(l.history))?;
    // NB: `own` counts whether or not the coordinator's copy holds its samples yet.
    let rule = silence_of(h, &own, base)?;
    (rule.silence < ms(base.stale_after))
        .then(|| Learned { wait: rule.wait.min(ms(base.restart_delay)), ..rule })
}

/// The policy a worker's own restart is judged by: `base` (the fixed rule), or its
/// [`learned_rule`]. A gang member's restart is its gang's decision (`policy_gang::due_on`:
/// on learned evidence only when every member's agent holds a learned rule): judged alone (a
/// straggler's), it keeps the fixed rule.
pub(crate) fn restart_policy<'a>(
    base: &'a PolicyConfig,
    shared: Option<&History>,
    own: Own,
    status: Option<&WorkerStatus>,
    now: Millis,
) -> Cow<'a, PolicyConfig> {
    let alone = status.is_some_and(|s| s.gang.is_none());
    by_rule(base, learned_rule(base, shared, own, status, now).filter(|_| alone))
}

/// `base` under `rule`: its silence as `stale_after` (the confirming observation after at most
/// half of it), its wait as `restart_delay`; `base` itself without one.
pub(crate) fn by_rule(base: &PolicyConfig, rule: Option<Learned>) -> Cow<'_, PolicyConfig> {
    let Some(r) = rule else { return Cow::Borrowed(base) };
    let mut c = stale_after(base, r.silence);
    c.restart_delay = Duration::from_millis(r.wait.max(0) as u64);
    Cow::Owned(c)
}

#[cfg(test)]
#[path = "policy_rhythm_tests.rs"]
mod tests;
