//! What every part of the engine shares, handed to the work as kube-rs controllers hand a
//! `Context` to each reconcile: the configuration, the node's key names, and the adapters.

use std::sync::Arc;

use crate::alerts::Notifier;
use crate::config::Config;
use crate::coord::{Coordinator, Keys};
use crate::metrics::Metrics;
use crate::runtime::ContainerRuntime;

pub(crate) struct Context {
    pub cfg: Config,
    pub keys: Keys,
    pub coord: Arc<dyn Coordinator>,
    pub runtime: Arc<dyn ContainerRuntime>,
    pub notifier: Notifier,
    pub metrics: Arc<Metrics>,
}
