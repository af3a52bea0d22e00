//! The loops that run the policy against the adapters: the agent cycle and its restart path, the
//! node controller (maintenance, GPU publishing, checkpoints, opportunistic maintenance), the GPU
//! monitor and the heartbeat.

pub mod agent;
pub mod checkpoint;
pub mod gpu;
pub mod heartbeat;
pub mod node;
pub mod opportunistic;
pub(crate) mod publisher;
pub mod restart;
