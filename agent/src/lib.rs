//! Vigil: a node-local agent that restarts hung accelerator workers without ever becoming a
//! restart storm.
//!
//! Map — the data flows one way:
//! `model` (data only) → `policy` (pure decisions, `now` handed in) → `engine` (the loops that run
//! the policy) → adapters: `sources` (metadata server, NVML, the Kubernetes pods and the kubelet's
//! PodResources a CRI node needs), `coord` (Redis and in-process coordination), `runtime` (Docker,
//! Podman, the Kubernetes CRI, simulated), `actions` (alerts, checkpoint requests, the Kubernetes
//! Node) → `observe` (metrics, server, trail, fleet view). `cli` holds one file per command; `app`
//! wires `vigil run`. No arrow runs back up (tests/layout.rs checks each). `redact`, a leaf every
//! layer may use, keeps the secrets of the config out of every output.

// NB: `std::time::Instant` is real time, which neither paused tokio time nor the simulation's
// clock can drive (clippy.toml says what to use instead); a place that needs real time allows it
// with a comment saying why.
#![deny(clippy::disallowed_types)]

/// An error's cause kept whole (its own `source` chain included) whatever its type: the
/// `source` of an error whose cause comes from any of several libraries.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub mod actions;
pub(crate) mod app;
pub(crate) mod backoff;
pub mod cli;
pub mod clock;
pub mod config;
pub mod coord;
pub mod engine;
#[cfg(test)]
mod fuzz;
pub mod model;
pub mod observe;
pub mod policy;
pub mod redact;
pub mod runtime;
pub mod sources;
