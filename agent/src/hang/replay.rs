//! Step-time traces replayed through the real verdict (pure, simulated time): how soon a hang is
//! confirmed and how often a healthy worker is called suspect, under the fixed `stale_after` and
//! under the silence learned from the worker's rhythm (`crate::hang::policy_rhythm`). The
//! benchmark `scripts/bench-rhythm.sh` prints the figures; the tests below hold the goal.
//!
//! A trace is what a training loop with the Python client writes: a beat per step (steps of
//! about a second, with jitter and the odd slow step of a data loader), an evaluation every so
//! many steps (announced by its state word, or not at all), a checkpoint every so many steps
//! announced with `busy("checkpoint", up_to=...)` (a state word and a grace), and, when asked,
//! a hang: no beat after a given moment.

use crate::clock::Millis;
use crate::config::Config;
use crate::hang::model::{Marks, WorkerState, WorkerStatus};
use crate::hang::policy::{plan, verdict, Effect, NodeContext, Verdict};
use crate::hang::policy_rhythm::{judged_by, Rhythm};

/// One write of the worker's record.
#[derive(Debug, Clone, PartialEq)]
pub struct Beat {
    pub at: Millis,
    pub state: &'static str,
    /// The grace announced (ms), for a `busy(...)` phase.
    pub grace: Option<Millis>,
}

/// The shape of a training job's trace.
#[derive(Debug, Clone)]
pub struct Shape {
    /// A step's usual length (ms) and its jitter (a fraction, the standard deviation).
    pub step: Millis,
    pub jitter: f64,
    /// One step in this many stalls (a data loader) for 2–5 steps' time.
    pub slow_one_in: u64,
    /// An evaluation every this many steps (0: none), this long (ms, ±10 %).
    pub eval_every: u64,
    pub eval: Millis,
    /// The evaluation writes `state=eval` first (else it is silent in `processing`).
    pub eval_announced: bool,
    /// A checkpoint every this many steps (0: none), this long (ms), announced with a grace.
    pub checkpoint_every: u64,
    pub checkpoint: Millis,
    pub checkpoint_grace: Millis,
}

impl Shape {
    /// The job: 1 s steps with 10 % jitter, a 90 s evaluation every 1,000 steps, a
    /// 45 s checkpoint every 3,000 (announced, up to 10 min).
    pub fn one_second_steps(eval_announced: bool) -> Shape {
        Shape {
            step: 1_000,
            jitter: 0.1,
            slow_one_in: 500,
            eval_every: 1_000,
            eval: 90_000,
            eval_announced,
            checkpoint_every: 3_000,
            checkpoint: 45_000,
            checkpoint_grace: 600_000,
        }
    }
}

/// A small deterministic generator (xorshift64*): the same seed, the same trace.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// About normal (the sum of four uniforms), mean 0, standard deviation 1.
    pub(crate) fn normal(&mut self) -> f64 {
        ((0..4).map(|_| self.unit()).sum::<f64>() - 2.0) * 3f64.sqrt()
    }
}

/// The beats of `shape` from `start` to `end` (ms); none after `hang` when given.
pub fn trace(
    shape: &Shape,
    seed: u64,
    start: Millis,
    end: Millis,
    hang: Option<Millis>,
) -> Vec<Beat> {
    let mut rng = Rng(seed.max(1));
    let mut beats = vec![Beat {
        at: start,
        state: "processing",
        grace: None,
    }];
    let (mut t, mut step) = (start, 0u64);
    let stop = hang.unwrap_or(end).min(end);
    let mut push = |at: Millis, state: &'static str, grace: Option<Millis>| {
        if at <= stop {
            beats.push(Beat { at, state, grace });
        }
    };
    while t <= stop {
        step += 1;
        let jitter = 1.0 + shape.jitter * rng.normal();
        let mut len = (shape.step as f64 * jitter.clamp(0.5, 2.0)) as Millis;
        if shape.slow_one_in > 0 && rng.next().is_multiple_of(shape.slow_one_in) {
            len = shape.step * (2 + (rng.next() % 4) as Millis);
        }
        t += len;
        push(t, "processing", None);
        if shape.eval_every > 0 && step.is_multiple_of(shape.eval_every) {
            if shape.eval_announced {
                push(t + 1, "eval", None);
            }
            t += (shape.eval as f64 * (0.9 + 0.2 * rng.unit())) as Millis;
            push(t, "processing", None);
        }
        if shape.checkpoint_every > 0 && step.is_multiple_of(shape.checkpoint_every) {
            push(t + 1, "checkpoint", Some(shape.checkpoint_grace));
            t += shape.checkpoint;
            push(t, "processing", None);
        }
    }
    beats
}

/// What the verdicts were over a replay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Each first sighting of a stale heartbeat (a new suspect), when.
    pub suspects: Vec<Millis>,
    /// Each confirmation of a hang (`hung` after any other verdict), when.
    pub hungs: Vec<Millis>,
    /// The silence allowed at the last look (ms).
    pub last_silence: Millis,
}

/// Look at the worker's record every `poll` ms from `start` to `end` as an agent does: its rhythm
/// learned (when `cfg.policy.learned` is on), the verdict and the sighting marks as the real
/// policy computes them.
pub fn replay(beats: &[Beat], cfg: &Config, poll: Millis, start: Millis, end: Millis) -> Outcome {
    let mut out = Outcome::default();
    let mut rhythm = Rhythm::default();
    let mut marks = Marks::default();
    let mut next = 0;
    let mut now = start;
    let mut was_hung = false;
    while now <= end {
        while next < beats.len() && beats[next].at <= now {
            next += 1;
        }
        let status = next.checked_sub(1).map(|i| status_of(&beats[i]));
        rhythm.observe(status.as_ref(), now);
        let judged = judged_by(&cfg.policy, &rhythm, status.as_ref());
        let v = verdict(
            status.as_ref(),
            &marks,
            NodeContext::default(),
            now,
            &judged,
        );
        out.last_silence = status.as_ref().map_or(0, |s| {
            crate::hang::policy_record::allowed_silence(s, &judged)
        });
        for e in plan(v, status.as_ref(), &marks, now, &judged) {
            match e {
                Effect::RecordSuspect { heartbeat } => {
                    out.suspects.push(now);
                    marks.suspect = Some((heartbeat, now));
                }
                Effect::ClearSuspect => marks.suspect = None,
                _ => {}
            }
        }
        if v == Verdict::Hung && !was_hung {
            out.hungs.push(now);
        }
        was_hung = v == Verdict::Hung;
        now += poll;
    }
    out
}

fn status_of(b: &Beat) -> WorkerStatus {
    WorkerStatus {
        state: WorkerState::parse(b.state),
        heartbeat: Some(b.at),
        job: None,
        progress: None,
        grace: b.grace,
        alert_only: false,
        rank: None,
        gang: None,
        checkpoint_step: None,
        compute: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Millis = 3_600_000;
    const DAY: Millis = 24 * HOUR;

    fn cfg(learned: bool, poll_s: u64) -> (Config, Millis) {
        let mut c = Config::default();
        c.policy.learned.enabled = learned;
        c.poll_interval = std::time::Duration::from_secs(poll_s);
        (c, poll_s as Millis * 1000)
    }

    #[test]
    fn a_day_of_one_second_steps_with_announced_phases_has_no_false_suspect() {
        for learned in [false, true] {
            let (c, poll) = cfg(learned, 5);
            let beats = trace(&Shape::one_second_steps(true), 7, 0, DAY, None);
            let out = replay(&beats, &c, poll, 0, DAY);
            assert_eq!(out.suspects, Vec::<Millis>::new(), "learned {learned}");
            assert_eq!(out.hungs, Vec::<Millis>::new());
        }
    }

    #[test]
    fn a_one_second_step_hang_is_confirmed_within_20s_when_learned() {
        let (fixed, poll) = cfg(false, 5);
        let (learned, _) = cfg(true, 5);
        let shape = Shape::one_second_steps(true);
        for (seed, hang) in [
            (1, 2 * HOUR + 17_321),
            (2, 5 * HOUR + 3_777),
            (3, 9 * HOUR + 1),
        ] {
            let beats = trace(&shape, seed, 0, DAY, Some(hang));
            let last = beats.last().unwrap().at;
            let out = replay(&beats, &learned, poll, 0, hang + HOUR);
            assert_eq!(out.hungs.len(), 1, "seed {seed}: {out:?}");
            let took = out.hungs[0] - last;
            assert!(took <= 20_000, "seed {seed}: {took} ms");
            assert!(
                out.suspects.iter().all(|&s| s > last),
                "no false suspect first"
            );
            let out = replay(&beats, &fixed, poll, 0, hang + HOUR);
            assert!(out.hungs[0] - last > 120_000, "the fixed rule");
        }
    }

    #[test]
    fn an_unannounced_evaluation_is_one_false_suspect_then_learned() {
        let (c, poll) = cfg(true, 5);
        let beats = trace(&Shape::one_second_steps(false), 11, 0, 6 * HOUR, None);
        let out = replay(&beats, &c, poll, 0, 6 * HOUR);
        assert_eq!(out.suspects.len(), 1, "{:?}", out.suspects);
        assert_eq!(
            out.hungs.len(),
            1,
            "called hung once, during the first evaluation"
        );
        // ... and from then on it is allowed the fixed silence (1.5 × ~90 s, capped).
        assert_eq!(out.last_silence, 120_000);
    }
}
