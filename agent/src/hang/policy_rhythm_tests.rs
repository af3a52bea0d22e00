//! The learned silence: what is learned, what never is, and what it changes in the verdict.

use super::*;
use crate::hang::model::Incident;
use crate::hang::model::Marks;
use crate::hang::policy::{plan, verdict, Effect, NodeContext, TimerEnd, Verdict};
use std::time::Duration;

fn cfg() -> PolicyConfig {
    let mut c = PolicyConfig::default();
    c.learned.enabled = true;
    c
}

fn rec(state: WorkerState, hb: Millis) -> WorkerStatus {
    WorkerStatus {
        state,
        ..WorkerStatus::processing(Some(hb))
    }
}

/// A worker beating every `every` ms looked at every `poll` ms for `polls` looks, starting at
/// `t0`; returns the time of the last look.
fn steady(r: &mut Rhythm, t0: Millis, every: Millis, poll: Millis, polls: i64) -> Millis {
    let mut now = t0;
    for _ in 0..polls {
        let hb = now - now % every;
        r.observe(Some(&rec(WorkerState::Processing, hb)), now);
        now += poll;
    }
    now - poll
}

#[test]
fn a_steady_one_second_beat_is_learned_at_the_floor() {
    let c = cfg();
    let mut r = Rhythm::default();
    steady(&mut r, 1_000_000, 1000, 2300, 20);
    assert_eq!(r.silence(&c), None, "fewer than min_samples");
    steady(&mut r, 2_000_000, 1000, 2300, 40);
    assert!(r.samples() >= 30);
    // Silences under a second: 4 × < 1 s is under the 5 s floor.
    assert_eq!(r.silence(&c), Some(5_000));
    let mut off = c.clone();
    off.learned.enabled = false;
    assert_eq!(r.silence(&off), None, "off: the fixed rule");
}

#[test]
fn a_silence_that_has_not_ended_is_never_learned() {
    let c = cfg();
    let mut r = Rhythm::default();
    let last = steady(&mut r, 1_000_000, 1000, 2000, 60);
    let before = (r.samples(), r.silence(&c));
    // The worker stops beating: an hour of looks at the same heartbeat.
    let hb = last - last % 1000;
    for i in 1..1800 {
        r.observe(Some(&rec(WorkerState::Processing, hb)), last + i * 2000);
    }
    assert_eq!((r.samples(), r.silence(&c)), before);
}

#[test]
fn only_processing_silences_are_learned_and_never_an_announced_one() {
    let c = cfg();
    let mut r = Rhythm::default();
    let last = steady(&mut r, 1_000_000, 1000, 2000, 60);
    let learned = r.silence(&c);
    // A 90 s evaluation announced by its state word: not learned.
    let eval = last + 1000;
    for i in 0..45 {
        r.observe(
            Some(&rec(WorkerState::Other("eval".into()), eval)),
            eval + i * 2000,
        );
    }
    r.observe(
        Some(&rec(WorkerState::Processing, eval + 90_000)),
        eval + 90_500,
    );
    assert_eq!(r.silence(&c), learned);
    // A busy phase (a grace), even in `processing`: its silence is not learned.
    let mut busy = rec(WorkerState::Processing, eval + 91_000);
    busy.grace = Some(600_000);
    for i in 0..30 {
        r.observe(Some(&busy), eval + 91_000 + i * 2000);
    }
    r.observe(
        Some(&rec(WorkerState::Processing, eval + 200_000)),
        eval + 200_500,
    );
    assert_eq!(r.silence(&c), learned);
}

#[test]
fn a_long_silence_come_back_from_raises_it_and_stale_after_caps_it() {
    let c = cfg();
    let mut r = Rhythm::default();
    let last = steady(&mut r, 1_000_000, 1000, 2000, 60);
    // An unannounced 20 s pause in `processing` that ended (last seen 18 s old): among 60
    // samples the 0.99 quantile is the largest, so 4 × 18 s.
    let hb = last - last % 1000;
    for i in 0..10 {
        r.observe(Some(&rec(WorkerState::Processing, hb)), hb + i * 2000);
    }
    r.observe(
        Some(&rec(WorkerState::Processing, hb + 20_000)),
        hb + 20_000,
    );
    assert_eq!(r.silence(&c), Some(72_000));
    // However many short silences follow, it is never under 1.5 × 18 s in this incarnation.
    let last = steady(&mut r, hb + 21_000, 1000, 2000, 300);
    assert_eq!(r.silence(&c), Some(27_000));
    let hb = last - last % 1000;
    // One of 100 s: capped by stale_after (2 m).
    for i in 0..50 {
        r.observe(
            Some(&rec(WorkerState::Processing, hb + 20_000)),
            hb + 20_000 + i * 2000,
        );
    }
    r.observe(
        Some(&rec(WorkerState::Processing, hb + 120_000)),
        hb + 120_000,
    );
    assert_eq!(r.silence(&c), Some(120_000));
}

#[test]
fn the_learned_silence_judges_only_plain_processing_records() {
    let c = cfg();
    let mut r = Rhythm::default();
    steady(&mut r, 1_000_000, 1000, 2000, 60);
    let p = rec(WorkerState::Processing, 0);
    let j = judged_by(&c, &r, Some(&p));
    assert_eq!(j.stale_after, Duration::from_secs(5));
    assert_eq!(j.confirm_after, Duration::from_millis(2500));
    for other in [
        rec(WorkerState::Other("eval".into()), 0),
        WorkerStatus {
            grace: Some(60_000),
            ..p.clone()
        },
    ] {
        assert_eq!(*judged_by(&c, &r, Some(&other)), c, "{other:?}");
    }
    assert_eq!(*judged_by(&c, &Rhythm::default(), Some(&p)), c);
}

#[test]
fn a_learned_worker_is_suspect_then_hung_within_seconds() {
    let c = cfg();
    let mut r = Rhythm::default();
    let last = steady(&mut r, 1_000_000, 1000, 2000, 60);
    let hb = last - last % 1000;
    let status = rec(WorkerState::Processing, hb);
    let j = judged_by(&c, &r, Some(&status));
    let node = NodeContext::default();
    let at = |t: Millis, marks: &Marks| verdict(Some(&status), marks, node, hb + t, &j);
    assert_eq!(
        at(5_000, &Marks::default()),
        Verdict::Healthy,
        "exactly 5 s"
    );
    assert_eq!(at(6_000, &Marks::default()), Verdict::Suspect);
    let seen = Marks {
        suspect: Some((hb, hb + 6_000)),
        ..Marks::default()
    };
    assert_eq!(
        at(8_000, &seen),
        Verdict::Suspect,
        "confirmation after 2.5 s"
    );
    assert_eq!(at(8_500, &seen), Verdict::Hung);
    // The fixed rule would still call it healthy.
    assert_eq!(
        verdict(Some(&status), &seen, node, hb + 8_500, &c),
        Verdict::Healthy
    );
}

#[test]
fn an_instance_that_has_not_learned_never_ends_a_learned_incident_while_the_silence_lasts() {
    // One instance learned 5 s and opened an incident; another (or this agent after a restart)
    // judges by the fixed 2 m: the worker has not beaten since the sighting, so the sighting
    // and the timer stand. A new beat ends both.
    let fixed = PolicyConfig::default();
    let hb = 1_000_000;
    let status = rec(WorkerState::Processing, hb);
    let marks = Marks {
        suspect: Some((hb, hb + 6_000)),
        incident: Some(Incident {
            started: hb + 8_500,
            id: "i-1".into(),
        }),
        ..Marks::default()
    };
    let now = hb + 20_000;
    let v = verdict(Some(&status), &marks, NodeContext::default(), now, &fixed);
    assert_eq!(v, Verdict::Healthy, "fresh by the fixed rule");
    let fx = plan(v, Some(&status), &marks, now, &fixed);
    assert!(
        !fx.contains(&Effect::ClearSuspect)
            && !fx.contains(&Effect::ClearIncident(TimerEnd::Recovered)),
        "{fx:?}"
    );
    let beat = rec(WorkerState::Processing, hb + 19_000);
    let fx = plan(v, Some(&beat), &marks, now, &fixed);
    assert!(
        fx.contains(&Effect::ClearSuspect)
            && fx.contains(&Effect::ClearIncident(TimerEnd::Recovered)),
        "{fx:?}"
    );
}
