//! What every part of the engine shares, handed to the work as kube-rs controllers hand a
//! `Context` to each reconcile: the configuration, the node's key names, and the adapters.

use std::sync::Arc;

use crate::alerts::Notifier;
use crate::config::Config;
use crate::coord::{Coordinator, Keys};
use crate::metrics::Metrics;
use crate::runtime::ContainerRuntime;

pub(crate) struct Context {
    pub(crate) cfg: Config,
    pub(crate) keys: Keys,
    pub(crate) coord: Arc<dyn Coordinator>,
    pub(crate) runtime: Arc<dyn ContainerRuntime>,
    pub(crate) notifier: Notifier,
    pub(crate) metrics: Arc<Metrics>,
}
