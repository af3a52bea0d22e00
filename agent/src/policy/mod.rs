//! The decision core: pure functions of (observations, now) to verdicts, plans and desired
//! state. No I/O and no clock reads: the caller hands in `now` (the coordinator's clock).

pub mod accel;
pub mod budget;
pub mod caller;
pub mod gpu;
pub mod gpu_state;
pub mod idle;
pub mod maintenance;
pub mod node_info;
pub mod restart;
pub mod table;
pub mod tpu;
pub mod xid;

pub use table::{table, Action, TableRow};
