//! Benchmark (figures, not a test): a gang's step traces replayed through the real pace verdict
//! and suspect rule (`vigil::hang::replay_pace`, simulated time), at `gang.pace`'s defaults and a
//! 5 s poll: how long after a 20 % slowdown (one rank's GPU clocked down) the gang is found slow
//! (p50, p95, the most), how often the slowed rank is named — with every rank publishing its
//! compute time, with only the GPU signal on its node, with neither — and how many slow episodes
//! a healthy job draws over simulated days (silent and announced evaluations, announced
//! checkpoints, data-loader stalls, a compile at the start).
//!
//! Run: `bash scripts/bench-pace.sh [RUNS]` (default 200).

use vigil::config::PaceConfig;
use vigil::hang::replay_pace::{replay_gang, GangShape, Slowdown};

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

fn pct(sorted: &[i64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

fn main() {
    let runs: u64 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(200);
    // NB: `SLOW_FOR=<seconds>` and `WINDOW=<seconds>` try other `gang.pace.slow_for` and
    // `gang.pace.window` (the defaults are what the figures in the README are for).
    let mut cfg = PaceConfig { enabled: true, ..PaceConfig::default() };
    if let Some(s) = std::env::var("SLOW_FOR").ok().and_then(|s| s.parse().ok()) {
        cfg.slow_for = std::time::Duration::from_secs(s);
    }
    if let Some(s) = std::env::var("WINDOW").ok().and_then(|s| s.parse().ok()) {
        cfg.window = std::time::Duration::from_secs(s);
    }
    let poll = 5_000;
    println!(
        "gang.pace: window {:?}, min_steps {}, learn_windows {}, slow_fraction {}, slow_for {:?}; 5 s poll",
        cfg.window, cfg.min_steps, cfg.learn_windows, cfg.slow_fraction, cfg.slow_for
    );
    println!("8 ranks, 1 s steps (10 % jitter, 1 in 500 stalls 2-5 steps), a 90 s evaluation every 1,000 steps, an announced 45 s checkpoint every 3,000, a 3 min compile");
    println!();
    println!(
        "{:<28} {:>5} {:>7} {:>9} {:>9} {:>9} {:>8} {:>9}",
        "slowdown of one rank", "runs", "found", "p50 s", "p95 s", "max s", "named", "wrong"
    );
    for (what, factor, compute, signal) in [
        ("20 %, compute published", 0.8, true, false),
        ("20 %, GPU signal only", 0.8, false, true),
        ("20 %, no evidence", 0.8, false, false),
        ("30 %, compute published", 0.7, true, false),
        ("10 %, compute published", 0.9, true, false),
    ] {
        let (mut found, mut named, mut wrong) = (Vec::new(), 0, 0);
        for seed in 0..runs {
            let shape = GangShape::one_second_steps(8, seed % 2 == 0);
            // NB: somewhere in the job's third hour, on any rank.
            let at = 2 * HOUR + (seed as i64 * 7_919) % HOUR;
            let rank = (seed % 8) as usize;
            let slow = Slowdown { at, factor, rank, compute_published: compute, signal };
            let out = replay_gang(&shape, Some(slow), seed + 1, at + HOUR, poll, &cfg);
            if let Some(first) = out.episodes.iter().find(|&&e| e > at) {
                found.push(first - at);
                match out.named {
                    Some(r) if r == rank => named += 1,
                    Some(_) => wrong += 1,
                    None => {}
                }
            }
        }
        found.sort_unstable();
        let n = found.len();
        let (p50, p95, max) = match n {
            0 => (f64::NAN, f64::NAN, f64::NAN),
            _ => (pct(&found, 0.5), pct(&found, 0.95), pct(&found, 1.0)),
        };
        println!(
            "{what:<28} {runs:>5} {n:>7} {p50:>9.0} {p95:>9.0} {max:>9.0} {:>7.1}% {wrong:>9}",
            100.0 * named as f64 / n.max(1) as f64
        );
    }
    println!();
    println!("{:<36} {:>5} {:>10}", "a healthy job, simulated days", "days", "episodes");
    for announced in [true, false] {
        let days = runs.min(50);
        let mut episodes = 0;
        for seed in 0..days {
            let shape = GangShape::one_second_steps(8, announced);
            episodes += replay_gang(&shape, None, 1_000 + seed, DAY, poll, &cfg).episodes.len();
        }
        let what = if announced { "evaluations announced" } else { "evaluations silent" };
        println!("{what:<36} {days:>5} {episodes:>10}");
    }
}
