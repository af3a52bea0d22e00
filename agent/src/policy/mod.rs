//! The decision core: pure functions of (observations, now) to verdicts, plans and desired
//! state. No I/O and no clock reads: the caller hands in `now` (the coordinator's clock).

pub mod accel;
pub(crate) mod budget;
pub(crate) mod caller;
pub mod gpu;
pub(crate) mod gpu_state;
pub(crate) mod idle;
pub mod maintenance;
pub(crate) mod node_info;
pub mod restart;
pub(crate) mod table;
pub mod tpu;
pub mod xid;

pub use table::{table, Action, TableRow};
