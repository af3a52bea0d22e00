//! Vigil: a node-local agent that restarts hung accelerator workers without ever becoming a
//! restart storm.
//!
//! Map — a folder per feature, each with its pure decisions (`model*`, `policy*`: no I/O, `now`
//! handed in) beside its loop and its adapters:
//! `hang` (a hung worker found and restarted), `maintenance` (notices, checkpoints, the
//! opportunistic offer), `accel` (GPU and TPU health), `node` (the Node as Vigil shows it),
//! `worker_api` (workers writing their own record), `fleet` (the node records and the fleet view).
//! Below them, the shared infrastructure: `coord` (Redis and in-process coordination: the clock,
//! leases, the breaker and the budget), `runtime` (Docker, Podman, the CRI), `kube` (the Node,
//! pods and PodResources APIs), `config`, `alerts`, `trail` (the decision trail), `metrics`,
//! `http` (the read-only server), and at the ground `vocab` (the Node's words the features and
//! `kube` share: Vigil's taints, conditions and Node state, the Node as read, the maintenance
//! state and what forbids restarts). Above the features, `cycle` (the node's cycle that drives
//! them); `cli` holds one file per command; `app` wires `vigil run`.
//! `redact`, a leaf every module may use, keeps the secrets of the config out of every output.
//! Root files: `clock` (the coordinator's time), `backoff` (every retry loop's), `recording` (the
//! demo's recording sinks, feature `demo`), `fuzz` (the parsers' bounded fuzzing, tests only).
//! tests/layout.rs checks the folders and that decision code does no I/O and reads no clock.

// NB: `std::time::Instant` is real time, which neither paused tokio time nor the simulation's
// clock can drive (clippy.toml says what to use instead); a place that needs real time allows it
// with a comment saying why.
#![deny(clippy::disallowed_types)]
// NB: the crate's docs are for the people who work on the agent (`cargo doc
// --document-private-items`, docs/development.md): a module's map links the private items it is
// made of on purpose.
#![allow(rustdoc::private_intra_doc_links)]

/// An error's cause kept whole (its own `source` chain included) whatever its type: the
/// `source` of an error whose cause comes from any of several libraries.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `as_str`: the stable name of each enum named (its strum `IntoStaticStr`), for the config,
/// labels, the trail and logs. A macro rather than a trait, so no caller imports anything.
macro_rules! as_str {
    ($vis:vis $($t:ty),+) => {$(
        impl $t {
            /// Its stable name (strum's `IntoStaticStr`).
            $vis fn as_str(self) -> &'static str { self.into() }
        }
    )+};
}

pub mod accel;
pub mod alerts;
pub(crate) mod app;
pub(crate) mod backoff;
pub mod cli;
pub mod clock;
pub mod config;
pub mod coord;
pub mod cycle;
pub mod fleet;
#[cfg(test)]
mod fuzz;
pub mod hang;
pub mod http;
pub mod kube;
pub mod maintenance;
pub mod metrics;
pub mod node;
#[cfg(feature = "demo")]
pub mod recording;
pub mod redact;
pub mod runtime;
pub mod trail;
pub mod vocab;
pub mod worker_api;
