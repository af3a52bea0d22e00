use super::*;
use crate::hang::model::Verdict;
use crate::hang::model_gang::Activity;

fn cfg() -> PaceConfig {
    PaceConfig {
        enabled: true,
        ..PaceConfig::default()
    }
}

/// A worker beating once a second at `rate` steps per second from `t` for `secs` seconds,
/// starting at `step`; `held` throughout when told.
fn run(p: &mut Pace, t: &mut Millis, step: &mut f64, rate: f64, secs: u32, held: bool) {
    for _ in 0..secs {
        *t += 1_000;
        *step += rate;
        let look = Look {
            hb: *t,
            step: *step as u64,
            held,
        };
        p.observe(Some(look), &cfg());
    }
}

#[test]
fn a_steady_gang_learns_its_pace_and_a_fifth_slower_is_slow_after_slow_for() {
    let (mut p, mut t, mut step) = (Pace::default(), 0, 0.0);
    run(&mut p, &mut t, &mut step, 1.0, 5 * 60, false);
    assert_eq!(
        p.verdict(t, &cfg()),
        PaceVerdict::Learning,
        "ten windows teach"
    );
    run(&mut p, &mut t, &mut step, 1.0, 10 * 60, false);
    assert!(matches!(
        p.verdict(t, &cfg()),
        PaceVerdict::Recovered { .. } | PaceVerdict::Steady
    ));
    let base = p.baseline.unwrap();
    assert!((base - 1.0).abs() < 0.05, "{base}");
    // 20 % slower: slow once the run of slow windows lasts `slow_for` (5 min).
    let slowed = t;
    run(&mut p, &mut t, &mut step, 0.8, 4 * 60, false);
    assert_eq!(p.verdict(t, &cfg()), PaceVerdict::Steady, "not yet");
    run(&mut p, &mut t, &mut step, 0.8, 3 * 60, false);
    let PaceVerdict::Slow {
        since,
        rate,
        baseline,
    } = p.verdict(t, &cfg())
    else {
        panic!("slow: {:?}", p.verdict(t, &cfg()));
    };
    assert!(
        since >= slowed && since - slowed <= 60_000,
        "{since} {slowed}"
    );
    assert!((rate - 0.8).abs() < 0.05 && (baseline - 1.0).abs() < 0.05);
    assert!(
        t - slowed <= 7 * 60_000,
        "found within 7 minutes of the slowdown"
    );
    let during = p.baseline;
    run(&mut p, &mut t, &mut step, 0.8, 3 * 60, false);
    assert_eq!(p.baseline, during, "a slow rate teaches nothing");
    // Back at pace: recovered at the first window at or above the recovery line.
    run(&mut p, &mut t, &mut step, 1.0, 61, false);
    assert!(matches!(
        p.verdict(t, &cfg()),
        PaceVerdict::Recovered { .. }
    ));
}

#[test]
fn held_windows_stops_and_stalls_are_never_slow() {
    let (mut p, mut t, mut step) = (Pace::default(), 0, 0.0);
    run(&mut p, &mut t, &mut step, 2.0, 15 * 60, false);
    // A long evaluation announced (held): half speed for 20 minutes, never slow.
    run(&mut p, &mut t, &mut step, 1.0, 20 * 60, true);
    assert_ne!(p.slow_since, Some(0));
    assert!(!matches!(p.verdict(t, &cfg()), PaceVerdict::Slow { .. }));
    // A data-loader stall of 30 s in every other minute: a slow window now and then, no run.
    for _ in 0..10 {
        run(&mut p, &mut t, &mut step, 2.0, 30, false);
        run(&mut p, &mut t, &mut step, 0.0, 30, false);
        run(&mut p, &mut t, &mut step, 2.0, 60, false);
        assert!(!matches!(p.verdict(t, &cfg()), PaceVerdict::Slow { .. }));
    }
    // Stopped outright: the hang path's, not slow.
    run(&mut p, &mut t, &mut step, 0.0, 20 * 60, false);
    assert!(!matches!(p.verdict(t, &cfg()), PaceVerdict::Slow { .. }));
    // A restart (the step goes back) starts the measure over.
    step = 0.0;
    run(&mut p, &mut t, &mut step, 0.5, 10 * 60, false);
    assert!(
        matches!(p.verdict(t, &cfg()), PaceVerdict::Slow { .. }),
        "the same job, at a quarter of its pace"
    );
}

#[test]
fn a_slow_job_of_ten_second_steps_waits_for_enough_steps() {
    let (mut p, mut t, mut step) = (Pace::default(), 0, 0.0);
    run(&mut p, &mut t, &mut step, 0.1, 4 * 3600, false);
    let base = p.baseline.unwrap();
    assert!((base - 0.1).abs() < 0.01, "{base}");
    run(&mut p, &mut t, &mut step, 0.07, 3 * 3600, false);
    assert!(matches!(p.verdict(t, &cfg()), PaceVerdict::Slow { .. }));
}

fn member(n: &str, compute: Option<Millis>, slow: &[&str], step: u64) -> Member {
    Member {
        node: n.into(),
        worker: "rank".into(),
        verdict: Verdict::Healthy,
        activity: Activity::Working,
        heartbeat: Some(1_000),
        step: Some(step),
        silence: 120_000,
        started: None,
        at: 1_000,
        stand_down: None,
        starting: false,
        breaker_left: None,
        container: "c".into(),
        signals: Vec::new(),
        alert_only: false,
        attempt: None,
        jobset_uid: None,
        one_for_all: None,
        dry_run: false,
        preemption_budget: None,
        maintenance_budget: None,
        compute,
        slow: slow.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn the_member_named_is_the_one_its_evidence_points_to_or_none() {
    let gang = [
        member("n0", Some(300), &[], 100),
        member("n1", Some(310), &[], 100),
        member("n2", Some(420), &["GPU 0 (GPU-c) hw-slowdown"], 100),
        member("n3", Some(305), &[], 100),
    ];
    let (m, why) = suspect(&gang).unwrap();
    assert_eq!(m.node, "n2");
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(
        why[0].contains("computes 420 ms") && why[0].contains("305 ms"),
        "{why:?}"
    );
    assert!(why[1].contains("hw-slowdown"), "{why:?}");
    // Nothing stands out: no name.
    let even = [
        member("n0", Some(300), &[], 100),
        member("n1", Some(310), &[], 100),
    ];
    assert!(suspect(&even).is_none());
    let silent = [member("n0", None, &[], 100), member("n1", None, &[], 100)];
    assert!(suspect(&silent).is_none());
    // A signal every node shows points to nobody; one only one shows does.
    let all = [
        member("n0", None, &["GPU 0 sw-thermal"], 100),
        member("n1", None, &["GPU 0 sw-thermal"], 100),
    ];
    assert!(suspect(&all).is_none());
    let one = [
        member("n0", None, &[], 100),
        member("n1", None, &[], 100),
        member("n2", None, &["GPU 3 hw-power-brake"], 100),
    ];
    assert_eq!(suspect(&one).unwrap().0.node, "n2");
    // A member that lags the others (a job that is not lock-step).
    let lag = [
        member("n0", None, &[], 900),
        member("n1", None, &[], 1_000),
        member("n2", None, &[], 1_001),
    ];
    let (m, why) = suspect(&lag).unwrap();
    assert_eq!(m.node, "n0");
    assert!(why[0].contains("its step 900 lags"), "{why:?}");
    // Two equal scores: no name.
    let tie = [
        member("n0", None, &["GPU 0 hw-slowdown"], 100),
        member("n1", None, &["GPU 1 hw-slowdown"], 100),
        member("n2", None, &[], 100),
        member("n3", None, &[], 100),
        member("n4", None, &[], 100),
    ];
    assert!(suspect(&tie).is_none());
}
