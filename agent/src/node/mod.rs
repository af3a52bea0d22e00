//! The Kubernetes Node as Vigil shows it and reads it.
//!
//! Decisions (pure): `policy_info` (what GKE's labels, taints and allocatable resources say about
//! the machine, in the words of `crate::vocab::node_info`).
//! The loops: `controller` (follows maintenance, GPU and TPU health and checkpoints, and shapes
//! the Node), `publisher` (one desired state, reconciled), `info` (follows this machine's Node).
//! The API calls themselves are in `crate::kube`.

pub mod controller;
pub mod info;
pub(crate) mod policy_info;
pub(crate) mod publisher;
