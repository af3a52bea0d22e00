//! Read-only adapters: what the node and the platform say.

pub mod gpu;
pub mod metadata;
pub mod node;
pub(crate) mod peer;
pub mod podresources;
pub mod pods;
pub(crate) mod token_review;
pub mod tpu;
