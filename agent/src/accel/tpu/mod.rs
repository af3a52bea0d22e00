//! TPUs as the node's kernel shows them: `model` (chips, device errors), `policy` (which kernel
//! messages and PCIe counters are device errors, and the health they make), `chips` (the files
//! read), `monitor` (the sampling loop), `metrics` (the report as metric series).

pub mod chips;
pub(crate) mod metrics;
pub mod model;
pub mod monitor;
pub mod policy;
