//! The decision core: pure functions of (observations, now) to verdicts, plans and desired
//! state. No I/O and no clock reads: the caller hands in `now` (the coordinator's clock).

pub mod caller;
pub mod caps;
pub mod gpu;
pub mod maintenance;
pub mod node_info;
pub mod restart;
pub mod table;

pub use table::{table, Action, TableRow};
