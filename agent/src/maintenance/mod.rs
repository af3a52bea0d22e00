//! Maintenance and checkpoints: the GCE metadata server's host-maintenance and preemption
//! notices, turned into a stand-down of restarts, checkpoint requests to the workers and the
//! Node's maintenance state.
//!
//! Decisions (pure): `policy` (the phase from the raw metadata values, whose data is
//! `crate::vocab::maintenance`, and the Node's desired fields; the stand-down it implies is
//! `crate::vocab::stand_down`), `policy_budget` (whether the
//! checkpoint budgets fit what the platform gives), `policy_idle` (whether a node is idle enough
//! to offer). The loops and adapters: `metadata` (the long-poll watcher), `checkpoint` (a
//! checkpoint round), `request` (asking one worker, by its method), `opportunistic` (offering
//! an idle node for maintenance, one node of a pool at a time).

pub(crate) mod checkpoint;
pub(crate) mod drill;
pub(crate) mod gang_round;
pub mod metadata;
pub(crate) mod model_round;
pub(crate) mod opportunistic;
pub mod policy;
pub(crate) mod policy_budget;
pub(crate) mod policy_idle;
pub(crate) mod policy_round;
pub mod request;
