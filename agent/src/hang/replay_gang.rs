//! A gang's step-time traces replayed through the real gang verdict (pure, simulated time): how
//! soon a collective's hang is restarted, and whether a healthy collective ever is, under the
//! fixed rule and on learned evidence (`crate::hang::policy_gang::due_on`). The benchmark
//! `scripts/bench-rhythm.sh` prints the figures (a gang of 64); the tests below hold the goal.
//!
//! The collective is one trace (`crate::hang::replay::trace`): in a collective every rank steps
//! together, so rank `r` beats what the collective does, `r`'s own few hundred milliseconds
//! later, and a hang stops every rank within a second. Each rank has its own agent, looking every
//! poll at its own phase, learning its rank's rhythm with its copy in the coordinator as the
//! agent does, judging its rank by the fixed rule and writing its entry in the gang's view with
//! the learned rule the coordinator's copy allows (`Member::learned`). The first agent whose
//! rank is stale in a poll interval reads the view and decides, as the gang's reader does.

use crate::clock::Millis;
use crate::config::Config;
use crate::hang::model::{Incident, Marks, WorkerState, WorkerStatus};
use crate::hang::model_gang::{Activity, GangState, Member};
use crate::hang::policy::{plan, verdict, NodeContext, Verdict};
use crate::hang::policy_gang::{self as gp, GangVerdict, Timing};
use crate::hang::policy_record::{allowed_silence, is_stale};
use crate::hang::policy_rhythm::{by_rule, learned_rule, Rhythm};
use crate::hang::replay::{apply, learn, status_of, Beat};

/// What the gang's decisions were over a replay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GangOutcome {
    /// Each gang incident opened (its `hung` page), when.
    pub hung: Vec<Millis>,
    /// Each restart of every member decided, when, and whether on learned evidence; none within
    /// `policy.cooldown` of the last.
    pub restarts: Vec<(Millis, bool)>,
}

/// One rank's agent: what it learned, its rank's marks (the coordinator's copy of its rhythm
/// among them), the run it last saw, and where it is in the collective's trace.
struct Agent {
    rhythm: Rhythm,
    marks: Marks,
    run: Option<u32>,
    next: usize,
    /// Its rank beats this long after the collective; its agent looks this long into each poll.
    skew: Millis,
    phase: Millis,
}

/// Replay `ranks` ranks of the collective `beats` from `start` to `end`, every agent looking
/// every `poll` ms.
pub fn replay_gang(
    beats: &[Beat],
    ranks: usize,
    cfg: &Config,
    poll: Millis,
    start: Millis,
    end: Millis,
) -> GangOutcome {
    let mut agents: Vec<Agent> = (0..ranks)
        .map(|r| Agent {
            rhythm: Rhythm::default(),
            marks: Marks::default(),
            run: None,
            next: 0,
            skew: (r as Millis * 7_919) % 300,
            phase: (r as Millis * 104_729) % poll.max(1),
        })
        .collect();
    let mut entries: Vec<Member> =
        (0..ranks).map(|r| Member::working(&format!("gpu-{r}"), "rank", start)).collect();
    let mut order: Vec<usize> = (0..ranks).collect();
    order.sort_by_key(|&r| agents[r].phase);
    let mut gang = Gang::new(cfg);
    let mut tick = start;
    while tick <= end {
        for &r in &order {
            let now = tick + agents[r].phase;
            let stale = look(&mut agents[r], &mut entries[r], beats, cfg, now);
            if stale && now >= gang.reader_until {
                gang.reader_until = now + poll;
                gang.decide(&entries, now);
            }
        }
        tick += poll;
    }
    gang.out
}

/// One look of rank `r`'s agent at `now`: its rank's record, what it learns, its verdict by the
/// fixed rule and its entry with the learned rule the coordinator's copy allows. True when the
/// rank is stale by the rule its entry carries (the agent takes the gang's turn).
fn look(a: &mut Agent, entry: &mut Member, beats: &[Beat], cfg: &Config, now: Millis) -> bool {
    while a.next < beats.len() && beats[a.next].at + a.skew <= now {
        a.next += 1;
    }
    let status = a
        .next
        .checked_sub(1)
        .map(|i| WorkerStatus { heartbeat: Some(beats[i].at + a.skew), ..status_of(&beats[i]) });
    let this_run = a.next.checked_sub(1).map(|i| beats[i].incarnation);
    if cfg.policy.learned.enabled {
        learn(&mut a.rhythm, &mut a.marks, status.as_ref(), a.run != this_run, cfg, now);
    }
    a.run = this_run;
    let base = &cfg.policy;
    let v = verdict(status.as_ref(), &a.marks, NodeContext::default(), now, base);
    for e in plan(v, status.as_ref(), &a.marks, now, base) {
        apply(&mut a.marks, e, now);
    }
    let rule = learned_rule(base, a.marks.rhythm.as_ref(), a.rhythm.own(), status.as_ref(), now);
    let judged = by_rule(base, rule);
    let Some(s) = status.as_ref() else { return false };
    entry.verdict = v;
    entry.activity = match s.state {
        WorkerState::Idle => Activity::Idle,
        WorkerState::Error => Activity::Error,
        _ => Activity::Working,
    };
    entry.heartbeat = s.heartbeat;
    entry.silence = allowed_silence(s, base);
    entry.learned = rule;
    entry.at = now;
    is_stale(s, now, &judged) || matches!(v, Verdict::Hung | Verdict::Errored)
}

/// The gang's shared state as the replay keeps it: its incident, its last restart, and when the
/// next reader may read the view.
struct Gang {
    t: Timing,
    state: GangState,
    reader_until: Millis,
    out: GangOutcome,
}

impl Gang {
    fn new(cfg: &Config) -> Gang {
        Gang {
            t: Timing::of(cfg),
            state: GangState::default(),
            reader_until: Millis::MIN,
            out: GangOutcome::default(),
        }
    }

    /// The reader's turn (`RestartPath::gang`): the incident closed when the collective moves
    /// again, opened when it is hung, and every member restarted once it is due.
    fn decide(&mut self, members: &[Member], now: Millis) {
        if gp::incident_over(&self.state, members, now, &self.t) {
            self.state.incident = None;
        }
        if !matches!(gp::verdict(members, now), GangVerdict::Hung { .. }) {
            return;
        }
        let Some(inc) = self.state.incident.clone() else {
            self.state.incident = Some(Incident { started: now, id: format!("replay-{now}") });
            self.out.hung.push(now);
            return self.decide_due(members, now, now);
        };
        self.decide_due(members, inc.started, now);
    }

    fn decide_due(&mut self, members: &[Member], started: Millis, now: Millis) {
        let cooled = self.out.restarts.last().is_none_or(|&(r, _)| now - r >= self.t.cooldown);
        if cooled && gp::decidable(started, members, now, &self.t) {
            let on = gp::due_on(started, members, now, &self.t);
            let learned = matches!(on, Some(gp::Basis::Learned { .. }));
            self.out.restarts.push((now, learned));
            self.state.incident = None;
        }
    }
}

/// The replay's reading of a restart: how long after `last` (the collective's last beat) the
/// first restart after it came (`None`: none within the replay).
pub fn restarted_after(out: &GangOutcome, last: Millis) -> Option<Millis> {
    out.restarts.iter().find(|&&(r, _)| r > last).map(|&(r, _)| r - last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hang::replay::{trace, Shape};

    const HOUR: Millis = 3_600_000;

    fn cfg(learned: bool) -> Config {
        let mut c = Config::default();
        c.policy.learned.enabled = learned;
        c.policy.learned.restarts = learned;
        c.poll_interval = std::time::Duration::from_secs(5);
        c
    }

    /// A gang of eight 1 s-step ranks (a day's job: saves, stalls, compiles), healthy for 7 h
    /// and then hung: restarted on learned evidence within a minute of its last beat, never
    /// while healthy; by the fixed rule after five.
    #[test]
    fn a_gangs_hang_is_restarted_within_a_minute_on_learned_evidence_and_never_while_healthy() {
        let shape = Shape::month(1_000, true, 10_000);
        for (seed, hang) in [(1, 7 * HOUR + 17_321), (2, 8 * HOUR + 3_777)] {
            let beats = trace(&shape, seed, 0, hang + HOUR / 2, Some(hang));
            let last = beats.last().unwrap().at;
            let out = replay_gang(&beats, 8, &cfg(true), 5_000, 0, hang + HOUR / 2);
            assert!(out.restarts.iter().all(|&(r, _)| r > last), "{out:?}");
            let took = restarted_after(&out, last);
            assert!(took.is_some_and(|t| t <= 60_000), "seed {seed}: {took:?}");
            assert!(out.restarts[0].1, "on learned evidence");
            let fixed = replay_gang(&beats, 8, &cfg(false), 5_000, 0, hang + HOUR / 2);
            let took = restarted_after(&fixed, last);
            assert!(took.is_some_and(|t| t > 300_000), "the fixed rule: {took:?}");
            assert!(!fixed.restarts[0].1);
        }
    }

    /// A job whose rhythm is younger than `history`: no member's agent holds a learned rule,
    /// and the gang keeps the fixed rule (one member without one: `policy_gang`'s tests and
    /// `tests/gang.rs`).
    #[test]
    fn a_gang_younger_than_its_history_keeps_the_fixed_rule() {
        let shape = Shape::month(1_000, true, 10_000);
        let hang = 7 * HOUR + 17_321;
        let beats = trace(&shape, 1, 0, hang + HOUR / 2, Some(hang));
        let last = beats.last().unwrap().at;
        let mut c = cfg(true);
        c.policy.learned.history = std::time::Duration::from_secs(24 * 3600);
        let out = replay_gang(&beats, 8, &c, 5_000, 0, hang + HOUR / 2);
        let took = restarted_after(&out, last);
        assert!(took.is_some_and(|t| t > 300_000), "{took:?}");
    }
}
