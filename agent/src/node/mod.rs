//! The Kubernetes Node as Vigil shows it and reads it.
//!
//! Decisions (pure): `model` (the labels, annotations and taints Vigil wants), `model_info` and
//! `policy_info` (what GKE's labels, taints and allocatable resources say about the machine).
//! The loops: `controller` (follows maintenance, GPU and TPU health and checkpoints, and shapes
//! the Node), `publisher` (one desired state, reconciled), `info` (follows this machine's Node).
//! The API calls themselves are in `crate::kube`.

pub mod controller;
pub mod info;
pub mod model;
pub(crate) mod model_info;
pub(crate) mod policy_info;
pub(crate) mod publisher;
