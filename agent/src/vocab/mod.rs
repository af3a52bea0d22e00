//! The words the features and the Kubernetes adapter share, below both: the Node's Vigil-owned
//! state and the names of Vigil's taints and conditions (`node`), and the Node as read — its
//! labels, taints and allocatable resources, and what Vigil makes of them (`node_info`).
//!
//! Pure data and pure functions: no I/O, no clock. A feature names these instead of another
//! feature's policy, and `crate::kube` names these instead of any feature.

pub mod node;
pub mod node_info;
