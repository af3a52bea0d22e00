//! Data only: what the sources observe and what the policy decides about. No I/O, no decisions.

pub mod accel;
pub mod container;
pub mod gpu;
pub mod maintenance;
pub mod node;
pub(crate) mod node_info;
pub mod tpu;
pub(crate) mod worker;
