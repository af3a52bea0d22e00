use super::*;

fn cfg() -> PaceConfig {
    PaceConfig { enabled: true, ..PaceConfig::default() }
}

/// A worker beating once a second at `rate` steps per second from `t` for `secs` seconds,
/// starting at `step`; `held` throughout when told.
fn run(p: &mut Pace, t: &mut Millis, step: &mut f64, rate: f64, secs: u32, held: bool) {
    for _ in 0..secs {
        *t += 1_000;
        *step += rate;
        let look = Look { hb: *t, step: *step as u64, held };
        p.observe(Some(look), &cfg());
    }
}

#[test]
fn a_steady_gang_learns_its_pace_and_a_fifth_slower_is_slow_after_slow_for() {
    let (mut p, mut t, mut step) = (Pace::default(), 0, 0.0);
    run(&mut p, &mut t, &mut step, 1.0, 5 * 60, false);
    assert_eq!(p.verdict(t, &cfg()), PaceVerdict::Learning, "ten windows teach");
    run(&mut p, &mut t, &mut step, 1.0, 10 * 60, false);
    assert!(matches!(p.verdict(t, &cfg()), PaceVerdict::Recovered { .. } | PaceVerdict::Steady));
    let base = p.baseline.unwrap();
    assert!((base - 1.0).abs() < 0.05, "{base}");
    // 20 % slower: slow once the run of slow windows lasts `slow_for` (3 min).
    let slowed = t;
    run(&mut p, &mut t, &mut step, 0.8, 2 * 60, false);
    assert_eq!(p.verdict(t, &cfg()), PaceVerdict::Steady, "not yet");
    run(&mut p, &mut t, &mut step, 0.8, 3 * 60, false);
    let PaceVerdict::Slow { since, rate, baseline } = p.verdict(t, &cfg()) else {
        panic!("slow: {:?}", p.verdict(t, &cfg()));
    };
    assert!(since >= slowed && since - slowed <= 60_000, "{since} {slowed}");
    assert!((rate - 0.8).abs() < 0.05 && (baseline - 1.0).abs() < 0.05);
    assert!(t - slowed <= 5 * 60_000, "found within 5 minutes of the slowdown");
    let during = p.baseline;
    run(&mut p, &mut t, &mut step, 0.8, 3 * 60, false);
    assert_eq!(p.baseline, during, "a slow rate teaches nothing");
    // Back at pace: recovered at the first window at or above the recovery line.
    run(&mut p, &mut t, &mut step, 1.0, 61, false);
    assert!(matches!(p.verdict(t, &cfg()), PaceVerdict::Recovered { .. }));
}

#[test]
fn a_slow_run_loses_its_deficit_against_the_baseline_counted_once() {
    let mut p = Pace::default();
    let slow = PaceVerdict::Slow { since: 1_000, rate: 0.7, baseline: 1.0 };
    // Found slow at 301 s: the run's 300 s at 70 % lost 90 s.
    assert_eq!(p.deficit(slow, 301_000), 90_000);
    // Ten seconds later: 3 s more, never the run counted twice.
    assert_eq!(p.deficit(slow, 311_000), 3_000);
    assert_eq!(p.deficit(PaceVerdict::Steady, 321_000), 0);
    // A new run counts from its own start.
    let again = PaceVerdict::Slow { since: 400_000, rate: 0.5, baseline: 1.0 };
    assert_eq!(p.deficit(again, 410_000), 5_000);
}

#[test]
fn held_windows_stops_and_stalls_are_never_slow() {
    let (mut p, mut t, mut step) = (Pace::default(), 0, 0.0);
    run(&mut p, &mut t, &mut step, 2.0, 15 * 60, false);
    // A long evaluation announced (held): half speed for 20 minutes, never slow.
    run(&mut p, &mut t, &mut step, 1.0, 20 * 60, true);
    assert_ne!(p.slow.map(|(since, _)| since), Some(0));
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
fn one_long_slow_window_is_not_a_run() {
    let (mut p, mut t, mut step) = (Pace::default(), 0, 0.0);
    run(&mut p, &mut t, &mut step, 1.0, 15 * 60, false);
    // An unannounced save: no step for 7 minutes, then at pace. One window of 8 minutes at
    // about 12 % of the pace closes, longer than slow_for: still no run.
    run(&mut p, &mut t, &mut step, 0.0, 7 * 60, false);
    run(&mut p, &mut t, &mut step, 1.0, 60, false);
    assert!(!matches!(p.verdict(t, &cfg()), PaceVerdict::Slow { .. }), "{:?}", p);
}

#[test]
fn a_worker_moved_to_another_gang_and_a_held_worker_say_nothing_of_the_pace() {
    let (mut p, mut t, mut step) = (Pace::default(), 0, 0.0);
    p.follow("a");
    run(&mut p, &mut t, &mut step, 1.0, 15 * 60, false);
    assert!(p.baseline.is_some());
    run(&mut p, &mut t, &mut step, 1.0, 5, true);
    assert_eq!(p.rate, None, "held: no rate");
    assert_eq!(p.verdict(t, &cfg()), PaceVerdict::Learning);
    p.follow("a");
    assert!(p.baseline.is_some(), "the same gang");
    p.follow("b");
    assert_eq!(p.baseline, None, "another gang starts over");
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
        step: Some(step),
        container: "c".into(),
        compute,
        slow: slow.iter().map(|s| s.to_string()).collect(),
        ..Member::working(n, "rank", 1_000)
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
    assert!(why[0].contains("computes 420 ms") && why[0].contains("305 ms"), "{why:?}");
    assert!(why[1].contains("hw-slowdown"), "{why:?}");
    // Nothing stands out: no name.
    let even = [member("n0", Some(300), &[], 100), member("n1", Some(310), &[], 100)];
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
    // A member that lags the others (a job that is not lock-step), although it beat last.
    let mut lag = [
        member("n0", None, &[], 900),
        member("n1", None, &[], 1_000),
        member("n2", None, &[], 1_001),
    ];
    lag[0].heartbeat = Some(2_000);
    let (m, why) = suspect(&lag).unwrap();
    assert_eq!(m.node, "n0");
    assert!(why[0].contains("its step 900 lags"), "{why:?}");
    // An entry written earlier is behind only because it is older: no lag.
    lag[0].heartbeat = Some(500);
    assert!(suspect(&lag).is_none());
    // Among many ranks the largest compute time must stand alone, not lead a crowd.
    let crowd: Vec<Member> = (0..8)
        .map(|i| member(&format!("n{i}"), Some(if i < 4 { 300 } else { 370 + i as i64 }), &[], 100))
        .collect();
    assert!(suspect(&crowd).is_none());
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

#[test]
fn an_agent_restarted_in_a_slow_run_goes_on_from_the_kept_pace_instead_of_learning_the_slow_one() {
    let (mut p, mut t, mut step) = (Pace::default(), 0, 0.0);
    assert_eq!(p.kept(&cfg()), None, "nothing learned, nothing kept");
    run(&mut p, &mut t, &mut step, 1.0, 3 * 60, false);
    assert_eq!(p.kept(&cfg()), None, "a baseline still learning is not kept");
    run(&mut p, &mut t, &mut step, 1.0, 12 * 60, false);
    let kept = p.kept(&cfg()).expect("learned");
    assert!((kept.micro as f64 / 1e6 - 1.0).abs() < 0.05, "{kept:?}");
    // The agent restarts in a slow run (0.7 steps/s). Going on from the kept pace: slow once
    // the run lasts slow_for.
    let (mut resumed, mut fresh) = (Pace::default(), Pace::default());
    resumed.resume(Some(kept), &cfg());
    fresh.resume(None, &cfg());
    assert!(resumed.resumed && fresh.resumed, "asked once");
    let (mut t2, mut s2) = (t, step);
    run(&mut resumed, &mut t2, &mut s2, 0.7, 4 * 60, false);
    assert!(
        matches!(resumed.verdict(t2, &cfg()), PaceVerdict::Slow { .. }),
        "{:?}",
        resumed.verdict(t2, &cfg())
    );
    // Learning afresh, the slow pace is taught as the usual one: never slow.
    let (mut t3, mut s3) = (t, step);
    run(&mut fresh, &mut t3, &mut s3, 0.7, 20 * 60, false);
    assert!(!matches!(fresh.verdict(t3, &cfg()), PaceVerdict::Slow { .. }));
    assert!((fresh.baseline.unwrap() - 0.7).abs() < 0.05);
    // Only a learned pace is taken, and only before this agent learned anything itself.
    let young = PaceKept { micro: 1_000_000, windows: cfg().learn_windows - 1 };
    let mut p2 = Pace::default();
    p2.resume(Some(young), &cfg());
    assert_eq!(p2.baseline, None);
    let mut p3 = Pace::default();
    run(&mut p3, &mut t, &mut step, 0.5, 2 * 60, false);
    let before = p3.baseline;
    p3.resume(Some(kept), &cfg());
    assert_eq!(p3.baseline, before, "its own windows stand");
}

/// The entry's compute time is the median of the worker's last five, one per heartbeat: one
/// noisy step neither names a rank nor hides the one the gang waits for.
#[test]
fn the_compute_time_in_the_entry_is_the_median_of_the_last_five() {
    let mut p = Pace::default();
    assert_eq!(p.compute(Some(1_000), Some(300)), Some(300));
    assert_eq!(p.compute(Some(1_000), Some(300)), Some(300), "one per heartbeat");
    for (hb, c) in [(2_000, 310), (3_000, 1_200), (4_000, 290)] {
        p.compute(Some(hb), Some(c));
    }
    assert_eq!(p.compute(Some(5_000), Some(305)), Some(305), "a pause of one step is noise");
    // The throttled rank: most of its steps compute longer, one did not.
    for (hb, c) in [(6_000, 450), (7_000, 470), (8_000, 300), (9_000, 460)] {
        p.compute(Some(hb), Some(c));
    }
    assert_eq!(p.compute(Some(10_000), Some(455)), Some(455));
    assert_eq!(p.compute(None, Some(700)), Some(700), "no heartbeat: as the record says");
    assert_eq!(p.compute(Some(11_000), None), None, "no longer published");
    assert_eq!(p.compute(Some(12_000), Some(300)), Some(300), "started over");
    assert_eq!(p.compute(Some(13_000), Some(900)), Some(300), "of two, the smaller");
}
