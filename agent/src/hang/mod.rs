//! The hang and restart path: a worker that stopped making progress, found and restarted without
//! ever becoming a restart storm.
//!
//! Decisions (pure, `now` handed in): `model` (what a worker says about itself and what Vigil
//! remembers about it), `policy` (the verdict and the plan), `policy_record` (what a record says:
//! stale or not, its allowed silence), `policy_due` (when a restart is due, a failed one's
//! backoff), `policy_pipeline` (the restart
//! pipeline's steps and what follows each: one state machine), `policy_rhythm` (each worker's
//! learned silence), `policy_pace` (a gang member's pace: fail-slow), `policy_lost` (the time an incident lost), `policy_table` (the verdict →
//! action table `vigil policy` prints), `model_rhythm` (a worker's learned silences as the coordinator keeps them), `model_gang` and `policy_gang` (a distributed job's
//! collective: its fleet view, its verdict, one decision for every rank, and its
//! learned evidence). The node's cycle
//! (`crate::cycle::agent`) takes the workers from the `roster` and hands each to `restart`
//! (`RestartPath`: incident, command, limits, outcome) with the shared `context`; `stand_down`
//! watches what forbids restarts right now, `outage` tracks the coordinator's and the runtime's
//! outages, `journal` writes the decision trail as the cycle does (once per incident); `marks`
//! is the hang path's Redis schema (the codec of a worker's marks and their one-round-trip
//! read), `gang_marks` a gang's (its view's shards and its state keys, read); `replay` runs step-time traces through the verdict (the learned-silence benchmark).

pub(crate) mod context;
pub(crate) mod gang_marks;
pub(crate) mod journal;
pub(crate) mod marks;
pub(crate) mod model;
pub(crate) mod model_gang;
pub(crate) mod model_rhythm;
pub(crate) mod model_slow;
pub(crate) mod outage;
pub mod policy;
pub(crate) mod policy_due;
pub(crate) mod policy_fruitless;
pub mod policy_gang;
pub(crate) mod policy_life;
pub(crate) mod policy_lost;
pub(crate) mod policy_membership;
pub(crate) mod policy_pace;
pub(crate) mod policy_pipeline;
pub(crate) mod policy_record;
pub(crate) mod policy_rhythm;
pub(crate) mod policy_table;
pub(crate) mod pressure;
// The benchmarks' replays: never in the agent that ships (agent/Cargo.toml, feature `bench`).
#[cfg(any(test, feature = "bench"))]
pub mod replay;
#[cfg(any(test, feature = "bench"))]
pub mod replay_gang;
#[cfg(any(test, feature = "bench"))]
pub mod replay_pace;
pub mod restart;
pub(crate) mod roster;
pub(crate) mod stand_down;
