//! The Kubernetes API as Vigil uses it (`client`: connecting, and the errors): the Node (`node`: labels, annotations, taints, Events;
//! `node_source`: reading it), the pods of the node (`pods`) and the kubelet's PodResources API
//! (`podresources`: which GPUs each container was given).

pub mod client;
pub mod device_taints;
pub mod node;
pub mod node_source;
pub mod podresources;
pub mod pods;
pub mod workloads;
