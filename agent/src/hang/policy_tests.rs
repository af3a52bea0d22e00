//! Table-driven tests of the verdicts and the plan, with a fixed `now`.

use super::*;
use crate::hang::model::Incident;
use crate::hang::policy_record::booted;
use crate::hang::policy_table::table;
use std::time::Duration;

/// The tests' `now`, and a second: shared with the hang path's other policy tests.
pub(crate) const NOW: Millis = 1_800_000_000_000;
pub(crate) const S: Millis = 1000;

fn clears_timer(p: &[Effect]) -> bool {
    p.iter().any(|e| matches!(e, Effect::ClearIncident(_)))
}

pub(crate) fn cfg() -> PolicyConfig {
    PolicyConfig::default()
}

/// A record in `state` whose heartbeat is `hb_age` old at `NOW`.
pub(crate) fn rec(state: &str, hb_age: Millis) -> WorkerStatus {
    WorkerStatus {
        state: WorkerState::parse(state),
        heartbeat: Some(NOW - hb_age),
        job: Some("job-7".into()),
        progress: Some("step-10".into()),
        grace: None,
        alert_only: false,
        rank: None,
        gang: None,
        checkpoint_step: None,
        compute: None,
    }
}

/// The verdict at `NOW` with the default policy.
pub(crate) fn v(status: Option<&WorkerStatus>, marks: &Marks) -> Verdict {
    verdict(status, marks, NodeContext::default(), NOW, &cfg())
}

#[test]
fn heartbeat_exactly_stale_after_is_fresh() {
    let r = rec("processing", 120 * S);
    assert_eq!(v(Some(&r), &Marks::default()), Verdict::Healthy);
    let r = rec("processing", 120 * S + 1);
    assert_eq!(v(Some(&r), &Marks::default()), Verdict::Suspect);
}

#[test]
fn hang_needs_a_second_observation_of_the_same_heartbeat() {
    let r = rec("processing", 200 * S);
    let hb = r.heartbeat.unwrap();
    let cases: &[(Option<(Millis, Millis)>, Verdict)] = &[
        (None, Verdict::Suspect),
        // The second observation, exactly confirm_after later: confirmed.
        (Some((hb, NOW - 10 * S)), Verdict::Hung),
        // Too soon after the first: still one observation.
        (Some((hb, NOW - 10 * S + 1)), Verdict::Suspect),
        // A different (older) heartbeat was seen stale: the worker beat in between.
        (Some((hb - 5 * S, NOW - 60 * S)), Verdict::Suspect),
    ];
    for (suspect, want) in cases {
        let m = Marks { suspect: *suspect, ..Marks::default() };
        assert_eq!(v(Some(&r), &m), *want, "suspect={suspect:?}");
    }
}

#[test]
fn error_state_becomes_errored_at_exactly_error_for() {
    let r = rec("error", 1);
    let at = |since| Marks { error_since: Some(since), ..Marks::default() };
    assert_eq!(v(Some(&r), &Marks::default()), Verdict::ErrorPending);
    assert_eq!(v(Some(&r), &at(NOW - 1800 * S + 1)), Verdict::ErrorPending);
    assert_eq!(v(Some(&r), &at(NOW - 1800 * S)), Verdict::Errored);
}

#[test]
fn missing_or_unreadable_record_is_unreachable() {
    assert_eq!(v(None, &Marks::default()), Verdict::Unreachable);
    let mut r = rec("processing", 0);
    r.heartbeat = None;
    assert_eq!(v(Some(&r), &Marks::default()), Verdict::Unreachable);
}

#[test]
fn frozen_progress_with_fresh_heartbeat_is_stalled_not_hung() {
    let r = rec("processing", 5 * S);
    let m = |since| Marks { progress: Some(("step-10".into(), since)), ..Marks::default() };
    assert_eq!(v(Some(&r), &m(NOW - 1800 * S)), Verdict::Stalled);
    assert_eq!(v(Some(&r), &m(NOW - 1800 * S + 1)), Verdict::Healthy);
    let moved = Marks { progress: Some(("step-9".into(), NOW - 3600 * S)), ..Marks::default() };
    assert_eq!(v(Some(&r), &moved), Verdict::Healthy);
}

#[test]
fn cooldown_wins_over_everything() {
    let m = Marks { cooldown: true, ..Marks::default() };
    for r in [None, Some(rec("processing", 900 * S)), Some(rec("error", 0))] {
        assert_eq!(v(r.as_ref(), &m), Verdict::Booting);
    }
}

#[test]
fn maintenance_and_gpu_failure_suppress_restarts() {
    let r = rec("processing", 900 * S);
    let hb = r.heartbeat.unwrap();
    let m = Marks { suspect: Some((hb, NOW - 60 * S)), ..Marks::default() };
    let maint = NodeContext { in_maintenance: true, ..NodeContext::default() };
    let gpu = NodeContext { gpu_failed: true, ..NodeContext::default() };
    assert_eq!(verdict(Some(&r), &m, maint, NOW, &cfg()), Verdict::InMaintenance);
    assert_eq!(verdict(Some(&r), &m, gpu, NOW, &cfg()), Verdict::GpuFailed);
    assert_ne!(Verdict::GpuFailed.action(), Action::RestartPipeline);
    let tpu = NodeContext { tpu_failed: true, ..NodeContext::default() };
    assert_eq!(verdict(Some(&r), &m, tpu, NOW, &cfg()), Verdict::TpuFailed);
    assert_eq!(Verdict::TpuFailed.action(), Action::AlertNoRestart);
    // A failed TPU changes nothing for a healthy worker.
    let fresh = rec("processing", 0);
    assert_eq!(verdict(Some(&fresh), &Marks::default(), tpu, NOW, &cfg()), Verdict::Healthy);
    assert_ne!(Verdict::InMaintenance.action(), Action::RestartPipeline);
}

#[test]
fn only_hung_and_errored_reach_the_restart_pipeline() {
    for &verdict in Verdict::ALL {
        let restarts = verdict.action() == Action::RestartPipeline;
        assert_eq!(restarts, matches!(verdict, Verdict::Hung | Verdict::Errored), "{verdict:?}");
    }
}

#[test]
fn plan_for_first_stale_sighting_records_it() {
    let r = rec("processing", 200 * S);
    let m = Marks::default();
    let p = plan(Verdict::Suspect, Some(&r), &m, NOW, &cfg());
    assert_eq!(p, vec![Effect::RecordSuspect { heartbeat: r.heartbeat.unwrap() }]);
}

#[test]
fn plan_for_confirmed_hang_opens_the_timer_once() {
    let r = rec("processing", 200 * S);
    let hb = r.heartbeat.unwrap();
    let mut m = Marks { suspect: Some((hb, NOW - 30 * S)), ..Marks::default() };
    let p = plan(Verdict::Hung, Some(&r), &m, NOW, &cfg());
    assert_eq!(p, vec![Effect::OpenIncident, Effect::AlertIncident, Effect::ConsiderRestart]);
    m.incident = Some(Incident { started: NOW - 10 * S, id: "i1".into() });
    let p = plan(Verdict::Hung, Some(&r), &m, NOW, &cfg());
    assert!(!p.contains(&Effect::OpenIncident), "an existing timer is never reset");
}

#[test]
fn unconfirmed_instance_never_clears_anothers_timer() {
    // Instance B sees the stale heartbeat for the first time (Suspect) while instance A has
    // already confirmed and opened the timer: B must leave it alone.
    let r = rec("processing", 200 * S);
    let m = Marks {
        incident: Some(Incident { started: NOW - 60 * S, id: "i1".into() }),
        ..Marks::default()
    };
    let p = plan(Verdict::Suspect, Some(&r), &m, NOW, &cfg());
    assert!(!clears_timer(&p));
}

#[test]
fn fresh_heartbeat_clears_the_timer() {
    let r = rec("processing", S);
    let m = Marks {
        incident: Some(Incident { started: NOW - 60 * S, id: "i1".into() }),
        suspect: Some((NOW - 300 * S, NOW - 100 * S)),
        ..Marks::default()
    };
    let p = plan(Verdict::Healthy, Some(&r), &m, NOW, &cfg());
    assert!(p.contains(&Effect::ClearSuspect));
    assert!(p.contains(&Effect::ClearIncident(TimerEnd::Recovered)));
}

#[test]
fn cooldown_clears_the_persistence_timer_and_records_no_sighting() {
    let r = rec("processing", 900 * S);
    let m = Marks {
        cooldown: true,
        incident: Some(Incident { started: NOW - 600 * S, id: "i1".into() }),
        suspect: Some((NOW - 900 * S, NOW - 700 * S)),
        ..Marks::default()
    };
    let p = plan(Verdict::Booting, Some(&r), &m, NOW, &cfg());
    assert_eq!(p, vec![Effect::ClearSuspect, Effect::ClearIncident(TimerEnd::Booting)]);
}

#[test]
fn escalation_exactly_once_after_escalate_after() {
    let r = rec("processing", 900 * S);
    let restarted = |at, escalated| Marks {
        restarted_at: Some(at),
        escalated,
        cooldown: true,
        ..Marks::default()
    };
    let c = cfg();
    let p = plan(Verdict::Booting, Some(&r), &restarted(NOW - 600 * S + 1, false), NOW, &c);
    assert!(!p.contains(&Effect::Escalate));
    let p = plan(Verdict::Booting, Some(&r), &restarted(NOW - 600 * S, false), NOW, &c);
    assert!(p.contains(&Effect::Escalate));
    let p = plan(Verdict::Booting, Some(&r), &restarted(NOW - 900 * S, true), NOW, &c);
    assert!(!p.contains(&Effect::Escalate), "already paged");
    let fresh = rec("processing", S);
    let m = Marks { restarted_at: Some(NOW - 900 * S), ..Marks::default() };
    let p = plan(Verdict::Healthy, Some(&fresh), &m, NOW, &c);
    assert!(
        p.contains(&Effect::ForgetRestart) && !p.contains(&Effect::Escalate),
        "recovered after the restart"
    );
    // A record from the future (a rank writing milliseconds) beats: the restart is forgotten.
    let mut ahead = rec("processing", 0);
    ahead.heartbeat = Some(NOW * 1000);
    let v = verdict(Some(&ahead), &m, NodeContext::default(), NOW, &c);
    assert_eq!(v, Verdict::Unreachable);
    assert!(plan(v, Some(&ahead), &m, NOW, &c).contains(&Effect::ForgetRestart));
    // Not a record that is missing.
    assert!(!plan(Verdict::Unreachable, None, &m, NOW, &c).contains(&Effect::ForgetRestart));
}

#[test]
fn episodes_open_once_and_close_when_the_condition_ends() {
    let p = plan(Verdict::Unreachable, None, &Marks::default(), NOW, &cfg());
    assert_eq!(p, vec![Effect::OpenEpisode(Episode::Unreachable)]);
    let open = Marks { episodes: vec![Episode::Unreachable], ..Marks::default() };
    let p = plan(Verdict::Unreachable, None, &open, NOW, &cfg());
    assert!(p.is_empty(), "alert once, not once per cycle");
    let r = rec("processing", S);
    let p = plan(Verdict::Healthy, Some(&r), &open, NOW, &cfg());
    assert!(p.contains(&Effect::CloseEpisode(Episode::Unreachable)));
    // Each alert-only condition opens its own episode; no other verdict opens one.
    let own = [
        (Verdict::Unreachable, Episode::Unreachable),
        (Verdict::Stalled, Episode::Stalled),
        (Verdict::Paused, Episode::Paused),
        (Verdict::Exited, Episode::Exited),
        (Verdict::GpuFailed, Episode::GpuFailed),
        (Verdict::TpuFailed, Episode::TpuFailed),
    ];
    for v in Verdict::ALL.iter().copied() {
        let want = own.iter().find(|(w, _)| *w == v).map(|(_, e)| Effect::OpenEpisode(*e));
        assert_eq!(
            episode_effects(v, &Marks::default()),
            want.into_iter().collect::<Vec<_>>(),
            "{v:?}"
        );
    }
}

#[test]
fn error_and_progress_marks_follow_the_record() {
    let r = rec("error", 1);
    let p = plan(Verdict::ErrorPending, Some(&r), &Marks::default(), NOW, &cfg());
    assert_eq!(p, vec![Effect::MarkErrorSince]);
    let ok = rec("processing", S);
    let m = Marks {
        error_since: Some(NOW - S),
        progress: Some(("step-9".into(), NOW - 60 * S)),
        ..Marks::default()
    };
    let p = plan(Verdict::Healthy, Some(&ok), &m, NOW, &cfg());
    assert_eq!(p, vec![Effect::ClearErrorSince, Effect::RecordProgress("step-10".into())]);
}

#[test]
fn table_covers_every_verdict_with_configured_thresholds() {
    let mut c = cfg();
    c.stale_after = Duration::from_secs(90);
    let t = table(&c);
    assert_eq!(t.len(), Verdict::ALL.len());
    let hung = t.iter().find(|r| r.verdict == "hung").unwrap();
    assert!(hung.predicate.contains("1m 30s"), "{}", hung.predicate);
    assert!(hung.action.starts_with("restart pipeline"));
}

#[test]
fn an_unreadable_heartbeat_never_clears_the_timer() {
    let mut r = rec("processing", 0);
    r.heartbeat = None;
    let m = Marks {
        incident: Some(Incident { started: NOW - 60 * S, id: "i1".into() }),
        ..Marks::default()
    };
    let p = plan(Verdict::Unreachable, Some(&r), &m, NOW, &cfg());
    assert!(!clears_timer(&p));
}

#[test]
fn no_error_clock_starts_while_booting() {
    let r = rec("error", 1);
    let m = Marks { cooldown: true, ..Marks::default() };
    let p = plan(Verdict::Booting, Some(&r), &m, NOW, &cfg());
    assert!(!p.contains(&Effect::MarkErrorSince));
}

#[test]
fn a_paused_container_is_alert_only_and_drops_the_timer() {
    let r = rec("processing", 900 * S);
    let paused = NodeContext { container_paused: true, ..NodeContext::default() };
    let m = Marks {
        incident: Some(Incident { started: NOW - 600 * S, id: "i1".into() }),
        suspect: Some((NOW - 900 * S, NOW - 700 * S)),
        ..Marks::default()
    };
    let v = verdict(Some(&r), &m, paused, NOW, &cfg());
    assert_eq!(v, Verdict::Paused);
    assert_eq!(v.action(), Action::AlertOnly);
    let p = plan(v, Some(&r), &m, NOW, &cfg());
    assert!(p.contains(&Effect::OpenEpisode(Episode::Paused)), "{p:?}");
    assert!(p.contains(&Effect::ClearIncident(TimerEnd::Paused)), "{p:?}");
    assert!(p.contains(&Effect::ClearSuspect), "{p:?}");
    assert!(!p.contains(&Effect::ConsiderRestart) && !p.contains(&Effect::OpenIncident));
}

/// Issue 27: booting ends at the first heartbeat written after the restart was verified (or
/// seen); an old heartbeat, no heartbeat, or a restart still in flight keeps it booting.
#[test]
fn booting_ends_at_a_heartbeat_after_the_restart() {
    let restart = NOW - 60 * S;
    let beat = |age| rec("processing", age);
    assert!(booted(Some(restart), Some(&beat(10 * S))));
    assert!(!booted(Some(restart), Some(&beat(60 * S))), "at the restart: not after it");
    assert!(!booted(Some(restart), Some(&beat(300 * S))), "the old incarnation's");
    let mut none = beat(0);
    none.heartbeat = None;
    assert!(!booted(Some(restart), Some(&none)));
    assert!(!booted(Some(restart), None), "no record");
    assert!(!booted(None, Some(&beat(0))), "a claim in flight never ends early");
}

/// Issue 27: a container that has just started and has not written its own record yet is
/// booting for `start_grace` (120 s), not unreachable; a record from before it started is its
/// predecessor's. After the grace, or with a record of its own, the usual verdicts.
#[test]
fn a_new_container_has_a_start_grace_before_it_is_unreachable() {
    let started =
        |ago: Millis| NodeContext { container_started: Some(NOW - ago), ..NodeContext::default() };
    let at = |node: NodeContext, status: Option<&WorkerStatus>| {
        verdict(status, &Marks::default(), node, NOW, &cfg())
    };
    assert_eq!(at(started(5 * S), None), Verdict::Booting);
    assert_eq!(at(started(119 * S), None), Verdict::Booting);
    assert_eq!(at(started(120 * S), None), Verdict::Unreachable);
    // Its predecessor's stale record (written before it started) is not its own.
    let old = rec("processing", 600 * S);
    assert_eq!(at(started(30 * S), Some(&old)), Verdict::Booting);
    assert_eq!(at(started(300 * S), Some(&old)), Verdict::Suspect);
    // Its own first beat: judged as usual.
    let own = rec("processing", 10 * S);
    assert_eq!(at(started(30 * S), Some(&own)), Verdict::Healthy);
    // Unknown start time (a runtime that does not say): as before.
    assert_eq!(at(NodeContext::default(), None), Verdict::Unreachable);
    // A node clock far ahead of the store's is not believed.
    assert_eq!(at(started(-3_600 * S), None), Verdict::Unreachable);
}

#[test]
fn a_gang_member_leaves_its_page_restart_and_escalation_to_the_gang() {
    let hung = rec("processing", 300 * S);
    let marks = Marks {
        suspect: Some((NOW - 300 * S, NOW - 200 * S)),
        incident: Some(Incident { started: NOW - 400 * S, id: "i".into() }),
        restarted_at: Some(NOW - 3_600 * S),
        ..Marks::default()
    };
    let vd = v(Some(&hung), &marks);
    let alone = plan(vd, Some(&hung), &marks, NOW, &cfg());
    assert!(alone.contains(&Effect::ConsiderRestart) && alone.contains(&Effect::Escalate));
    let gang = for_gang(alone, Some(&hung), &marks, NOW, &cfg());
    assert_eq!(gang.last(), Some(&Effect::Gang));
    assert!(!gang
        .iter()
        .any(|e| matches!(e, Effect::AlertIncident | Effect::ConsiderRestart | Effect::Escalate)));
    let fresh = rec("processing", S);
    let fx = plan(Verdict::Healthy, Some(&fresh), &Marks::default(), NOW, &cfg());
    assert!(!for_gang(fx, Some(&fresh), &Marks::default(), NOW, &cfg()).contains(&Effect::Gang));
    let booting = Marks { cooldown: true, ..Marks::default() };
    let fx = plan(Verdict::Booting, Some(&fresh), &booting, NOW, &cfg());
    assert!(for_gang(fx, Some(&fresh), &booting, NOW, &cfg()).contains(&Effect::Gang));
}
