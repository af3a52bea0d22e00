//! Write adapters: alerts and pages, checkpoint requests, the Kubernetes Node. (Restarts go
//! through `crate::runtime`.)

pub mod alert;
pub mod checkpoint;
pub mod node;
pub mod recording;
