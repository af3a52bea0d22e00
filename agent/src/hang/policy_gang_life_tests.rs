//! The gang's incident walked cycle by cycle through the real verdict, incident rules and plan
//! (the engine's order: close an incident that is over, open one for a hung gang, plan for each
//! member): each cycle's stage is one step of the gang's table of the life
//! (`crate::hang::policy_life::follows`), and the plan's restarts follow the stage.

use super::*;
use crate::hang::model::Incident;
use crate::hang::policy_life::follows;
use crate::hang::policy_pipeline::Unit;

const S: Millis = 1_000;
/// How long a restarted member boots before it beats (when its restart helps).
const BOOT: Millis = 30 * S;

/// How the walked gang behaves.
#[derive(Clone, Copy)]
struct World {
    /// When every member stops.
    stop: Millis,
    /// When the stopped collective moves again by itself (`None`: it does not).
    resume: Option<Millis>,
    /// Whether a member's restart brings it back.
    restart_helps: bool,
}

/// One member, and when the gang's decision restarted it.
struct Rank {
    entry: Member,
    restarted: Option<Millis>,
}

impl Rank {
    /// Its entry at `now`, as its own agent writes it.
    fn observe(&mut self, w: &World, now: Millis, t: &Timing) {
        let e = &mut self.entry;
        e.at = now;
        let beats = match self.restarted {
            Some(r) => w.restart_helps && now - r >= BOOT,
            None => now < w.stop || w.resume.is_some_and(|r| now >= r),
        };
        if beats {
            e.heartbeat = Some(now);
            e.verdict = Verdict::Healthy;
            return;
        }
        let hb = e.heartbeat.unwrap_or(0);
        e.verdict = match self.restarted {
            // Its agent's cooldown: booting until it beats or the cooldown is over.
            Some(r) if now - r < t.cooldown => Verdict::Booting,
            _ if now - hb > e.silence + t.confirm_after => Verdict::Hung,
            _ if now - hb > e.silence => Verdict::Suspect,
            _ => Verdict::Healthy,
        };
    }
}

/// Walks a gang of three for `minutes`, a cycle every 15 s; returns the stages it took (each
/// change once) and the pages' steps.
fn walk(w: World, rules: &Rules, minutes: i64) -> (Vec<Stage>, Vec<GangStep>) {
    let t = rules.timing;
    let mut ranks: Vec<Rank> = ["a", "b", "c"]
        .iter()
        .map(|n| Rank { entry: Member::working(n, "rank", 0), restarted: None })
        .collect();
    let mut state = GangState::default();
    let mut seen = vec![Stage::Quiet];
    let mut pages = Vec::new();
    for now in (0..=minutes * 60 * S).step_by(15_000) {
        for r in &mut ranks {
            r.observe(&w, now, &t);
        }
        let members: Vec<Member> = ranks.iter().map(|r| r.entry.clone()).collect();
        if incident_over(&state, &members, now, &t) {
            state = GangState {
                restarted: state.current_decision().map(|d| d.decided).or(state.restarted),
                ..GangState::default()
            };
        }
        let v = verdict(&members, now);
        if let (GangVerdict::Hung { .. }, None) = (&v, &state.incident) {
            state.incident = Some(Incident { started: now, id: format!("g{now}") });
        }
        let s = stage(&state, &members, now, &t);
        let last = *seen.last().unwrap();
        assert!(follows(Unit::Gang, last, s), "{}s: {last:?} -> {s:?} ({state:?})", now / S);
        if s != last {
            seen.push(s);
        }
        for (i, own) in members.iter().enumerate() {
            // The stage this member's agent acts on: a decision taken for an earlier member
            // this cycle stands for it.
            let s = stage(&state, &members, now, &t);
            for step in plan(&v, &state, &members, own, now, rules) {
                match step {
                    GangStep::Decide => {
                        assert_eq!(s, Stage::Due, "a decision only when due");
                        let inc = state.incident.as_ref().unwrap().id.clone();
                        state.decision = Some(Decision { decided: now, incident: inc, only: None });
                        ranks[i].restarted = Some(now);
                    }
                    GangStep::Execute => {
                        assert!(matches!(s, Stage::Restarting | Stage::Escalated), "{s:?}");
                        ranks[i].restarted = Some(now);
                    }
                    page => pages.push(page),
                }
            }
        }
    }
    (seen, pages)
}

fn rules_with(cooldown_min: i64, escalate_min: i64) -> Rules {
    let mut r = super::tests::rules();
    r.timing.cooldown = cooldown_min * 60 * S;
    r.timing.escalate_after = escalate_min * 60 * S;
    r
}

#[test]
fn a_gang_restart_that_helps_is_one_pass_through_the_life() {
    use Stage::*;
    let w = World { stop: 60 * S, resume: None, restart_helps: true };
    let (seen, pages) = walk(w, &rules_with(10, 10), 40);
    assert_eq!(
        seen,
        [Quiet, Confirmed, Due, Restarting, Recovered, Quiet],
        "recovered straight from restarting: the gang has no booting of its own"
    );
    assert!(
        pages.iter().all(|p| *p == GangStep::PageHung),
        "a `hung` page (each agent plans it every cycle; one is sent: its claim): {pages:?}"
    );
}

#[test]
fn a_gang_restart_that_does_not_help_escalates_and_opens_the_next_incident_again() {
    use Stage::*;
    let w = World { stop: 60 * S, resume: None, restart_helps: false };
    // `escalate_after` shorter than the cooldown: the standing decision escalates.
    let (seen, pages) = walk(w, &rules_with(10, 5), 30);
    assert_eq!(&seen[..6], [Quiet, Confirmed, Due, Restarting, Escalated, Confirmed]);
    assert!(pages.iter().any(|p| matches!(p, GangStep::PageEscalation { .. })));
    // The defaults (both 10 min): the cooldown closes the incident first; the next one is the
    // same trouble again, paged as an escalation, not `hung`.
    let (seen, pages) = walk(w, &rules_with(10, 10), 30);
    assert_eq!(&seen[..5], [Quiet, Confirmed, Due, Restarting, Confirmed]);
    let again = pages.iter().filter(|p| matches!(p, GangStep::PageEscalation { .. }));
    assert!(again.count() > 0, "{pages:?}");
}

#[test]
fn a_collective_that_moves_before_its_restart_goes_back_to_quiet() {
    use Stage::*;
    let w = World { stop: 60 * S, resume: Some(300 * S), restart_helps: true };
    let (seen, _) = walk(w, &rules_with(10, 10), 10);
    assert_eq!(seen, [Quiet, Confirmed, Quiet]);
}

/// A restart is never decided before its incident is due, however the gang is timed.
#[test]
fn no_gang_is_decided_before_its_restart_is_due() {
    for (cooldown, escalate) in [(10, 10), (10, 5), (5, 10), (1, 1)] {
        for helps in [true, false] {
            for resume in [None, Some(200 * S), Some(400 * S)] {
                let w = World { stop: 45 * S, resume, restart_helps: helps };
                let (seen, _) = walk(w, &rules_with(cooldown, escalate), 45);
                let first = seen.iter().position(|s| *s == Stage::Restarting);
                let due = seen.iter().position(|s| *s == Stage::Due);
                assert!(first.is_none() || due < first, "{seen:?}");
            }
        }
    }
}
