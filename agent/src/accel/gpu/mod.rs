//! GPUs through NVML: `model` (samples, XID events, per-GPU status), `policy` (the health rules),
//! `policy_node` (the report as the Node shows it: the `GPU` row, its condition), `policy_xid`
//! (what each XID calls for), `policy_episode` (a run of one XID is one episode), `policy_slow` (what slows a job on a
//! GPU: fail-slow's evidence), `policy_state`
//! (failed GPUs kept across agent restarts, the pure part), `policy_kubelet` (a GPU the
//! kubelet reports `Unhealthy` is failed); `kubelet` (reads that from the node's pods); `nvml` (the NVML adapter: a GPU's fields, each `None` where it cannot be read, and its speed readings), `monitor` (the monitor thread),
//! `start` (waiting for a driver that arrives late), `state` (the state file on disk), `tracked`
//! (how the tracker publishes the report: alert, trail code, metric series).

pub mod kubelet;
pub mod model;
pub mod monitor;
pub mod nvml;
pub mod policy;
pub(crate) mod policy_episode;
pub mod policy_kubelet;
pub mod policy_node;
pub mod policy_slow;
pub(crate) mod policy_state;
pub mod policy_xid;
pub mod start;
pub mod state;
pub(crate) mod tracked;
