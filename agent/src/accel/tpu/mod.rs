//! TPUs as the node's kernel shows them: `model` (chips, device errors), `policy` (which kernel
//! messages and PCIe counters are device errors, and the health they make), `chips` (the files
//! read), `monitor` (the sampling loop), `tracked` (how the tracker publishes the report).

pub mod chips;
pub mod model;
pub mod monitor;
pub mod policy;
pub(crate) mod tracked;
