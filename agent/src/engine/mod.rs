//! The loops that run the policy against the adapters: the agent cycle and its restart path, the
//! node controller (maintenance, GPU publishing, checkpoints, opportunistic maintenance), the GPU
//! monitor and the heartbeat.
//!
//! Map: `agent` (the cycle over the node's workers) takes them from the `roster` (grouped by
//! worker id; invalid and ambiguous ids alerted once) and hands each to `restart`
//! (`RestartPath`: incident, command, limits, outcome) with the shared `context`, the `journal`
//! (the trail), the `alert_gate` (alert de-duplication) and the `stand_down` watch (shutdown,
//! maintenance, GPU); it ends the cycle with the `heartbeat` (the node's record and the cycle's
//! one batch), tracks its dependencies' `outage`s, and applies a SIGHUP `reload`. `node` is the
//! maintenance controller, `checkpoint` its rounds, `opportunistic` the pool's maintenance
//! claim, `gpu` the NVML monitor (`gpu_start` waits for the driver, `gpu_state` keeps failed GPUs
//! across restarts), `tpu` the TPU monitor, `accel` the one path that shows either's health on
//! the Node, `publisher` the Node object. The arrows run one way:
//! `agent` → `restart` → the others.

pub(crate) mod accel;
pub mod agent;
pub(crate) mod alert_gate;
pub(crate) mod checkpoint;
pub(crate) mod context;
pub mod gpu;
pub mod gpu_start;
pub mod gpu_state;
pub(crate) mod heartbeat;
pub(crate) mod journal;
pub mod node;
pub mod node_info;
pub(crate) mod opportunistic;
pub(crate) mod outage;
pub(crate) mod publisher;
pub(crate) mod reload;
pub mod restart;
pub(crate) mod roster;
pub(crate) mod stand_down;
pub mod tpu;
