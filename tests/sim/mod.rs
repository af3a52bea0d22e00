//! The seeded simulation of a fleet (docs/safety.md, "The simulation"): the real agent code —
//! `Agent::cycle` and the whole restart path — driven over the in-process coordinator, the
//! simulated runtime and a fake clock, with a seeded scheduler that interleaves the instances at
//! every coordinator and runtime call and injects faults; the invariants are checked against the
//! harness's own ground truth at every restart command, and liveness at the end of each run.

pub mod gang;
pub mod gang_mutant;
pub mod gang_restart;
pub mod gang_slow;
pub mod gang_truth;
pub mod gate;
pub mod learned;
pub mod mutant;
pub mod rng;
pub mod truth;
pub mod world;

use mutant::Mutant;

pub use truth::{Stats, Violation};

/// [`vigil::coord::Request::HgetallMany`] as one `Hgetall` per key, for a coordinator decorator
/// that wants to see the parts (the gates of `gate.rs` and `gang_mutant.rs`).
pub async fn hgetall_many_by_parts(
    coord: &dyn vigil::coord::Coordinator,
    keys: &[String],
) -> Result<Vec<std::collections::HashMap<String, String>>, vigil::coord::CoordError> {
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        out.push(coord.hgetall(k).await?);
    }
    Ok(out)
}

/// How one seed runs.
#[derive(Clone)]
pub struct Options {
    /// Steps of the fault phase (the calm phase that follows is measured in simulated time).
    pub fault_steps: u64,
    /// A known-bad variant of the restart path, told to every instance by its adapters.
    pub mutant: Option<Mutant>,
    /// Keep the trace's tail (for the failure report).
    pub trace: bool,
    /// Keep the whole trace (a replay), not only its tail.
    pub full_trace: bool,
    /// The world restarts on learned rhythms (`learned.rs`; `VIGIL_SIM_LEARNED=1`): a seed's
    /// history otherwise the same draws.
    pub learned: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { fault_steps: 800, mutant: None, trace: true, full_trace: false, learned: false }
    }
}

/// A seed that broke an invariant: what broke, and the trace that led there.
pub struct Failure {
    pub seed: u64,
    pub violation: Violation,
    /// The last few hundred steps.
    pub trace: Vec<String>,
    /// Every step, when replaying.
    pub full_trace: Option<Vec<String>>,
    /// Its world restarted on learned rhythms.
    pub learned: bool,
}

impl Failure {
    /// The report printed when a seed fails: the invariant, the tail of the trace and the one
    /// command that replays it.
    pub fn report(&self, mutant: Option<Mutant>) -> String {
        let v = &self.violation;
        let mut mutant_env = mutant.map_or(String::new(), |m| format!("VIGIL_SIM_MUTANT={m:?} "));
        if self.learned {
            mutant_env.push_str("VIGIL_SIM_LEARNED=1 ");
        }
        format!(
            "seed {} broke \"{}\" at step {} (UTC day {}): {}\n--- last steps ---\n{}\n--- replay this seed with its whole trace ---\n  {mutant_env}VIGIL_SIM_SEED={} bash scripts/simulate.sh\n",
            self.seed,
            v.invariant,
            v.step,
            vigil::clock::utc_day(v.at),
            v.detail,
            self.trace.join("\n"),
            self.seed
        )
    }
}

/// Run one seed.
pub fn run_seed(seed: u64, opts: &Options) -> Result<Stats, Failure> {
    world::World::new(seed, opts).run(seed)
}

/// Run `count` seeds from `first` on every core, without traces; the totals, or the first
/// failure (lowest seed), run once more with its trace for the report.
pub fn run_seeds(first: u64, count: u64, opts: &Options) -> Result<Stats, Box<Failure>> {
    let bulk = Options { trace: false, ..opts.clone() };
    match run_seeds_with(first, count, &bulk) {
        Ok(s) => Ok(s),
        Err(f) => match run_seed(f.seed, opts) {
            Err(traced) => Err(Box::new(traced)),
            Ok(_) => panic!(
                "seed {} failed without its trace and passed with it: the run is not deterministic",
                f.seed
            ),
        },
    }
}

fn run_seeds_with(first: u64, count: u64, opts: &Options) -> Result<Stats, Box<Failure>> {
    spread(first, count, |seed| run_seed(seed, opts), Stats::add).map_err(|(_, f)| Box::new(f))
}

/// Seeds `first..first + count` on every core: the totals, or the failure of the lowest failing
/// seed. A thread stops at the first failure any thread has found, but the seeds below it still
/// run, so the seed reported is the lowest of the range whatever the interleaving (a mutant's
/// catch is reported the same way on every machine, and costs only the seeds up to it).
pub fn spread<S: Default + Send, E: Send>(
    first: u64,
    count: u64,
    run: impl Fn(u64) -> Result<S, E> + Sync,
    add: impl Fn(&mut S, &S) + Sync,
) -> Result<S, (u64, E)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(count.max(1) as usize) as u64;
    let lowest = AtomicU64::new(u64::MAX);
    let results: Vec<Result<S, (u64, E)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (lowest, run, add) = (&lowest, &run, &add);
                s.spawn(move || {
                    let mut total = S::default();
                    let mut seed = first + t;
                    while seed < first + count && seed < lowest.load(Ordering::SeqCst) {
                        match run(seed) {
                            Ok(st) => add(&mut total, &st),
                            Err(e) => {
                                lowest.fetch_min(seed, Ordering::SeqCst);
                                return Err((seed, e));
                            }
                        }
                        seed += threads;
                    }
                    Ok(total)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a simulation thread panicked")).collect()
    });
    let mut total = S::default();
    let mut failure: Option<(u64, E)> = None;
    for r in results {
        match r {
            Ok(st) => add(&mut total, &st),
            Err((seed, e)) if failure.as_ref().is_none_or(|(f, _)| seed < *f) => {
                failure = Some((seed, e))
            }
            Err(_) => {}
        }
    }
    failure.map_or(Ok(total), Err)
}
