//! The learned silence: what is learned, what never is, and what it changes in the verdict.

use super::*;
use crate::hang::model::Gang;
use crate::hang::model::Incident;
use crate::hang::model::Marks;
use crate::hang::policy::{plan, verdict, Effect, NodeContext, TimerEnd, Verdict};
use std::time::Duration;

impl Rhythm {
    /// A look that learns from the first sample on (the settling is tested on its own).
    fn look(&mut self, status: Option<&WorkerStatus>, now: Millis) {
        self.observe(status, now, 0);
    }
}

/// What an agent learned of the current incarnation: `samples` silences of 1 s at most.
fn own(samples: u32) -> Own {
    Own { samples, longest: 1_000, ..Own::default() }
}

fn cfg() -> PolicyConfig {
    let mut c = PolicyConfig::default();
    c.learned.enabled = true;
    c
}

fn rec(state: WorkerState, hb: Millis) -> WorkerStatus {
    WorkerStatus { state, ..WorkerStatus::processing(Some(hb)) }
}

/// A worker beating every `every` ms looked at every `poll` ms for `polls` looks, starting at
/// `t0`; returns the time of the last look.
fn steady(r: &mut Rhythm, t0: Millis, every: Millis, poll: Millis, polls: i64) -> Millis {
    let mut now = t0;
    for _ in 0..polls {
        let hb = now - now % every;
        r.look(Some(&rec(WorkerState::Processing, hb)), now);
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
        r.look(Some(&rec(WorkerState::Processing, hb)), last + i * 2000);
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
        r.look(Some(&rec(WorkerState::Other("eval".into()), eval)), eval + i * 2000);
    }
    r.look(Some(&rec(WorkerState::Processing, eval + 90_000)), eval + 90_500);
    assert_eq!(r.silence(&c), learned);
    // A busy phase (a grace), even in `processing`: its silence is not learned.
    let mut busy = rec(WorkerState::Processing, eval + 91_000);
    busy.grace = Some(600_000);
    for i in 0..30 {
        r.look(Some(&busy), eval + 91_000 + i * 2000);
    }
    r.look(Some(&rec(WorkerState::Processing, eval + 200_000)), eval + 200_500);
    assert_eq!(r.silence(&c), learned);
}

#[test]
fn a_long_silence_come_back_from_raises_it_and_stale_after_caps_it() {
    use crate::hang::model_rhythm::{bucket, upper};
    let c = cfg();
    let mut r = Rhythm::default();
    let last = steady(&mut r, 1_000_000, 1000, 2000, 60);
    // An unannounced 20 s pause in `processing` that ended (last seen 18 s old): among 60
    // samples the 0.99 quantile is the largest, so 4 × 18 s (its bucket's bound: within 20 %).
    let hb = last - last % 1000;
    for i in 0..10 {
        r.look(Some(&rec(WorkerState::Processing, hb)), hb + i * 2000);
    }
    r.look(Some(&rec(WorkerState::Processing, hb + 20_000)), hb + 20_000);
    let eighteen = upper(bucket(18_000));
    assert_eq!(r.silence(&c), Some(4 * eighteen));
    // However many short silences follow, it is never under 1.5 × 18 s: the worker survived it.
    let last = steady(&mut r, hb + 21_000, 1000, 2000, 300);
    assert_eq!(r.silence(&c), Some(27_000));
    // ... in a later incarnation too, once that one has shown its own rhythm.
    r.new_incarnation();
    assert_eq!(r.silence(&c), None, "a new incarnation: the fixed rule first");
    let last = steady(&mut r, last + 60_000, 1000, 2000, 31);
    assert_eq!(r.silence(&c), Some(27_000));
    let hb = last - last % 1000;
    // One of 100 s: capped by stale_after (2 m).
    for i in 0..50 {
        r.look(Some(&rec(WorkerState::Processing, hb + 20_000)), hb + 20_000 + i * 2000);
    }
    r.look(Some(&rec(WorkerState::Processing, hb + 120_000)), hb + 120_000);
    assert_eq!(r.silence(&c), Some(120_000));
}

#[test]
fn the_coordinators_copy_is_merged_and_written_back_at_most_once_a_minute() {
    let c = cfg();
    let mut r = Rhythm::default();
    assert_eq!(r.write_due(0), None, "nothing learned, nothing written");
    let last = steady(&mut r, 1_000_000, 1000, 2000, 40);
    let first = r.write_due(last).expect("the first samples go out at once");
    let written = crate::hang::model_rhythm::History::decode(&first).unwrap();
    assert_eq!(written.total(), r.samples());
    let later = steady(&mut r, last + 2000, 1000, 2000, 10);
    assert_eq!(r.write_due(later), None, "within the minute");
    assert!(r.write_due(last + WRITE_EVERY).is_some());
    assert_eq!(r.write_due(last + 3 * WRITE_EVERY), None, "nothing new");
    // Another agent's copy (it saw a 30 s silence this one never did) raises the silence once
    // this agent has seen the incarnation's rhythm itself.
    let mut theirs = written;
    theirs.add(30_000);
    let mut fresh = Rhythm::default();
    fresh.adopt(Some(&theirs));
    assert_eq!(fresh.silence(&c), None, "an agent just started: the fixed rule");
    steady(&mut fresh, 5_000_000, 1000, 2000, 31);
    // (`steady` learns from the first sample; an agent settles first, see below.)
    let thirty = crate::hang::model_rhythm::upper(crate::hang::model_rhythm::bucket(30_000));
    assert_eq!(fresh.silence(&c), Some((4 * thirty).min(120_000)));
}

#[test]
fn an_incarnations_first_silences_count_only_towards_its_own() {
    let c = cfg();
    let mut r = Rhythm::default();
    // A 60 s compile after the first beat, then 1 s steps.
    let start = 1_000_000;
    r.observe(Some(&rec(WorkerState::Processing, start)), start, 30);
    r.observe(Some(&rec(WorkerState::Processing, start)), start + 60_000, 30);
    let mut now = start + 61_000;
    for _ in 0..30 {
        r.observe(Some(&rec(WorkerState::Processing, now - 500)), now, 30);
        now += 2_000;
    }
    assert_eq!(
        (r.own().samples, r.samples()),
        (0, 0),
        "the compile and the warm-up are not learned"
    );
    assert_eq!(r.silence(&c), None);
    for _ in 0..30 {
        r.observe(Some(&rec(WorkerState::Processing, now - 500)), now, 30);
        now += 2_000;
    }
    assert_eq!((r.own().samples, r.samples()), (30, 30));
    assert_eq!(r.silence(&c), Some(5_000), "the steps' rhythm, at the floor");
}

#[test]
fn a_restart_from_the_rhythm_stands_only_on_the_coordinators_copy_and_its_history() {
    use crate::hang::model_rhythm::History;
    let mut c = cfg();
    c.learned.restarts = true;
    let p = rec(WorkerState::Processing, 0);
    let now = 100 * 3_600_000;
    let mut old = History::new(now - 7 * 3_600_000);
    for _ in 0..100 {
        old.add(1_000);
    }
    old.add(8_000);
    let silence = silence_of(&old, &Own::default(), &c).unwrap().silence;
    // 1.5 × the 8 s silence it survived; the usual: 4 × ~1 s (its bucket's bound), at least
    // 5 s.
    assert_eq!(silence, 12_000);
    let usual =
        (4 * crate::hang::model_rhythm::upper(crate::hang::model_rhythm::bucket(1_000))).max(5_000);
    let fixed = |shared: Option<&History>, samples: u32, cfg: &PolicyConfig| {
        *restart_policy(cfg, shared, own(samples), Some(&p), now) == *cfg
    };
    let got = restart_policy(&c, Some(&old), own(30), Some(&p), now);
    assert_eq!(got.stale_after, Duration::from_millis(silence as u64));
    assert_eq!(
        got.restart_delay,
        Duration::from_millis(usual as u64),
        "persists for its usual silence"
    );
    assert_eq!(got.confirm_after, got.stale_after / 2);
    // Anything short of it: the fixed rule.
    assert!(fixed(None, 30, &c), "no copy in the coordinator");
    assert!(fixed(Some(&old), 29, &c), "too few samples of this incarnation");
    let mut young = old;
    young.since = now - 3_600_000;
    assert!(fixed(Some(&young), 30, &c), "history shorter than 6 h");
    let mut off = c.clone();
    off.learned.restarts = false;
    assert!(fixed(Some(&old), 30, &off), "learned restarts off");
    for other in [
        rec(WorkerState::Other("eval".into()), 0),
        WorkerStatus { grace: Some(60_000), ..p.clone() },
    ] {
        assert_eq!(*restart_policy(&c, Some(&old), own(30), Some(&other), now), c, "{other:?}");
    }
    // The persistence is at least the floor, at most restart_delay.
    let mut floor = c.clone();
    floor.learned.floor = Duration::from_secs(12);
    assert_eq!(
        restart_policy(&floor, Some(&old), own(30), Some(&p), now).restart_delay,
        Duration::from_secs(12)
    );
    let mut short = c.clone();
    short.restart_delay = Duration::from_secs(3);
    assert_eq!(
        restart_policy(&short, Some(&old), own(30), Some(&p), now).restart_delay,
        Duration::from_secs(3)
    );
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
        WorkerStatus { grace: Some(60_000), ..p.clone() },
        // A gang member keeps the fixed rule: its learned one rides in its gang entry.
        WorkerStatus { gang: Some(Gang { id: "ns/job".into(), size: Some(4) }), ..p.clone() },
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
    assert_eq!(at(5_000, &Marks::default()), Verdict::Healthy, "exactly 5 s");
    assert_eq!(at(6_000, &Marks::default()), Verdict::Suspect);
    let seen = Marks { suspect: Some((hb, hb + 6_000)), ..Marks::default() };
    assert_eq!(at(8_000, &seen), Verdict::Suspect, "confirmation after 2.5 s");
    assert_eq!(at(8_500, &seen), Verdict::Hung);
    // The fixed rule would still call it healthy.
    assert_eq!(verdict(Some(&status), &seen, node, hb + 8_500, &c), Verdict::Healthy);
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
        incident: Some(Incident { started: hb + 8_500, id: "i-1".into() }),
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

#[test]
fn a_new_program_is_restarted_by_its_own_rhythm_never_the_old_ones() {
    use crate::hang::model_rhythm::History;
    let mut c = cfg();
    c.learned.restarts = true;
    let now = 100 * 3_600_000;
    let mut old = History::new(now - 7 * 3_600_000);
    for _ in 0..100 {
        old.add(1_000);
    }
    let p = rec(WorkerState::Processing, 0);
    // The new incarnation steps every 45 s: past its settling, its own silences are 45 s, and
    // a restart allows it 1.5 × that however short the old history's silence.
    let slow = Own { samples: 30, longest: 45_000, ..Own::default() };
    let got = restart_policy(&c, Some(&old), slow, Some(&p), now);
    assert_eq!(got.stale_after, Duration::from_millis(67_500));
    // Not yet past its settling: the fixed rule.
    let settling = Own::default();
    assert_eq!(*restart_policy(&c, Some(&old), settling, Some(&p), now), c);
    // A gang member: the fixed rule, whatever was learned.
    let member = WorkerStatus {
        gang: Some(crate::hang::model::Gang { id: "ns/job".into(), size: Some(4) }),
        ..p.clone()
    };
    assert_eq!(*restart_policy(&c, Some(&old), own(30), Some(&member), now), c);
}

#[test]
fn a_copy_gone_from_the_coordinator_is_gone_for_the_agent_that_wrote_one() {
    let c = cfg();
    let mut r = Rhythm::default();
    let last = steady(&mut r, 1_000_000, 1000, 2000, 40);
    assert!(r.write_due(last).is_some());
    assert!(r.silence(&c).is_some());
    // Deleted (or lost in a failover): the agent drops what it learned instead of writing it
    // back, and learns anew.
    r.adopt(None);
    assert_eq!((r.samples(), r.silence(&c)), (0, None));
    let later = steady(&mut r, last + 2_000, 1000, 2000, 3);
    let fresh = r.write_due(later).expect("the new history");
    assert_eq!(crate::hang::model_rhythm::History::decode(&fresh).map(|h| h.total()), Some(3));
    // An agent that never wrote keeps what it learned until it writes the first copy.
    let mut other = Rhythm::default();
    steady(&mut other, 1_000_000, 1000, 2000, 10);
    other.adopt(None);
    assert_eq!(other.samples(), 9);
}

#[test]
fn a_longer_silence_is_written_at_once_and_an_incarnation_seen_late_starts_over() {
    let c = cfg();
    let mut r = Rhythm::default();
    r.see_incarnation("c1:t0");
    let last = steady(&mut r, 1_000_000, 1000, 2000, 40);
    assert!(r.write_due(last).is_some());
    // A 20 s silence come back from, seconds after the last write: written at once.
    let hb = last - last % 1000;
    r.look(Some(&rec(WorkerState::Processing, hb)), hb + 18_000);
    r.look(Some(&rec(WorkerState::Processing, hb + 20_000)), hb + 20_000);
    let raw = r.write_due(hb + 20_000).expect("the longest grew");
    assert_eq!(crate::hang::model_rhythm::History::decode(&raw).map(|h| h.longest), Some(18_000));
    // Another incarnation, however this agent comes to see it: its own samples start over.
    assert!(r.silence(&c).is_some());
    r.see_incarnation("c1:t0");
    assert!(r.silence(&c).is_some(), "the same one");
    r.see_incarnation("c2:t1");
    assert_eq!(r.silence(&c), None);
    assert_eq!(r.own(), Own::default());
}

/// Looks in step with the beats (a worker beating every 15 s looked at every 15 s, just after
/// each beat) see ages of a moment: the learned silence is never under 1.5 × the time between
/// the heartbeats seen, so the next late beat is no hang — for the verdict and for a restart.
#[test]
fn looks_in_step_with_the_beats_never_teach_a_silence_under_the_beat() {
    use crate::hang::model_rhythm::{bucket, upper};
    let mut c = cfg();
    c.learned.restarts = true;
    let mut r = Rhythm::default();
    let t0 = 1_000_000;
    for i in 0..40 {
        let hb = t0 + i * 15_000;
        r.look(Some(&rec(WorkerState::Processing, hb)), hb + 200);
    }
    let beat = upper(bucket(15_000));
    assert_eq!(r.own().beat_margin(), beat + beat / 2);
    assert_eq!(r.silence(&c), Some(beat + beat / 2), "not the 5 s floor the ages alone teach");
    let now = t0 + 40 * 15_000;
    let mut shared = crate::hang::model_rhythm::History::new(now - 7 * 3_600_000);
    for _ in 0..100 {
        shared.add(200);
    }
    let rule =
        learned_rule(&c, Some(&shared), r.own(), Some(&rec(WorkerState::Processing, now)), now)
            .expect("a learned rule");
    assert_eq!(rule.silence, beat + beat / 2);
    assert_eq!(rule.wait, 5_000, "the usual silence: the floor");
}
