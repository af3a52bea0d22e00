//! Vigil: a node-local agent that restarts hung accelerator workers without ever becoming a
//! restart storm.
//!
//! Map: `config` → `policy` (pure verdicts and plans) → `pipeline` (safeguards, carried out
//! against `coord`, `runtime`, `actions`) → `agent` (the loop) → `server` (metrics, health,
//! local status API). `cli` wires it together for the `vigil` binary.

pub mod actions;
pub mod agent;
pub mod cli;
pub mod clock;
pub mod config;
pub mod coord;
pub mod demo;
pub mod doctor;
pub mod fleet;
pub mod maintenance;
pub mod metrics;
pub mod pipeline;
pub mod policy;
pub mod runtime;
pub mod server;
pub mod sim;
pub mod sources;
pub mod trail;
