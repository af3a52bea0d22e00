//! A gang member's pace (pure; issue 45, fail-slow): its steps per second against the baseline
//! it has shown, so a job that slows down — every rank beating and progressing, but at a
//! fraction of its speed, because one GPU clocks down or one host is starved — is found, and
//! the member that slows it is named when its evidence says so (never a guess).
//!
//! What is measured: the worker's own step (`progress` as a step, or `checkpoint_step`) at each
//! heartbeat, on the heartbeats' clock. A *window* closes once `gang.pace.window` has passed and
//! the worker got `gang.pace.min_steps` steps further (or ten windows passed: a very slow job); its
//! rate is steps over seconds. In a synchronous collective every rank runs at the slowest rank's
//! pace, so each member's agent measures the gang's pace from its own member, with no read of
//! the others.
//!
//! What is never a sample: a window in which the worker announced a grace (a long operation),
//! left `processing`, was not healthy by its own agent's verdict (suspect, hung, booting...), its
//! node stood down (maintenance, a checkpoint round, a shutdown), or its container started less
//! than `gang.pace.warmup` ago (compile, warm-up after a restart): the measure starts again at
//! the first look after it, and a run of slow windows is paused, not ended (the window open when
//! the hold began is judged when it lasted half a window with `min_steps` steps). A window with no
//! step at all (stopped is the hang path's, not slow) and a step gone back (a restart) end the
//! run.
//!
//! The verdict: the first `learn_windows` rates teach the baseline (their mean), later rates at
//! or above the recovery line move it (a tenth each); a rate below `slow_fraction` × baseline
//! starts (or continues) a run of slow windows, and a run of `slow_for` is *slow*. Slow ends at a
//! window at or above the recovery line, halfway between the slow line and the baseline. A slow
//! rate never teaches the baseline.

use std::collections::HashMap;

use crate::clock::{ms, Millis};
use crate::config::PaceConfig;
use crate::hang::model_gang::{Member, PaceKept};

/// What this agent has measured of one worker's pace, in this process.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Pace {
    /// The open window's start: (heartbeat, step).
    anchor: Option<(Millis, u64)>,
    /// The open window's last look: (heartbeat, step).
    last: Option<(Millis, u64)>,
    /// The last closed window's rate, steps per second.
    pub(crate) rate: Option<f64>,
    /// The learned rate, steps per second, and how many windows taught it.
    pub(crate) baseline: Option<f64>,
    samples: u32,
    /// The run of slow windows: where it began (the first slow window's start), and how many
    /// windows it has (a run is slow only with enough of them: one long window, an unannounced
    /// save, is not a run).
    slow: Option<(Millis, u32)>,
    /// Up to when the time a slow run lost has been counted.
    counted: Option<Millis>,
    /// The gang measured: a worker id that moves to another job starts over.
    gang: Option<String>,
    /// This run's slow episode was seen open (by this agent or another): asked again only
    /// once half its lease passed since `asked` (an episode whose opener is gone lapses).
    pub(crate) episode_seen: bool,
    pub(crate) asked: Millis,
    /// The open slow episode names this worker as the member its gang waits for: (gang, what
    /// the Node's `VigilSlow` condition says).
    pub(crate) named: Option<(String, crate::vocab::node::Named)>,
    /// The episode's member was heard named (someone else): no more reads of it this run.
    pub(crate) heard: bool,
    /// The pace kept in the member's entry was asked for (once per gang followed).
    pub(crate) resumed: bool,
    /// The worker's last compute times (ms), one per heartbeat its records said one with: the
    /// entry carries their median ([`Pace::compute`]).
    computes: Vec<(Millis, Millis)>,
}

/// How many of a worker's last compute times the median in its entry is of.
pub(crate) const COMPUTES: usize = 5;

/// Where a worker's pace stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PaceVerdict {
    /// Nothing measured yet, or still learning the baseline.
    Learning,
    /// At its pace (or slow for less than `slow_for`).
    Steady,
    /// Below `slow_fraction` of its baseline for `slow_for`, since `since`.
    Slow { since: Millis, rate: f64, baseline: f64 },
    /// Back at or above the recovery line in its last window.
    Recovered { rate: f64, baseline: f64 },
}

/// One look at a worker: its step `step` at heartbeat `hb`; `held` when this window must not
/// count (see the module).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Look {
    pub(crate) hb: Millis,
    pub(crate) step: u64,
    pub(crate) held: bool,
}

impl Pace {
    /// Nothing of a slow episode is this worker's (pace off, no gang): not named, not asked.
    pub(crate) fn forget_episode(&mut self) {
        (self.episode_seen, self.heard, self.named) = (false, false, None);
    }

    /// The gang measured is `gang`: a worker id now in another gang starts over.
    pub(crate) fn follow(&mut self, gang: &str) {
        if self.gang.as_deref() != Some(gang) {
            *self = Pace { gang: Some(gang.to_string()), ..Pace::default() };
        }
    }

    /// The learned pace to keep in the member's entry: only a baseline its `learn_windows`
    /// windows taught.
    pub(crate) fn kept(&self, cfg: &PaceConfig) -> Option<PaceKept> {
        let base = self.baseline.filter(|_| self.samples >= cfg.learn_windows)?;
        let micro = (base * 1e6).round() as u64;
        (micro > 0).then_some(PaceKept { micro, windows: self.samples })
    }

    /// Go on from the pace `kept` in the member's entry (an agent restarted, or a worker newly
    /// watched on this node), once: only a learned one, and only before this agent learned
    /// anything itself. Without it the first `learn_windows` windows teach the baseline — in
    /// a slow run, the slow pace.
    pub(crate) fn resume(&mut self, kept: Option<PaceKept>, cfg: &PaceConfig) {
        self.resumed = true;
        let fresh = self.samples == 0;
        if let Some(k) = kept.filter(|k| fresh && k.windows >= cfg.learn_windows && k.micro > 0) {
            (self.baseline, self.samples) = (Some(k.micro as f64 / 1e6), k.windows);
        }
    }

    /// The compute time (ms) the member's entry says: the lower median of the last [`COMPUTES`]
    /// its records said (one per heartbeat), so that one noisy step — a pause, a collective that
    /// caught a late rank — names no rank, and one good step among slow ones hides none once
    /// three are held (the two-process JAX job named nobody once on one sample). `took`: the
    /// compute time the record at heartbeat `hb` says; `None` once the record says none.
    pub(crate) fn compute(&mut self, hb: Option<Millis>, took: Option<Millis>) -> Option<Millis> {
        let Some(c) = took else {
            self.computes.clear();
            return None;
        };
        let Some(hb) = hb else { return Some(c) };
        if self.computes.last().is_none_or(|(at, _)| *at != hb) {
            self.computes.push((hb, c));
            if self.computes.len() > COMPUTES {
                self.computes.remove(0);
            }
        }
        let mut values: Vec<Millis> = self.computes.iter().map(|(_, c)| *c).collect();
        values.sort_unstable();
        // The lower median: of two, the smaller (one noisy step names nobody).
        values.get(values.len().saturating_sub(1) / 2).copied()
    }

    /// Fold one look in (`None`: no heartbeat or no step: nothing to measure).
    pub(crate) fn observe(&mut self, look: Option<Look>, cfg: &PaceConfig) {
        let Some(l) = look.filter(|l| !l.held) else {
            // NB: a held window is no sample and ends no run: the measure starts again at the
            // first look after it (a checkpoint in the middle of a slow run pauses it). What
            // the open window measured before it counts when it is half a window or more.
            if look.is_some() {
                self.close_before_hold(cfg);
            }
            (self.anchor, self.last, self.rate) = (None, None, None);
            return;
        };
        let Some((hb0, step0)) = self.anchor else {
            self.anchor = Some((l.hb, l.step));
            return;
        };
        let gone_back = l.step < step0 || l.hb < hb0;
        let (dt, ds) = (l.hb - hb0, l.step.saturating_sub(step0));
        let window = ms(cfg.window);
        if !gone_back && (dt < window || (ds < u64::from(cfg.min_steps) && dt < 10 * window)) {
            self.last = Some((l.hb, l.step));
            return;
        }
        (self.anchor, self.last) = (Some((l.hb, l.step)), None);
        if gone_back || ds == 0 {
            // NB: a restarted measure (a step gone back: a restart; no step at all: stopped, not
            // slow, the hang path's) also forgets the run and the last rate: a worker not
            // measured now says nothing of the gang's pace.
            (self.slow, self.rate) = (None, None);
            return;
        }
        let rate = ds as f64 / (dt as f64 / 1000.0);
        self.rate = Some(rate);
        self.judge(rate, hb0, cfg);
    }

    /// A hold begins: the open window, up to its last look, is judged when it lasted half a
    /// window or more with `min_steps` steps (an announced checkpoint in a slow run then costs
    /// the run only its own time, not the window before it too).
    fn close_before_hold(&mut self, cfg: &PaceConfig) {
        let (Some((hb0, step0)), Some((hb1, step1))) = (self.anchor, self.last) else { return };
        let (dt, ds) = (hb1 - hb0, step1.saturating_sub(step0));
        if 2 * dt >= ms(cfg.window) && ds >= u64::from(cfg.min_steps).max(1) {
            self.judge(ds as f64 / (dt as f64 / 1000.0), hb0, cfg);
        }
    }

    fn judge(&mut self, rate: f64, window_start: Millis, cfg: &PaceConfig) {
        let Some(base) = self.baseline.filter(|_| self.samples >= cfg.learn_windows) else {
            let n = f64::from(self.samples);
            self.baseline = Some((self.baseline.unwrap_or(0.0) * n + rate) / (n + 1.0));
            self.samples += 1;
            return;
        };
        if rate < cfg.slow_fraction * base {
            self.slow.get_or_insert((window_start, 0)).1 += 1;
            return;
        }
        self.slow = None;
        // Every window at pace teaches (none dropped: no bias upwards), clipped so that one
        // burst (a checkpoint step jumping ahead) moves it little.
        let taught = rate.min(1.2 * base);
        self.baseline = Some(0.9 * base + 0.1 * taught);
    }

    /// The verdict at `now`.
    pub(crate) fn verdict(&self, now: Millis, cfg: &PaceConfig) -> PaceVerdict {
        let base = self.baseline.filter(|_| self.samples >= cfg.learn_windows);
        let (Some(rate), Some(baseline)) = (self.rate, base) else { return PaceVerdict::Learning };
        let windows = (ms(cfg.slow_for) / ms(cfg.window).max(1)).max(1) as u32;
        // The recovery line, halfway between the slow line and the baseline: a slow episode ends
        // only well clear of it.
        let recovery = (1.0 + cfg.slow_fraction) / 2.0 * baseline;
        match self.slow {
            Some((since, run)) if now - since >= ms(cfg.slow_for) && run >= windows => {
                PaceVerdict::Slow { since, rate, baseline }
            }
            None if rate >= recovery => PaceVerdict::Recovered { rate, baseline },
            // A run not slow for long enough yet, or a window below the recovery line.
            _ => PaceVerdict::Steady,
        }
    }

    /// The time lost to slowness since it was last counted (ms of the worker's time): while
    /// slow, the deficit against the baseline — a worker at 70 % of its pace loses 0.3 s a
    /// second — counted from the slow run's start; nothing otherwise.
    pub(crate) fn deficit(&mut self, verdict: PaceVerdict, now: Millis) -> Millis {
        let PaceVerdict::Slow { since, rate, baseline } = verdict else {
            self.counted = None;
            return 0;
        };
        let from = self.counted.unwrap_or(since).max(since);
        self.counted = Some(now);
        let share = (1.0 - rate / baseline).clamp(0.0, 1.0);
        ((now - from).max(0) as f64 * share).round() as Millis
    }
}

/// The member a slow gang waits for, and why — only where its evidence stands out: the rank
/// that computes longest before each collective (its record's `compute_ms`: the others wait for
/// it), a node signal of slowness only it shows (a GPU clocked down: throttle reasons), a step
/// that lags the others'. `None` when nothing stands out: never a guess. (The agent asks
/// [`suspect_scored`]; this is the tests' and the replays' view of it.)
#[cfg(any(test, feature = "bench"))]
pub(crate) fn suspect(members: &[Member]) -> Option<(&Member, Vec<String>)> {
    suspect_scored(members).map(|(m, why, _)| (m, why))
}

/// Evidence that scores this much names a member firmly enough to evict its node's pods
/// (`gang.pace.taint = "NoExecute"`): its compute time, or two signals that agree — where its
/// node shows a slowdown no workload causes (`crate::hang::restart::gang_pace`).
pub(crate) const STRONG: u32 = 2;

/// The member a slow gang waits for (`suspect`: the tests' and the replays' view), with the
/// evidence's score: compute time 2 points, a node signal or a lag 1 each.
pub(crate) fn suspect_scored(members: &[Member]) -> Option<(&Member, Vec<String>, u32)> {
    let mut signalled: Vec<&Member> = members.iter().filter(|m| !m.slow.is_empty()).collect();
    // A node signal counts only where a minority of the gang's nodes show it.
    if signalled.len() * 2 >= members.len() {
        signalled.clear();
    }
    let signals =
        signalled.into_iter().map(|m| (m, 1, format!("its node shows {}", m.slow.join(", "))));
    let evidence = computes_longest(members).into_iter().chain(signals).chain(lags(members));
    let mut score: HashMap<String, (u32, Vec<String>)> = HashMap::new();
    for (m, points, why) in evidence {
        let e = score.entry(m.id()).or_default();
        e.0 += points;
        e.1.push(why);
    }
    let best = score.values().map(|(p, _)| *p).max()?;
    let mut top = score.iter().filter(|(_, (p, _))| *p == best);
    // One member alone at the top, or nobody is named.
    let (Some((id, (points, why))), None) = (top.next(), top.next()) else { return None };
    let m = members.iter().find(|m| &m.id() == id)?;
    Some((m, why.clone(), *points))
}

/// The member whose compute time before the collective is at least a fifth (and 20 ms) above
/// the others' median, with its 2 points.
fn computes_longest(members: &[Member]) -> Option<(&Member, u32, String)> {
    let mut timed: Vec<_> = members.iter().filter_map(|m| m.compute.map(|c| (m, c))).collect();
    timed.sort_by_key(|(_, c)| *c);
    let (&(m, top), others) = timed.split_last()?;
    // NB: `?`: with no other member timed, there is nothing to stand out from.
    let median = others.get(others.len() / 2)?.1;
    let second = others.last().map_or(median, |(_, c)| *c);
    // NB: it must stand alone: among thousands of ranks the largest of one sample each is
    // routinely a fifth above the median; the one the others wait for is far above the next.
    let alone = top - second >= (top - median) / 2;
    let why = format!("it computes {top} ms before each collective, the others {median} ms (median): they wait for it");
    (top * 5 >= median * 6 && top - median >= 20 && alone).then_some((m, 2, why))
}

/// The member whose step lags every other's by at least 2 although it beat no earlier than
/// they did (entries are written at different times: an older entry's lower step is no lag),
/// with its 1 point.
fn lags(members: &[Member]) -> Option<(&Member, u32, String)> {
    let mut stepped: Vec<(&Member, u64, Millis)> =
        members.iter().filter_map(|m| Some((m, m.step?, m.heartbeat?))).collect();
    stepped.sort_by_key(|(_, s, _)| *s);
    let [(m, low, hb), ref others @ ..] = stepped[..] else { return None };
    // NB: `?`: a lag needs at least two stepped members (the first has none to lag).
    let next = others.first()?.1;
    let latest_other = others.iter().map(|(_, _, h)| *h).max()?;
    (next >= low + 2 && hb >= latest_other)
        .then(|| (m, 1, format!("its step {low} lags the others' (from {next})")))
}

#[cfg(test)]
#[path = "policy_pace_tests.rs"]
mod tests;
