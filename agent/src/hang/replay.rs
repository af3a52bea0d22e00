//! Step-time traces replayed through the real verdict (pure, simulated time): how soon a hang is
//! confirmed and restarted, and how often a healthy worker is called suspect or restarted, under
//! the fixed `stale_after` and `restart_delay` and under the silence learned from the worker's
//! rhythm (`crate::hang::policy_rhythm`, its copy in the coordinator written and read back as
//! the agent does). The benchmark `scripts/bench-rhythm.sh` prints the figures; the tests below
//! hold the goal.
//!
//! A trace is what a training loop with the Python client writes: a beat per step (steps of
//! about a second, with jitter and the odd slow step of a data loader), an evaluation every so
//! many steps (announced by its state word, or not at all), a checkpoint every so many steps
//! announced with `busy("checkpoint", up_to=...)` (a state word and a grace), and, when asked,
//! a hang: no beat after a given moment. A month's trace adds what a real job does besides:
//! unannounced saves and data-loader stalls (silent in `processing`), a compile at each start, a
//! slower warm-up, and restarts (a new incarnation every few days).

use crate::clock::Millis;
use crate::config::Config;
use crate::hang::model::{Incident, Marks, WorkerState, WorkerStatus};
use crate::hang::model_rhythm::History;
use crate::hang::policy::{plan, verdict, Effect, NodeContext, Verdict};
use crate::hang::policy_due::{restart_due, stale_by_restart_rule};
use crate::hang::policy_rhythm::{judged_by, restart_policy, Rhythm};

/// One write of the worker's record.
#[derive(Debug, Clone, PartialEq)]
pub struct Beat {
    pub at: Millis,
    pub state: &'static str,
    /// The grace announced (ms), for a `busy(...)` phase.
    pub grace: Option<Millis>,
    /// Which run of the job wrote it (a restart starts the next).
    pub incarnation: u32,
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
    /// An unannounced save (silent in `processing`) every this many steps (0: none), this
    /// long (ms, ±10 %).
    pub save_every: u64,
    pub save: Millis,
    /// A data-loader stall every this many steps (0: none), this long (ms, ±50 %).
    pub stall_every: u64,
    pub stall: Millis,
    /// The first step of each run compiles this long (ms); the next `warmup_steps` take 3 × a
    /// step.
    pub compile: Millis,
    pub warmup_steps: u64,
    /// The job is restarted every this long (ms, 0: never): a new run (incarnation).
    pub restart_every: Millis,
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
            save_every: 0,
            save: 0,
            stall_every: 0,
            stall: 0,
            compile: 0,
            warmup_steps: 0,
            restart_every: 0,
        }
    }

    /// A month's job (issue 46): steps of `step` ms with 10 % jitter and the odd slow step, an
    /// evaluation of 90 s every ~25 min (announced or silent), an announced 45 s checkpoint every
    /// ~50 min, an unannounced 20 s save every ~2 h, a data-loader stall of about `stall` ms
    /// every ~3 h, a 60 s compile and a slower warm-up at each start, and a restart every 3 days.
    pub fn month(step: Millis, eval_announced: bool, stall: Millis) -> Shape {
        let steps = |ms: Millis| (ms / step).max(1) as u64;
        Shape {
            step,
            jitter: 0.1,
            slow_one_in: 500,
            eval_every: steps(25 * 60_000),
            eval: 90_000,
            eval_announced,
            checkpoint_every: steps(50 * 60_000),
            checkpoint: 45_000,
            checkpoint_grace: 600_000,
            save_every: steps(2 * 3_600_000),
            save: 20_000,
            stall_every: steps(3 * 3_600_000),
            stall,
            compile: 60_000,
            warmup_steps: 50,
            restart_every: 3 * 24 * 3_600_000,
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
    let stop = hang.unwrap_or(end).min(end);
    let mut beats = Vec::new();
    let (mut t, mut run) = (start, 0u32);
    while t <= stop {
        let until = match shape.restart_every {
            0 => stop,
            every => (t + every).min(stop),
        };
        // NB: the next run starts where this one ended (its container replaced): while none
        // runs, an agent judges nothing, so a gap would only be a silence no agent sees.
        t = one_run(shape, &mut rng, t, until, stop, run, &mut beats) + 1;
        run += 1;
    }
    beats
}

/// One run of the job from `t` until `until`; its beats pushed (none after `stop`). Returns
/// where it ended.
fn one_run(
    shape: &Shape,
    rng: &mut Rng,
    mut t: Millis,
    until: Millis,
    stop: Millis,
    run: u32,
    beats: &mut Vec<Beat>,
) -> Millis {
    let mut push = |at: Millis, state: &'static str, grace: Option<Millis>| {
        if at <= stop {
            beats.push(Beat { at, state, grace, incarnation: run });
        }
    };
    push(t, "processing", None);
    t += shape.compile;
    let every = |n: u64, step: u64| n > 0 && step.is_multiple_of(n);
    let mut step = 0u64;
    while t <= until {
        step += 1;
        let jitter = 1.0 + shape.jitter * rng.normal();
        let mut len = (shape.step as f64 * jitter.clamp(0.5, 2.0)) as Millis;
        if shape.slow_one_in > 0 && rng.next().is_multiple_of(shape.slow_one_in) {
            len = shape.step * (2 + (rng.next() % 4) as Millis);
        }
        if step <= shape.warmup_steps {
            len *= 3;
        }
        // NB: half and a third of their period out of step with the evaluations and
        // checkpoints (whose periods divide theirs): each phase alone, as in a real job.
        if every(shape.stall_every, step + shape.stall_every / 2) {
            len += (shape.stall as f64 * (0.5 + rng.unit())) as Millis;
        }
        if every(shape.save_every, step + shape.save_every / 3) {
            len += (shape.save as f64 * (0.9 + 0.2 * rng.unit())) as Millis;
        }
        t += len;
        push(t, "processing", None);
        if every(shape.eval_every, step) {
            if shape.eval_announced {
                push(t + 1, "eval", None);
            }
            t += (shape.eval as f64 * (0.9 + 0.2 * rng.unit())) as Millis;
            push(t, "processing", None);
        }
        if every(shape.checkpoint_every, step) {
            push(t + 1, "checkpoint", Some(shape.checkpoint_grace));
            t += shape.checkpoint;
            push(t, "processing", None);
        }
    }
    t
}

/// What the verdicts were over a replay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Each first sighting of a stale heartbeat (a new suspect), when.
    pub suspects: Vec<Millis>,
    /// Each confirmation of a hang (`hung` after any other verdict), when.
    pub hungs: Vec<Millis>,
    /// Each restart the policy would run (its incident due, by the fixed or the learned rule),
    /// when; none within `policy.cooldown` of the last.
    pub restarts: Vec<Millis>,
    /// The silence allowed at the last look (ms).
    pub last_silence: Millis,
}

/// Look at the worker's record every `poll` ms from `start` to `end` as an agent does: its rhythm
/// learned (when `cfg.policy.learned` is on) and written to the coordinator once a minute, the
/// verdict, the sighting and incident marks, and the restart when it is due, as the real policy
/// computes them.
pub fn replay(beats: &[Beat], cfg: &Config, poll: Millis, start: Millis, end: Millis) -> Outcome {
    let mut out = Outcome::default();
    let mut rhythm = Rhythm::default();
    let mut marks = Marks::default();
    let (mut next, mut now, mut was_hung) = (0, start, false);
    let mut run = None;
    while now <= end {
        while next < beats.len() && beats[next].at <= now {
            next += 1;
        }
        let beat = next.checked_sub(1).map(|i| &beats[i]);
        let status = beat.map(status_of);
        if cfg.policy.learned.enabled {
            let this_run = beat.map(|b| b.incarnation);
            learn(&mut rhythm, &mut marks, status.as_ref(), run != this_run, cfg, now);
            run = this_run;
        }
        let judged = judged_by(&cfg.policy, &rhythm, status.as_ref());
        let v = verdict(status.as_ref(), &marks, NodeContext::default(), now, &judged);
        out.last_silence =
            status.as_ref().map_or(0, |s| crate::hang::policy_record::allowed_silence(s, &judged));
        for e in plan(v, status.as_ref(), &marks, now, &judged) {
            if matches!(e, Effect::RecordSuspect { .. }) {
                out.suspects.push(now);
            }
            apply(&mut marks, e, now);
        }
        if v == Verdict::Hung && !was_hung {
            out.hungs.push(now);
        }
        was_hung = v == Verdict::Hung;
        restart_if_due(&mut out, &mut marks, (v, status.as_ref()), &rhythm, cfg, now);
        now += poll;
    }
    out
}

/// The agent's learning at one look (`RestartPath::learn`): the coordinator's copy merged in, a
/// new run starting its own samples over, and what was learned written back.
pub(crate) fn learn(
    rhythm: &mut Rhythm,
    marks: &mut Marks,
    status: Option<&WorkerStatus>,
    new_run: bool,
    cfg: &Config,
    now: Millis,
) {
    rhythm.adopt(marks.rhythm.as_ref());
    if new_run {
        rhythm.new_incarnation();
    } else {
        rhythm.observe(status, now, cfg.policy.learned.min_samples);
    }
    if let Some(raw) = rhythm.write_due(now) {
        marks.rhythm = History::decode(&raw);
    }
}

/// The restart of a hung worker's incident when it is due (`RestartPath::consider_restart`), at
/// most once a cooldown: recorded, and the incident over.
fn restart_if_due(
    out: &mut Outcome,
    marks: &mut Marks,
    (v, status): (Verdict, Option<&WorkerStatus>),
    rhythm: &Rhythm,
    cfg: &Config,
    now: Millis,
) {
    let Some(inc) = marks.incident.as_ref().filter(|_| v == Verdict::Hung) else { return };
    let rules = restart_policy(&cfg.policy, marks.rhythm.as_ref(), rhythm.own(), status, now);
    let cooled =
        out.restarts.last().is_none_or(|&r| now - r >= crate::clock::ms(cfg.policy.cooldown));
    if cooled
        && restart_due(v, inc.started, now, &rules)
        && stale_by_restart_rule(v, status, now, &rules)
    {
        out.restarts.push(now);
        marks.incident = None;
        marks.suspect = None;
    }
}

/// The marks an effect of the plan writes, as the coordinator would keep them.
pub(crate) fn apply(marks: &mut Marks, e: Effect, now: Millis) {
    match e {
        Effect::RecordSuspect { heartbeat } => marks.suspect = Some((heartbeat, now)),
        Effect::ClearSuspect => marks.suspect = None,
        Effect::OpenIncident => {
            marks.incident = Some(Incident { started: now, id: format!("replay-{now}") })
        }
        Effect::ClearIncident(_) => marks.incident = None,
        _ => {}
    }
}

pub(crate) fn status_of(b: &Beat) -> WorkerStatus {
    WorkerStatus {
        state: WorkerState::parse(b.state),
        heartbeat: Some(b.at),
        grace: b.grace,
        ..WorkerStatus::default()
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
        for (seed, hang) in [(1, 2 * HOUR + 17_321), (2, 5 * HOUR + 3_777), (3, 9 * HOUR + 1)] {
            let beats = trace(&shape, seed, 0, DAY, Some(hang));
            let last = beats.last().unwrap().at;
            let out = replay(&beats, &learned, poll, 0, hang + HOUR);
            let first = out.restarts.first().copied().unwrap_or(Millis::MAX);
            let before: Vec<_> = out.hungs.iter().filter(|&&h| h <= first).collect();
            assert_eq!(before.len(), 1, "seed {seed}: {out:?}");
            let took = out.hungs[0] - last;
            assert!(took <= 20_000, "seed {seed}: {took} ms");
            assert!(out.suspects.iter().all(|&s| s > last), "no false suspect first");
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
        assert_eq!(out.hungs.len(), 1, "called hung once, during the first evaluation");
        // ... and from then on it is allowed the fixed silence (1.5 × ~90 s, capped).
        assert_eq!(out.last_silence, 120_000);
    }

    /// The learned silence and learned restarts on, with `history` and the restart's
    /// persistence as the defaults have them.
    fn learned_restarts(poll_s: u64) -> (Config, Millis) {
        let (mut c, poll) = cfg(true, poll_s);
        c.policy.learned.restarts = true;
        (c, poll)
    }

    #[test]
    fn a_week_of_a_real_job_has_no_false_restart_and_its_hangs_are_restarted_within_a_minute() {
        // 1 s steps, announced evaluations, a 20 s unannounced save every 2 h, data-loader
        // stalls of 5-15 s, compiles and warm-ups, a restart every 3 days (the figures for
        // longer stalls: scripts/bench-rhythm.sh).
        let shape = Shape::month(1_000, true, 10_000);
        let (learned, poll) = learned_restarts(5);
        let (fixed, _) = cfg(false, 5);
        let week = 7 * DAY;
        let calm = trace(&shape, 5, 0, week, None);
        assert!(calm.iter().any(|b| b.incarnation == 2), "two restarts");
        let out = replay(&calm, &learned, poll, 0, week);
        assert_eq!(out.restarts, Vec::<Millis>::new(), "no restart of a healthy job");
        for (seed, hang) in [(1, DAY + 17_321), (2, 4 * DAY + 3_777)] {
            let beats = trace(&shape, seed, 0, hang + HOUR, Some(hang));
            let last = beats.last().unwrap().at;
            let out = replay(&beats, &learned, poll, 0, hang + HOUR);
            let took = out.restarts.iter().find(|&&r| r > last).map(|r| r - last);
            assert!(took.is_some_and(|t| t <= 60_000), "seed {seed}: {took:?} {out:?}");
            assert!(out.restarts.iter().all(|&r| r > last), "none before the hang");
            let out = replay(&beats, &fixed, poll, 0, hang + HOUR);
            let took = out.restarts.iter().find(|&&r| r > last).map(|r| r - last);
            assert!(took.is_some_and(|t| t > 300_000), "the fixed rule: {took:?}");
        }
    }

    #[test]
    fn a_job_with_silent_evaluations_longer_than_stale_after_keeps_the_fixed_rule() {
        // Its 90 s silent evaluations, 1.5 × over the cap: nothing to learn a restart from.
        let shape = Shape::month(1_000, false, 20_000);
        let (learned, poll) = learned_restarts(5);
        let hang = DAY + 3_333;
        let beats = trace(&shape, 9, 0, hang + HOUR, Some(hang));
        let last = beats.last().unwrap().at;
        let out = replay(&beats, &learned, poll, 0, hang + HOUR);
        assert!(out.restarts.iter().all(|&r| r > last), "{out:?}");
        let took = out.restarts.first().map(|r| r - last);
        assert!(took.is_some_and(|t| t > 300_000), "{took:?}");
    }

    #[test]
    fn a_new_job_is_restarted_by_the_fixed_rule_until_its_history_spans_six_hours() {
        let shape = Shape::month(1_000, true, 20_000);
        let (learned, poll) = learned_restarts(5);
        let hang = 2 * HOUR + 1_234;
        let beats = trace(&shape, 3, 0, hang + HOUR, Some(hang));
        let last = beats.last().unwrap().at;
        let out = replay(&beats, &learned, poll, 0, hang + HOUR);
        let mut alerts_only = learned.clone();
        alerts_only.policy.learned.restarts = false;
        let fixed = replay(&beats, &alerts_only, poll, 0, hang + HOUR);
        assert_eq!(out.restarts, fixed.restarts);
        // The learned silence opened the incident early; the restart waited for the fixed
        // rule's `stale_after` and `restart_delay`.
        let took = out.restarts.first().map(|r| r - last);
        assert!(took.is_some_and(|t| t > 180_000), "{took:?}");
    }
}
