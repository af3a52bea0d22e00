//! In-process wiring shared by tests/maintenance.rs, tests/gpu_agent.rs, tests/scenarios.rs and
//! the maintenance latency benchmark: the agent and the maintenance controller put together as
//! `vigil run` puts them together, over the in-process coordinator and the fake runtime, and the
//! status record a worker writes. Self-contained (the benchmark includes it by `#[path]`, without
//! the rest of `common`).

#![allow(dead_code)]

use std::sync::Arc;

use vigil::alerts::Notifier;
use vigil::clock::{Millis, SystemClock};
use vigil::config::Config;
use vigil::coord::memory::MemoryCoordinator;
use vigil::coord::{heartbeat_value, Coordinator};
use vigil::cycle::agent::Agent;
use vigil::kube::node::NodeApi;
use vigil::metrics::Metrics;
use vigil::node::controller::{Controller, SharedFacts};
use vigil::runtime::sim::FakeRuntime;

/// The defaults, on node `node`.
pub fn node_config(node: &str) -> Config {
    Config { node_name: node.into(), ..Config::default() }
}

/// The in-process coordinator on the system clock.
pub fn memory_coordinator() -> Arc<dyn Coordinator> {
    Arc::new(MemoryCoordinator::new(Arc::new(SystemClock)))
}

/// The trail's decisions, oldest first.
pub async fn trail_decisions(store: &dyn Coordinator, keys: &vigil::coord::Keys) -> Vec<String> {
    let entries = store.read_recent(&keys.trail(), 10_000).await.unwrap();
    entries.iter().rev().map(|(_, f)| f["decision"].clone()).collect()
}

/// The agent (alerting through `notifier`) and the maintenance controller (writing the Node
/// through `node_api`), sharing the coordinator, the runtime, the metrics and the agent's trail.
pub fn agent_and_controller(
    cfg: &Config,
    coord: &Arc<dyn Coordinator>,
    runtime: &FakeRuntime,
    node_api: Arc<dyn NodeApi>,
    notifier: Notifier,
    metrics: &Arc<Metrics>,
    facts: SharedFacts,
) -> (Agent, Controller) {
    let agent = Agent::new(
        cfg.clone(),
        coord.clone(),
        Arc::new(runtime.clone()),
        notifier,
        metrics.clone(),
    );
    let controller = Controller::new(
        cfg.clone(),
        coord.clone(),
        Arc::new(runtime.clone()),
        metrics.clone(),
        agent.trail(),
    )
    .with_node_api(node_api)
    .with_facts(facts);
    (agent, controller)
}

/// A worker's status record at `key`: its `state`, a heartbeat stamped `at` (store time, ms) and
/// any `extra` fields.
pub async fn write_record(
    coord: &dyn Coordinator,
    key: &str,
    state: &str,
    at: Millis,
    extra: &[(&str, &str)],
) {
    let mut fields = vec![
        ("state".to_string(), state.to_string()),
        ("heartbeat".to_string(), heartbeat_value(at)),
    ];
    fields.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    coord.hset(key, &fields, None).await.unwrap();
}
