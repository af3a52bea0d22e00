//! Benchmark (figures, not a test): step-time traces of a training job replayed through the real
//! verdict (`vigil::hang::replay`, simulated time), under the fixed `policy.stale_after` and
//! under the silence learned from the worker's rhythm (`policy.learned`), at several poll
//! intervals. For each: false suspects and false hangs over a simulated day of a healthy job,
//! and how long after its last beat a hung job is confirmed `hung` (many hangs at random times).
//! Then the restarts (`policy.learned.restarts`, issue 46): a month of a real job's trace
//! (`Shape::month`: saves and stalls unannounced, compiles, warm-ups, restarts) replayed with
//! its rhythm written to and read from the coordinator as an agent does — false suspects, hangs
//! and restarts in the healthy month, and how long after its last beat a hang is restarted,
//! under the fixed rule and the learned one.
//!
//! Then a gang (`vigil::hang::replay_gang`): the same month for a collective of 64 ranks, each
//! with its own agent — false `hung` pages and restarts of the healthy gang, and how long after
//! its last beat a collective's hang is restarted, by the fixed rule and on learned evidence.
//!
//! Run: `bash scripts/bench-rhythm.sh [HANGS]` (default 200; `[HANGS] restarts` for the restart
//! tables only, `[HANGS] gangs` for the gang's only).

use std::time::Duration;

use vigil::config::Config;
use vigil::hang::replay::{replay, trace, Shape};
use vigil::hang::replay_gang::{replay_gang, restarted_after};

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

fn config(learned: bool, poll_s: u64) -> Config {
    let mut c = Config::default();
    c.policy.learned.enabled = learned;
    c.poll_interval = Duration::from_secs(poll_s);
    c
}

fn pct(sorted: &[i64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

fn main() {
    let hangs: u64 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(200);
    // `restarts` or `gangs` as a second argument: only those figures.
    let only = std::env::args().nth(2);
    if only.is_none() {
        confirmations(hangs);
    }
    if only.as_deref() != Some("gangs") {
        restarts(hangs);
    }
    gangs((hangs / 4).max(10));
}

/// A collective of `ranks`: a healthy month, then `hangs` hangs at random moments 7 h to 31 h in.
fn gangs(hangs: u64) {
    println!();
    println!("gangs (5 s poll, one agent per rank): a healthy month of the collective, then hangs at random moments 7 h to 31 h in");
    println!(
        "{:<34} {:>5} {:<16} | {:>6} {:>8} | {:>6} {:>8} {:>8} {:>8}",
        "job", "ranks", "rule", "hungs", "restarts", "hangs", "p50 s", "p95 s", "max s"
    );
    let jobs = [
        ("1 s steps, stalls 5-15 s", Shape::month(1_000, true, 10_000)),
        ("10 s steps, stalls 10-30 s", Shape::month(10_000, true, 20_000)),
    ];
    for (name, shape) in jobs {
        let month = trace(&shape, 42, 0, 30 * DAY, None);
        for (rule, learned) in [("fixed", false), ("learned restarts", true)] {
            let mut c = config(learned, 5);
            c.policy.learned.restarts = learned;
            let calm = replay_gang(&month, 64, &c, 5_000, 0, 30 * DAY);
            let mut took: Vec<i64> = (0..hangs)
                .filter_map(|i| {
                    let at = 7 * HOUR + ((i * 7_919_993 + 12_345) as i64 % DAY);
                    let beats = trace(&shape, 3000 + i, 0, at + HOUR / 2, Some(at));
                    let last = beats.last().expect("a beat");
                    if last.state != "processing" {
                        return None;
                    }
                    let out = replay_gang(&beats, 64, &c, 5_000, 0, at + HOUR / 2);
                    Some(restarted_after(&out, last.at).unwrap_or(HOUR))
                })
                .collect();
            took.sort_unstable();
            println!(
                "{:<34} {:>5} {:<16} | {:>6} {:>8} | {:>6} {:>8.1} {:>8.1} {:>8.1}",
                name,
                64,
                rule,
                calm.hung.len(),
                calm.restarts.len(),
                took.len(),
                pct(&took, 0.5),
                pct(&took, 0.95),
                pct(&took, 1.0),
            );
        }
    }
}

/// Time from the last beat to the restart for `hangs` hangs of `shape`, each at a random moment
/// between 7 h and 3 days into the job (its history spans `learned.history`, 6 h), under `c`.
fn hang_to_restart(shape: &Shape, c: &Config, poll: i64, hangs: u64) -> Vec<i64> {
    // NB: hangs in training only (the last beat in `processing`): one in an announced phase
    // waits for its grace or the fixed rule whatever the rule, as the first table shows.
    let mut took: Vec<i64> = (0..hangs)
        .filter_map(|i| {
            let at = 7 * HOUR + ((i * 7_919_993 + 12_345) as i64 % (2 * DAY));
            let beats = trace(shape, 2000 + i, 0, at + HOUR, Some(at));
            let last = beats.last().expect("a beat");
            if last.state != "processing" {
                return None;
            }
            let out = replay(&beats, c, poll, 0, at + HOUR);
            Some(out.restarts.iter().find(|&&r| r > last.at).map_or(HOUR, |r| r - last.at))
        })
        .collect();
    took.sort_unstable();
    took
}

fn restarts(hangs: u64) {
    println!();
    println!("restarts (5 s poll): a healthy month of each job, then hangs at random moments 7 h to 3 days in (in training, the last beat in `processing`)");
    println!("each job: an evaluation of 90 s every 25 min, an announced 45 s checkpoint every 50 min, an unannounced 20 s save every 2 h, a data-loader stall every 3 h, a 60 s compile and a slower warm-up at each start, a restart every 3 days");
    println!(
        "{:<34} {:<16} | {:>8} {:>6} {:>8} | {:>6} {:>8} {:>8} {:>8}",
        "job", "rule", "suspects", "hungs", "restarts", "hangs", "p50 s", "p95 s", "max s"
    );
    let jobs = [
        ("1 s steps, stalls 5-15 s", Shape::month(1_000, true, 10_000)),
        ("1 s steps, stalls 10-30 s", Shape::month(1_000, true, 20_000)),
        ("1 s steps, stalls 20-60 s", Shape::month(1_000, true, 40_000)),
        ("1 s steps, evaluations silent", Shape::month(1_000, false, 10_000)),
        ("10 s steps, stalls 10-30 s", Shape::month(10_000, true, 20_000)),
    ];
    for (name, shape) in jobs {
        let month = trace(&shape, 42, 0, 30 * DAY, None);
        for (rule, learned, restarts) in [
            ("fixed", false, false),
            ("learned, alerts", true, false),
            ("learned restarts", true, true),
        ] {
            let mut c = config(learned, 5);
            c.policy.learned.restarts = restarts;
            let calm = replay(&month, &c, 5_000, 0, 30 * DAY);
            let took = hang_to_restart(&shape, &c, 5_000, hangs);
            println!(
                "{:<34} {:<16} | {:>8} {:>6} {:>8} | {:>6} {:>8.1} {:>8.1} {:>8.1}",
                name,
                rule,
                calm.suspects.len(),
                calm.hungs.len(),
                calm.restarts.len(),
                took.len(),
                pct(&took, 0.5),
                pct(&took, 0.95),
                pct(&took, 1.0),
            );
        }
    }
}

/// How soon a hang is confirmed `hung`, and false suspects in a healthy day.
fn confirmations(hangs: u64) {
    println!("1 s steps (10 % jitter, 1 in 500 stalls 2-5 s), a 90 s evaluation every 1,000 steps, an announced 45 s checkpoint every 3,000");
    println!("time from the last beat to `hung`, for hangs in training (the last beat in `processing`) and in an announced phase (an evaluation, a checkpoint)");
    println!(
        "{:<10} {:<8} {:<5} {:>12} {:>9} | {:>6} {:>8} {:>8} {:>8} | {:>6} {:>8} {:>8}",
        "evaluation",
        "silence",
        "poll",
        "suspects/day",
        "hungs/day",
        "n",
        "p50 s",
        "p95 s",
        "max s",
        "n",
        "p50 s",
        "max s"
    );
    for announced in [true, false] {
        let shape = Shape::one_second_steps(announced);
        let day = trace(&shape, 42, 0, DAY, None);
        for poll_s in [15u64, 5, 2] {
            for learned in [false, true] {
                let c = config(learned, poll_s);
                let poll = poll_s as i64 * 1000;
                let calm = replay(&day, &c, poll, 0, DAY);
                let (mut training, mut phase) = (Vec::new(), Vec::new());
                for i in 0..hangs {
                    // A hang at a random moment of the day, after an hour of learning.
                    let at = HOUR + ((i * 7_919_993 + 12_345) as i64 % (DAY - 2 * HOUR));
                    let beats = trace(&shape, 1000 + i, 0, at + HOUR, Some(at));
                    let last = beats.last().expect("a beat");
                    let out = replay(&beats, &c, poll, 0, at + HOUR);
                    let took =
                        out.hungs.iter().find(|&&h| h > last.at).map_or(HOUR, |h| h - last.at);
                    if last.state == "processing" {
                        training.push(took);
                    } else {
                        phase.push(took);
                    }
                }
                training.sort_unstable();
                phase.sort_unstable();
                let phase = if phase.is_empty() { vec![0] } else { phase };
                println!(
                    "{:<10} {:<8} {:<5} {:>12} {:>9} | {:>6} {:>8.1} {:>8.1} {:>8.1} | {:>6} {:>8.1} {:>8.1}",
                    if announced { "announced" } else { "silent" },
                    if learned { "learned" } else { "fixed" },
                    format!("{poll_s}s"),
                    calm.suspects.len(),
                    calm.hungs.len(),
                    training.len(),
                    pct(&training, 0.5),
                    pct(&training, 0.95),
                    pct(&training, 1.0),
                    phase.len(),
                    pct(&phase, 0.5),
                    pct(&phase, 1.0),
                );
            }
        }
    }
}
