//! A gang's step traces replayed through the real pace verdict and the real suspect rule (pure,
//! simulated time; `crate::hang::policy_pace`): how soon a slowdown is found, whether the member
//! that causes it is named, and how many slow episodes a healthy job draws. The benchmark
//! `scripts/bench-pace.sh` prints the figures; the tests below hold the goals.
//!
//! The model: a synchronous job of `ranks` ranks. Each step every rank computes (its own time,
//! with jitter), then the collective waits for the slowest: the step ends for every rank at once.
//! Now and then a data loader stalls every rank for a few steps; an evaluation stops the steps
//! (announced with a grace, or silent in `processing`); a checkpoint is announced with a grace;
//! the job starts with a compile announced with a grace. A slowdown from `at` makes one rank
//! compute `1 / factor` times longer (its GPU clocked down: its node may show it). Each rank's
//! agent looks every `poll`: the step and the heartbeat of the last step that ended.

use crate::clock::Millis;
use crate::config::PaceConfig;
use crate::hang::model_gang::Member;
use crate::hang::policy_pace::{suspect, Look, Pace, PaceVerdict};
use crate::hang::replay::Rng;

/// The shape of a gang's job.
#[derive(Debug, Clone)]
pub struct GangShape {
    pub ranks: usize,
    /// A step's usual length (ms) and its jitter (a fraction, the standard deviation).
    pub step: Millis,
    pub jitter: f64,
    /// One step in this many stalls every rank for 2–5 steps' time.
    pub stall_one_in: u64,
    /// An evaluation every this many steps (0: none), this long (ms), announced or silent.
    pub eval_every: u64,
    pub eval: Millis,
    pub eval_announced: bool,
    /// An announced checkpoint every this many steps (0: none), this long (ms).
    pub checkpoint_every: u64,
    pub checkpoint: Millis,
    /// The compile at the start (ms), announced.
    pub compile: Millis,
}

impl GangShape {
    /// Eight ranks of 1 s steps (10 % jitter, 1 in 500 stalls), a 90 s evaluation every 1,000
    /// steps, a 45 s checkpoint every 3,000, a 3 min compile.
    pub fn one_second_steps(ranks: usize, eval_announced: bool) -> GangShape {
        GangShape {
            ranks,
            step: 1_000,
            jitter: 0.1,
            stall_one_in: 500,
            eval_every: 1_000,
            eval: 90_000,
            eval_announced,
            checkpoint_every: 3_000,
            checkpoint: 45_000,
            compile: 180_000,
        }
    }
}

/// One rank slowed from `at`: it computes `1 / factor` times longer.
#[derive(Debug, Clone, Copy)]
pub struct Slowdown {
    pub at: Millis,
    pub factor: f64,
    pub rank: usize,
    /// Every rank publishes its compute time (`compute_ms`).
    pub compute_published: bool,
    /// The slowed rank's node shows it (NVML `hw-slowdown`).
    pub signal: bool,
}

/// What a replay saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PaceOutcome {
    /// Each slow episode's start as a rank's agent found it (a rank's verdict `slow`, none open).
    pub episodes: Vec<Millis>,
    /// The rank the first episode named, if any.
    pub named: Option<usize>,
}

/// One step's end, as every rank's record says it: when, which step, whether announced, and
/// each rank's compute time in it.
struct StepEnd {
    at: Millis,
    step: u64,
    held: bool,
    compute: Vec<Millis>,
}

/// One step starting at `t`: its length and each rank's compute time in it. The collective ends
/// when the slowest rank has computed (80 % of a step is compute); the slowed rank makes every
/// step 1 / factor as long (the gang at `factor` of its pace: a 20 % slowdown is 0.8), computing
/// all but the collective of it; now and then a data loader stalls every rank.
fn one_step(
    shape: &GangShape,
    slow: Option<Slowdown>,
    t: Millis,
    rng: &mut Rng,
) -> (Millis, Vec<Millis>) {
    let mut compute: Vec<Millis> = (0..shape.ranks)
        .map(|_| {
            let j = (1.0 + shape.jitter * rng.normal()).clamp(0.5, 2.0);
            (shape.step as f64 * 0.8 * j) as Millis
        })
        .collect();
    let slowest = compute.iter().copied().max().unwrap_or(0);
    let mut len = slowest + shape.step / 5;
    if let Some(s) = slow.filter(|s| t >= s.at) {
        len = (len as f64 / s.factor) as Millis;
        compute[s.rank] = len - shape.step / 5;
    }
    if shape.stall_one_in > 0 && rng.next().is_multiple_of(shape.stall_one_in) {
        len += shape.step * (2 + (rng.next() % 4) as Millis);
    }
    (len, compute)
}

/// The gang's step ends from 0 to `end`.
fn steps(shape: &GangShape, slow: Option<Slowdown>, seed: u64, end: Millis) -> Vec<StepEnd> {
    let mut rng = Rng(seed.max(1));
    let mut out =
        vec![StepEnd { at: shape.compile, step: 0, held: true, compute: vec![0; shape.ranks] }];
    let (mut t, mut step) = (shape.compile, 0u64);
    while t < end {
        step += 1;
        let (len, compute) = one_step(shape, slow, t, &mut rng);
        t += len;
        out.push(StepEnd { at: t, step, held: false, compute });
        // NB: an announced phase writes its state (a grace) as it begins, `processing` as it
        // ends; a silent evaluation writes nothing until the next step.
        let phases = [
            (shape.eval_every, shape.eval, shape.eval_announced),
            (shape.checkpoint_every, shape.checkpoint, true),
        ];
        for (every, long, announced) in phases {
            if every > 0 && step.is_multiple_of(every) {
                let last = out.last().map(|s| s.compute.clone()).unwrap_or_default();
                if announced {
                    let held = StepEnd { at: t + 1, step, held: true, compute: last.clone() };
                    out.push(held);
                }
                t += long;
                if announced {
                    out.push(StepEnd { at: t, step, held: false, compute: last });
                }
            }
        }
    }
    out
}

/// Every rank's agent looking every `poll` ms from 0 to `end`: its pace measured, a slow
/// episode opened when a rank's verdict is slow and none is open (naming a member from every
/// rank's entry as the real rule does), closed when a rank is back at its pace.
pub fn replay_gang(
    shape: &GangShape,
    slow: Option<Slowdown>,
    seed: u64,
    end: Millis,
    poll: Millis,
    cfg: &PaceConfig,
) -> PaceOutcome {
    let ends = steps(shape, slow, seed, end);
    let mut paces = vec![Pace::default(); shape.ranks];
    let mut out = PaceOutcome::default();
    let (mut open, mut next, mut now) = (false, 0, poll);
    while now <= end {
        while next < ends.len() && ends[next].at <= now {
            next += 1;
        }
        let Some(last) = next.checked_sub(1).map(|i| &ends[i]) else {
            now += poll;
            continue;
        };
        let look = Look { hb: last.at, step: last.step, held: last.held };
        let mut verdicts = Vec::with_capacity(shape.ranks);
        for p in paces.iter_mut() {
            p.observe(Some(look), cfg);
            verdicts.push(p.verdict(now, cfg));
        }
        let slow_now = verdicts.iter().any(|v| matches!(v, PaceVerdict::Slow { .. }));
        if slow_now && !open {
            open = true;
            out.episodes.push(now);
            if out.named.is_none() && out.episodes.len() == 1 {
                out.named = named(shape, slow, last);
            }
        }
        if open && verdicts.iter().any(|v| matches!(v, PaceVerdict::Recovered { .. })) {
            open = false;
        }
        now += poll;
    }
    out
}

/// The rank the real rule names from the ranks' entries at this step end.
fn named(shape: &GangShape, slow: Option<Slowdown>, last: &StepEnd) -> Option<usize> {
    let members: Vec<Member> = (0..shape.ranks)
        .map(|r| Member {
            step: Some(last.step),
            compute: slow.filter(|s| s.compute_published).map(|_| last.compute[r]),
            slow: match slow {
                Some(s) if s.signal && s.rank == r => vec!["GPU 0 hw-slowdown".into()],
                _ => Vec::new(),
            },
            ..Member::working(&format!("node-{r}"), &format!("rank-{r}"), last.at)
        })
        .collect();
    let (m, _) = suspect(&members)?;
    m.worker.strip_prefix("rank-")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Millis = 3_600_000;

    fn cfg() -> PaceConfig {
        PaceConfig { enabled: true, ..PaceConfig::default() }
    }

    #[test]
    fn a_fifth_slower_is_found_within_ten_minutes_and_its_rank_named() {
        let shape = GangShape::one_second_steps(8, true);
        let at = 2 * HOUR;
        let slow = Slowdown { at, factor: 0.8, rank: 3, compute_published: true, signal: false };
        let out = replay_gang(&shape, Some(slow), 7, 3 * HOUR, 5_000, &cfg());
        let first = out.episodes.first().copied().expect("found");
        assert!(first > at && first - at <= 10 * 60_000, "{}", (first - at) / 1000);
        assert_eq!(out.named, Some(3));
    }

    #[test]
    fn a_healthy_day_with_silent_evaluations_draws_no_episode() {
        for announced in [true, false] {
            let shape = GangShape::one_second_steps(8, announced);
            let out = replay_gang(&shape, None, 11, 24 * HOUR, 5_000, &cfg());
            assert!(out.episodes.is_empty(), "{announced}: {:?}", out.episodes);
        }
    }
}
