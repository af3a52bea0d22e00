//! The words the features and the Kubernetes adapter share, below both: the Node's Vigil-owned
//! state and the names of Vigil's taints and conditions (`node`), and the Node as read — its
//! labels, taints and allocatable resources, and what Vigil makes of them (`node_info`); the
//! node's maintenance state from the GCE metadata values and a checkpoint drill's result
//! (`maintenance`), and what forbids
//! restarts right now — maintenance, a drain, the node going away (`stand_down`): the Node
//! controller writes these facts, the restart path and the checkpoints read them; and a worker's
//! pod as its job controllers define and label it, with how Vigil restarts it their way
//! (`workload`); a failed GPU as a DRA device taint (`device_taint`).
//!
//! Pure data and pure functions: no I/O, no clock. A feature names these instead of another
//! feature's policy, and `crate::kube` names these instead of any feature.

pub mod device_taint;
pub mod maintenance;
pub mod node;
pub mod node_info;
pub mod stand_down;
pub mod workload;
