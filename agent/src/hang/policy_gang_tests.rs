use super::*;
use crate::hang::model::Incident;

const S: Millis = 1_000;

pub(super) fn timing() -> Timing {
    Timing::of(&Config::default())
}

pub(super) fn rules() -> Rules {
    Rules {
        action: GangAction::RestartAll,
        straggler: StragglerAction::AlertOnly,
        timing: timing(),
    }
}

/// A working member of node `n` whose last beat was at `hb`, seen by its agent at `at`.
fn m(n: &str, verdict: &str, hb: Millis, at: Millis) -> Member {
    Member {
        verdict: verdict.parse().expect("a verdict's name"),
        heartbeat: Some(hb),
        silence: 120 * S,
        started: Some(0),
        breaker_left: Some(3),
        container: format!("{n}-rank"),
        ..Member::working(n, "rank", at)
    }
}

pub(super) fn open(started: Millis) -> GangState {
    GangState { incident: Some(Incident { started, id: "g1".into() }), ..GangState::default() }
}

#[test]
fn a_collective_that_stopped_is_hung_and_names_the_rank_that_stopped_first() {
    let now = 1_000 * S;
    let gang = [
        m("a", "hung", now - 200 * S, now),
        m("b", "suspect", now - 203 * S, now),
        m("c", "hung", now - 199 * S, now),
    ];
    assert_eq!(verdict(&gang, now), GangVerdict::Hung { first: "b/rank".into() });
}

#[test]
fn a_member_stopped_beside_progressing_ones_is_a_straggler() {
    let now = 1_000 * S;
    let gang = [m("a", "hung", now - 200 * S, now), m("b", "healthy", now - S, now)];
    assert_eq!(verdict(&gang, now), GangVerdict::Straggler(vec!["a/rank".into()]));
    let own = &gang[0];
    assert_eq!(
        plan(&verdict(&gang, now), &GangState::default(), &gang, own, now, &rules()),
        vec![GangStep::PageStraggler],
        "alert only by default: a rank restarted alone breaks the rendezvous"
    );
    let alone = Rules { straggler: StragglerAction::Restart, ..rules() };
    assert!(plan(&verdict(&gang, now), &GangState::default(), &gang, own, now, &alone)
        .contains(&GangStep::RestartAlone));
    assert!(plan(&verdict(&gang, now), &GangState::default(), &gang, &gang[1], now, &rules())
        .is_empty());
}

#[test]
fn nobody_confirmed_is_no_gang_verdict() {
    let now = 1_000 * S;
    let gang = [m("a", "suspect", now - 200 * S, now), m("b", "suspect", now - 200 * S, now)];
    assert_eq!(verdict(&gang, now), GangVerdict::Running);
}

#[test]
fn every_reason_a_member_cannot_take_part_blocks_and_missing_members_are_counted() {
    let now = 1_000 * S;
    let t = timing();
    let mut silent = m("a", "hung", now - 300 * S, now - t.silent_after - S);
    silent.worker = "r0".into();
    let mut maint = m("b", "suspect", now - 300 * S, now);
    maint.stand_down = Some("a maintenance notice".into());
    let mut full = m("c", "suspect", now - 300 * S, now);
    full.breaker_left = Some(0);
    let paused = m("d", "paused", now - 300 * S, now);
    let fine = m("e", "suspect", now - 300 * S, now);
    let gang = [silent, maint, full, paused, fine.clone()];
    let why = blockers(&gang, Some(6), now, &t);
    assert_eq!(why.len(), 5, "{why:?}");
    assert!(why[0].contains("1 of 6 members missing"));
    assert!(why[1].contains("a/r0") && why[1].contains("silent"));
    assert!(why[2].contains("maintenance"));
    assert!(why[3].contains("breaker"));
    assert!(why[4].contains("paused"));
    assert!(blockers(&[fine], Some(1), now, &t).is_empty());
    assert!(blockers(&gang[4..], None, now, &t).is_empty(), "no size, nothing guessed missing");
}

#[test]
fn old_entries_are_no_members() {
    let t = timing();
    let now = 10_000 * S;
    let gang = [m("a", "hung", 0, now - t.gone_after - 1), m("b", "hung", 0, now)];
    let p = present(&gang, now, &t);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].node, "b");
}

#[test]
fn the_decision_waits_for_restart_delay_then_every_member_executes_once() {
    let t = timing();
    let now = 10_000 * S;
    let gang = [m("a", "hung", now - 300 * S, now), m("b", "hung", now - 301 * S, now)];
    let v = verdict(&gang, now);
    let early = open(now - t.restart_delay + 1);
    assert_eq!(plan(&v, &early, &gang, &gang[0], now, &rules()), vec![GangStep::PageHung]);
    let due = open(now - t.restart_delay);
    assert_eq!(
        plan(&v, &due, &gang, &gang[0], now, &rules()),
        vec![GangStep::PageHung, GangStep::Decide]
    );
    let mut decided = due.clone();
    decided.decision = Some(Decision { decided: now - S, incident: "g1".into(), only: None });
    assert_eq!(plan(&v, &decided, &gang, &gang[1], now, &rules()), vec![GangStep::Execute]);
    // Restarted (booting), or beaten since the decision: never a second time.
    let mut booting = gang[1].clone();
    booting.verdict = Verdict::Booting;
    assert!(!executable(decided.decision.as_ref().unwrap(), &booting, now, &t));
    let mut beat = gang[1].clone();
    beat.heartbeat = Some(now);
    assert!(!executable(decided.decision.as_ref().unwrap(), &beat, now, &t));
    // A decision older than the cooldown owes nobody a restart any more.
    let stale = Decision { decided: now - t.cooldown, incident: "g1".into(), only: None };
    assert!(!executable(&stale, &gang[1], now, &t));
    assert!(executable(decided.decision.as_ref().unwrap(), &gang[1], now, &t));
    // A decision of another incident is not this one's.
    let mut other = decided.clone();
    other.decision.as_mut().unwrap().incident = "g0".into();
    assert!(other.current_decision().is_none());
}

#[test]
fn alert_only_gangs_page_and_never_decide() {
    let t = timing();
    let now = 10_000 * S;
    let mut gang = vec![m("a", "hung", now - 300 * S, now), m("b", "hung", now - 301 * S, now)];
    let due = open(now - t.restart_delay);
    let v = verdict(&gang, now);
    let off = Rules { action: GangAction::AlertOnly, ..rules() };
    assert_eq!(plan(&v, &due, &gang, &gang[0], now, &off), vec![GangStep::PageHung]);
    gang[1].alert_only = true;
    assert_eq!(plan(&v, &due, &gang, &gang[0], now, &rules()), vec![GangStep::PageHung]);
}

#[test]
fn a_gang_that_hangs_again_after_its_restart_escalates_once_per_restart() {
    let t = timing();
    let now = 10_000 * S;
    let gang = [m("a", "hung", now - 300 * S, now)];
    let v = verdict(&gang, now);
    let mut again = open(now);
    again.restarted = Some(now - t.cooldown);
    assert_eq!(
        plan(&v, &again, &gang, &gang[0], now, &rules()),
        vec![GangStep::PageEscalation { restarted: now - t.cooldown }]
    );
    // Still that incident's kind of page much later.
    let later = now + t.cooldown + t.escalate_after;
    let stale = [m("a", "hung", now - 300 * S, later)];
    assert_eq!(
        plan(&verdict(&stale, later), &again, &stale, &stale[0], later, &rules())[0],
        GangStep::PageEscalation { restarted: now - t.cooldown }
    );
    let mut still = open(now - t.escalate_after - 10 * S);
    let d = now - t.escalate_after;
    still.decision = Some(Decision { decided: d, incident: "g1".into(), only: None });
    assert!(plan(&v, &still, &gang, &gang[0], now, &rules())
        .contains(&GangStep::PageEscalation { restarted: d }));
    // Restarted members boot (no agent calls them hung): still an escalation while none moves.
    let booting = [m("a", "booting", now - 300 * S, now)];
    let running = verdict(&booting, now);
    assert_eq!(running, GangVerdict::Running);
    assert_eq!(
        plan(&running, &still, &booting, &booting[0], now, &rules()),
        vec![GangStep::PageEscalation { restarted: d }]
    );
    let moving = [m("a", "healthy", now - S, now)];
    assert!(plan(&verdict(&moving, now), &still, &moving, &moving[0], now, &rules()).is_empty());
}

#[test]
fn an_incident_ends_when_the_restart_took_or_the_collective_moves() {
    let t = timing();
    let now = 10_000 * S;
    let d = now - 60 * S;
    let mut st = open(now - 400 * S);
    let stuck = [m("a", "hung", now - 500 * S, now)];
    let moving = [m("a", "healthy", now - S, now)];
    assert!(!incident_over(&st, &stuck, now, &t));
    assert!(incident_over(&st, &moving, now, &t), "recovered before a decision");
    // Moved since, unseen, and stopped again (a person restarted the job): that stop is over,
    // and the next one is a new incident with its own clock.
    let moved_and_stopped = [m("a", "hung", now - 300 * S, now)];
    assert!(incident_over(&st, &moved_and_stopped, now, &t));
    st.decision = Some(Decision { decided: d, incident: "g1".into(), only: None });
    let beat = [m("a", "healthy", d + 1, now), m("b", "healthy", d + 2, now)];
    let one_left = [m("a", "healthy", d + 1, now), m("b", "booting", d - 1, now)];
    assert!(incident_over(&st, &beat, now, &t));
    assert!(!incident_over(&st, &one_left, now, &t));
    assert!(incident_over(&st, &one_left, d + t.cooldown, &t), "the cooldown bounds it");
    assert!(!incident_over(&GangState::default(), &beat, now, &t));
}

#[test]
fn shards_spread_a_large_gang_and_keep_a_node_in_one() {
    assert_eq!(shards(None), 1);
    assert_eq!(shards(Some(8)), 1);
    assert_eq!(shards(Some(8_000)), 63);
    assert_eq!(shards(Some(65_536)), MAX_SHARDS);
    assert_eq!(shard_of("gpu-7", 1), 0);
    assert_eq!(shard_of("gpu-7", 63), shard_of("gpu-7", 63), "stable");
    let used: std::collections::HashSet<u32> =
        (0..1_000).map(|i| shard_of(&format!("node-{i}"), 63)).collect();
    assert!(used.len() > 55, "1,000 nodes use most of 63 shards: {}", used.len());
}

#[test]
fn entries_round_trip_in_their_short_form() {
    let e = m("a", "hung", 5, 6);
    let text = serde_json::to_string(&e).unwrap();
    assert!(!text.contains("\"sd\"") && !text.contains("\"ao\""), "{text}");
    assert_eq!(serde_json::from_str::<Member>(&text).unwrap(), e);
    let st = GangState::decode(&[Some("5:g1".into()), Some("9:g1".into()), Some("3".into())]);
    assert_eq!(st.current_decision().map(|d| d.decided), Some(9));
    assert_eq!(st.restarted, Some(3));
    assert_eq!(GangState::decode(&[Some("junk".into())]), GangState::default());
}

#[test]
fn a_member_s_verdict_is_typed_and_a_name_this_build_does_not_know_blocks() {
    let now = 1_000 * S;
    let t = timing();
    let hung = m("a", "hung", now - 300 * S, now);
    let text = serde_json::to_value(&hung).unwrap();
    assert_eq!(text["v"], "hung", "written by its stable name");
    let back: Member = serde_json::from_value(text.clone()).unwrap();
    assert_eq!(back, hung);
    // A newer agent's verdict: neither stopped nor booting, and it blocks the gang's restart.
    let mut newer = text;
    newer["v"] = "degraded-nvlink".into();
    let newer: Member = serde_json::from_value(newer).unwrap();
    assert_eq!(newer.verdict, Verdict::Unreachable);
    assert!(!stopped(&newer));
    let why = blockers(&[newer], Some(1), now, &t);
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].contains("unreachable"), "{why:?}");
    for &v in Verdict::ALL {
        assert_eq!(v.as_str().parse::<Verdict>(), Ok(v));
    }
}

/// A member whose agent has just started (its first reads not in) defers the gang's decision
/// without blocking it: no blocker (no page), and `starting` names who is awaited; an entry
/// written by an older agent (no `sw`) is not starting.
#[test]
fn a_member_whose_agent_just_started_defers_the_decision_without_a_page() {
    let now = 1_000 * S;
    let t = timing();
    let mut fresh = m("gpu-1", "hung", now - 300 * S, now);
    fresh.starting = true;
    let other = m("gpu-0", "hung", now - 300 * S, now);
    let gang = [other.clone(), fresh];
    assert!(blockers(&gang, Some(2), now, &t).is_empty(), "not a blocker");
    let who = starting(&gang).expect("the decision waits");
    assert!(who.contains("gpu-1"), "{who}");
    assert_eq!(starting(&[other]), None);
    let old: Member = serde_json::from_str(
        r#"{"n":"gpu-2","w":"rank","v":"hung","s":"w","hb":1,"ok":120000,"at":1,"c":"x"}"#,
    )
    .expect("an older agent's entry");
    assert!(!old.starting);
}

/// A JobSet's gang: one member's failure restarts every member, so the decision names one —
/// the rank that stopped first among those whose agents say so — and only that member's agent
/// carries it out; the decision reads back from its stored form as it was written.
#[test]
fn a_decision_of_one_member_for_all_is_that_members_alone() {
    let now = 1_000 * S;
    let t = timing();
    let mut gang = [
        m("a", "hung", now - 200 * S, now),
        m("b", "hung", now - 203 * S, now),
        m("c", "hung", now - 201 * S, now),
    ];
    assert_eq!(one_for_all(&gang, now), None, "in place: every member");
    for g in gang.iter_mut() {
        g.one_for_all = Some("jobset:ml/train".into());
    }
    let only = one_for_all(&gang, now).map(Member::id);
    assert_eq!(only.as_deref(), Some("b/rank"), "the first to stop");
    let d = Decision { decided: now - S, incident: "g1".into(), only };
    assert_eq!(Decision::decode(&d.encode()), Some(d.clone()));
    assert_eq!(
        Decision::decode("5:g1"),
        Some(Decision { decided: 5, incident: "g1".into(), only: None }),
        "an older agent's decision: every member"
    );
    let carried: Vec<String> =
        gang.iter().filter(|g| executable(&d, g, now, &t)).map(Member::id).collect();
    assert_eq!(carried, ["b/rank"]);
    // The controller's next attempt on b's node (the same worker, a container started after
    // the decision, its record still the old one's) is never failed on it; nor a container
    // whose start the runtime does not say.
    let next = Member { started: Some(d.decided + 5 * S), ..gang[1].clone() };
    assert!(!executable(&d, &next, now, &t));
    let unknown = Member { started: None, ..gang[1].clone() };
    assert!(!executable(&d, &unknown, now, &t));
}

/// Once a member of a JobSet's next attempt writes its entry, the last attempt's members are
/// no longer the gang's (their pods are the controller's to delete); members that say no
/// attempt (a gang named by a label) are always counted.
#[test]
fn the_members_of_an_older_attempt_leave_the_gang_when_the_next_one_is_seen() {
    let now = 1_000 * S;
    let t = timing();
    let at = |n: &str, attempt: Option<u32>| Member { attempt, ..m(n, "hung", now - 200 * S, now) };
    let old = [at("a", Some(1)), at("b", Some(1)), at("c", None)];
    assert_eq!(present(&old, now, &t).len(), 3);
    let mixed = [at("a", Some(2)), at("b", Some(1)), at("c", None)];
    let ids: Vec<String> = present(&mixed, now, &t).iter().map(Member::id).collect();
    assert_eq!(ids, ["a/rank", "c/rank"]);
    // An entry gone silent does not hold the attempt up.
    let gone = Member { at: now - t.gone_after - 1, ..at("d", Some(3)) };
    let ids: Vec<String> =
        present(&[mixed[0].clone(), gone], now, &t).iter().map(Member::id).collect();
    assert_eq!(ids, ["a/rank"]);
}

/// One decision names one member only when every member names the same whole (one JobSet, one
/// group); members restarted different ways — a label-named gang over two groups, an agent too
/// old to say — block the gang instead.
#[test]
fn members_restarted_different_ways_block_the_gang() {
    let now = 1_000 * S;
    let t = timing();
    let with = |n: &str, whole: Option<&str>| Member {
        one_for_all: whole.map(str::to_string),
        ..m(n, "hung", now - 200 * S, now)
    };
    let same = [with("a", Some("lws:ml/s/0")), with("b", Some("lws:ml/s/0"))];
    assert!(one_for_all(&same, now).is_some());
    assert!(blockers(&same, None, now, &t).is_empty());
    for mixed in [
        [with("a", Some("lws:ml/s/0")), with("b", Some("lws:ml/s/1"))],
        [with("a", Some("lws:ml/s/0")), with("b", None)],
    ] {
        assert_eq!(one_for_all(&mixed, now), None);
        let why = blockers(&mixed, None, now, &t);
        assert!(why.iter().any(|w| w.contains("restarted different ways")), "{why:?}");
    }
    let in_place = [with("a", None), with("b", None)];
    assert!(blockers(&in_place, None, now, &t).is_empty());
}

/// Attempts compare within one JobSet: a JobSet deleted and created again under the same name
/// (attempts from 0 again, another uid) is not hidden behind the old one's higher attempts.
#[test]
fn attempts_compare_within_one_jobset() {
    let now = 1_000 * S;
    let t = timing();
    let at = |n: &str, uid: &str, attempt: u32| Member {
        attempt: Some(attempt),
        jobset_uid: Some(uid.into()),
        ..m(n, "hung", now - 200 * S, now)
    };
    let members = [at("a", "old", 5), at("b", "new", 0), at("c", "new", 1)];
    let ids: Vec<String> = present(&members, now, &t).iter().map(Member::id).collect();
    assert_eq!(ids, ["a/rank", "c/rank"]);
}
