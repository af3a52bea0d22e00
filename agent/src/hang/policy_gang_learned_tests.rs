//! The gang's learned evidence (`learned_stop`, `due_on`): a restart on it only when every
//! member's agent holds a learned rule and every member is silent past it, for the longest of
//! their waits; anything short of that is the fixed rule, never sooner than it.

use super::tests::{open, rules, timing};
use super::*;
use crate::hang::model_gang::Decision;
use crate::hang::model_rhythm::Learned;

const S: Millis = 1_000;

/// Whether the hung gang's restart is due, on whatever basis ([`due_on`]).
fn restart_due(started: Millis, members: &[Member], now: Millis, t: &Timing) -> bool {
    due_on(started, members, now, t).is_some()
}

/// A member of node `n` its agent calls `verdict`, last beat at `hb`, allowed the fixed 120 s,
/// and — with `wait` — a learned rule of a 6 s silence and that wait.
fn m(n: &str, verdict: Verdict, hb: Millis, wait: Option<Millis>) -> Member {
    Member {
        verdict,
        heartbeat: Some(hb),
        silence: 120 * S,
        learned: wait.map(|wait| Learned { silence: 6 * S, wait }),
        started: Some(0),
        breaker_left: Some(3),
        ..Member::working(n, "rank", hb)
    }
}

/// The entries as their agents wrote them at `at` (each looked then).
fn looked(gang: &[Member], at: Millis) -> Vec<Member> {
    gang.iter().cloned().map(|m| Member { at, ..m }).collect()
}

#[test]
fn a_collective_silent_past_every_members_learned_silence_is_hung_then_due_after_the_longest_wait()
{
    let t = timing();
    let hb = 1_000 * S;
    // Ranks stop within a second of each other (the next all-reduce blocks them all).
    let gang = [
        m("a", Verdict::Suspect, hb, Some(4 * S)),
        m("b", Verdict::Healthy, hb + S, Some(9 * S)),
        m("c", Verdict::Suspect, hb - S, Some(5 * S)),
    ];
    // b passes its 6 s last, at hb + 7 s: not before, as its agent sees it.
    let early = looked(&gang, hb + 7 * S);
    assert_eq!(verdict(&early, hb + 7 * S), GangVerdict::Running);
    assert_eq!(learned_stop(&early), None);
    let now = hb + 7 * S + 1;
    let gang = looked(&gang, now);
    assert_eq!(learned_stop(&gang), Some((hb + 7 * S, 9 * S)));
    assert_eq!(verdict(&gang, now), GangVerdict::Hung { first: "c/rank".into() });
    // Persistence: the longest wait (9 s) past the moment the last member passed its silence
    // (and past the incident's start, here a moment later).
    let started = now;
    assert!(!restart_due(started, &gang, started + 9 * S - 1, &t));
    let at = started + 9 * S;
    assert_eq!(
        due_on(started, &gang, at, &t),
        Some(Basis::Learned { since: hb + 7 * S, wait: 9 * S })
    );
    let steps = plan(&verdict(&gang, at), &open(started), &gang, &gang[0], at, &rules());
    assert_eq!(steps, vec![GangStep::PageHung, GangStep::Decide]);
    // The same entries as their agents wrote them before they passed their silences (a poll
    // earlier): each may have beaten since, as far as the gang can know — no evidence, however
    // late the reader.
    let lagging = looked(&gang, hb + 2 * S);
    assert_eq!(learned_stop(&lagging), None);
    assert!(!restart_due(started, &lagging, at + 60 * S, &t));
    // Each member's own restart under that decision: silent past its learned silence, though
    // within the fixed one.
    let d = Decision { decided: at, incident: "g1".into(), only: None };
    assert!(executable(&d, &looked(&gang, at)[0], at, &t));
}

#[test]
fn one_member_without_a_learned_rule_leaves_the_whole_gang_to_the_fixed_rule() {
    let t = timing();
    let hb = 1_000 * S;
    let now = hb + 60 * S;
    let mut gang = looked(
        &[
            m("a", Verdict::Suspect, hb, Some(4 * S)),
            m("b", Verdict::Suspect, hb, Some(4 * S)),
            m("c", Verdict::Suspect, hb, None),
        ],
        now,
    );
    // Silent for a minute: past every learned silence, within c's fixed one.
    assert_eq!(learned_stop(&gang), None);
    assert_eq!(verdict(&gang, now), GangVerdict::Running);
    assert!(!restart_due(hb + 10 * S, &gang, now, &t));
    // c is confirmed hung by the fixed rule (its agent's second look, at hb + 130 s at the
    // earliest): the restart waits `restart_delay` past that, whenever the incident opened.
    gang[2].verdict = Verdict::Hung;
    let fixed = hb + 120 * S + t.confirm_after;
    assert!(!restart_due(hb + 10 * S, &gang, fixed + t.restart_delay - 1, &t));
    assert_eq!(due_on(hb + 10 * S, &gang, fixed + t.restart_delay, &t), Some(Basis::Fixed));
}

/// A member its agent confirmed hung beside one silent past its learned silence but within the
/// fixed one: a straggler, as without learning (the learned rule of some members only changes
/// nothing: an older agent reading the same entries judges them the same).
#[test]
fn learned_rules_of_some_members_only_change_no_verdict() {
    let hb = 1_000 * S;
    let now = hb + 60 * S;
    let gang = looked(
        &[m("a", Verdict::Hung, hb - 100 * S, None), m("b", Verdict::Suspect, hb, Some(4 * S))],
        now,
    );
    assert_eq!(verdict(&gang, now), GangVerdict::Straggler(vec!["a/rank".into()]));
    let plain: Vec<Member> = gang.iter().cloned().map(|m| Member { learned: None, ..m }).collect();
    assert_eq!(verdict(&plain, now), verdict(&gang, now));
}

#[test]
fn an_incident_opened_on_learned_evidence_that_no_longer_holds_waits_for_the_fixed_rule() {
    let t = timing();
    let hb = 1_000 * S;
    let gang =
        [m("a", Verdict::Suspect, hb, Some(4 * S)), m("b", Verdict::Suspect, hb, Some(4 * S))];
    // Opened on learned evidence at hb + 7 s; then b's agent restarts and has no rule yet.
    let started = hb + 7 * S;
    let mut gang = looked(&gang, started);
    assert!(matches!(verdict(&gang, started), GangVerdict::Hung { .. }));
    gang[1].learned = None;
    // a is confirmed hung by the fixed rule (its agent's verdict): the restart waits for
    // `restart_delay` past the moment the fixed rule stopped it, not past the incident's start.
    gang[0].verdict = Verdict::Hung;
    let fixed = hb + 120 * S + t.confirm_after;
    assert!(!restart_due(started, &gang, started + t.restart_delay, &t));
    assert!(!restart_due(started, &gang, fixed + t.restart_delay - 1, &t));
    assert!(restart_due(started, &gang, fixed + t.restart_delay, &t));
}

#[test]
fn a_member_within_its_learned_silence_or_not_an_ordinary_worker_is_no_learned_evidence() {
    let hb = 1_000 * S;
    let now = hb + 30 * S;
    let beating = looked(
        &[
            m("a", Verdict::Suspect, hb, Some(4 * S)),
            m("b", Verdict::Healthy, now - S, Some(4 * S)),
        ],
        now,
    );
    assert_eq!(learned_stop(&beating), None);
    assert_eq!(
        verdict(&beating, now),
        GangVerdict::Running,
        "one member silent past its learned silence beside a beating one is no straggler: only the fixed rule names one"
    );
    for v in [Verdict::Booting, Verdict::Paused, Verdict::InMaintenance] {
        let gang =
            looked(&[m("a", Verdict::Suspect, hb, Some(4 * S)), m("b", v, hb, Some(4 * S))], now);
        assert_eq!(learned_stop(&gang), None, "{v:?}");
    }
    let mut idle = looked(&[m("b", Verdict::Healthy, hb, Some(4 * S))], now).remove(0);
    idle.activity = Activity::Idle;
    assert_eq!(learned_stop(&[beating[0].clone(), idle]), None);
    assert_eq!(learned_stop(&[]), None);
}

#[test]
fn without_learned_rules_the_fixed_rule_is_exactly_as_before() {
    let t = timing();
    let hb = 1_000 * S;
    let gang = [m("a", Verdict::Hung, hb, None), m("b", Verdict::Suspect, hb, None)];
    // The incident's start alone, as before any learning (even one opened before the fixed
    // silence ran out, as a test or a clock jump may).
    let started = hb + 50 * S;
    assert!(!restart_due(started, &gang, started + t.restart_delay - 1, &t));
    assert!(restart_due(started, &gang, started + t.restart_delay, &t));
}

#[test]
fn the_learned_rule_rides_in_the_entry_and_an_older_agents_entry_has_none() {
    let e = m("a", Verdict::Suspect, 5, Some(7_000));
    let json = serde_json::to_string(&e).unwrap();
    assert!(json.contains("\"lr\":{\"s\":6000,\"w\":7000}"), "{json}");
    let back: Member = serde_json::from_str(&json).unwrap();
    assert_eq!(back.learned, e.learned);
    let old = json.replace(",\"lr\":{\"s\":6000,\"w\":7000}", "");
    assert_eq!(serde_json::from_str::<Member>(&old).unwrap().learned, None);
}

/// An incident opened on learned evidence is open while every member is still within the fixed
/// rule's silence: only a beat since the incident began ends it.
#[test]
fn an_incident_on_learned_evidence_ends_only_with_a_beat_since_it_began() {
    let t = timing();
    let hb = 1_000 * S;
    let started = hb + 7 * S;
    let mut gang = looked(
        &[m("a", Verdict::Suspect, hb, Some(4 * S)), m("b", Verdict::Suspect, hb, Some(4 * S))],
        started,
    );
    let state = open(started);
    assert!(progressing(&gang[1], started + 30 * S), "within 120 s");
    assert!(!incident_over(&state, &gang, started + 30 * S, &t));
    // b's agent restarts and holds no rule: still no beat since.
    gang[1].learned = None;
    gang[1].at = started + 30 * S;
    assert!(!incident_over(&state, &gang, started + 30 * S, &t));
    // b beats: the collective moves again.
    gang[1].heartbeat = Some(started + 31 * S);
    gang[1].at = started + 32 * S;
    assert!(incident_over(&state, &gang, started + 32 * S, &t));
}
