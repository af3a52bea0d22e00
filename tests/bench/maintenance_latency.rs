//! Benchmark (a figure, not a test): latency from a metadata change to (a) the Node patch and
//! (b) the checkpoint request reaching the worker's status record, through the real watcher
//! (long-poll over HTTP against the fake metadata server), the real controller and the real
//! Kubernetes adapter (HTTP against the fake API server). The second case sends a preemption
//! at a random moment *inside* a host-maintenance checkpoint round whose worker never answers:
//! it must reach the Node and the workers as fast as a first notice (issue 11, item 1), not when
//! the round's budget ends.
//!
//! Run: `bash scripts/bench-maintenance.sh [ITERATIONS]`.

#[path = "../common/fake_kube.rs"]
mod fake_kube;
#[path = "../common/fake_metadata.rs"]
mod fake_metadata;
#[path = "../common/fakes.rs"]
mod fakes;
#[path = "../common/wiring.rs"]
mod wiring;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use vigil::alerts::Notifier;
use vigil::coord::Keys;
use vigil::kube::node::KubeNodeApi;
use vigil::maintenance::metadata::{watch_with, MetadataClient, WatchConfig};
use vigil::metrics::Metrics;
use vigil::node::controller::SharedFacts;
use vigil::vocab::maintenance::RawMetadata;
use wiring::{agent_and_controller, memory_coordinator, node_config};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<34} n={:<3} min={:>7.2}ms  p50={:>7.2}ms  p95={:>7.2}ms  p99={:>7.2}ms  max={:>7.2}ms",
        v.len(),
        ms(v[0]),
        ms(percentile(&v, 0.5)),
        ms(percentile(&v, 0.95)),
        ms(percentile(&v, 0.99)),
        ms(v[v.len() - 1])
    );
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let node = "bench-node";
    let meta = fake_metadata::FakeMetadata::start().await;
    let kube = fake_kube::FakeKube::start(node).await;
    let coord = memory_coordinator();
    let runtime = fakes::FakeRuntime::default();
    runtime.add("c1", "trainer-0");
    let mut cfg = node_config(node);
    cfg.checkpoint.preemption_budget = Duration::from_secs(2);
    // The round the second notice lands in: long enough to land anywhere inside it.
    cfg.checkpoint.maintenance_budget = Duration::from_secs(3);
    let metrics = Arc::new(Metrics::new());
    let api = KubeNodeApi::from_url(&kube.url).expect("kube client");
    let (_agent, controller) = agent_and_controller(
        &cfg,
        &coord,
        &runtime,
        Arc::new(api),
        Notifier::new(None, metrics.clone()),
        &metrics,
        SharedFacts::default(),
    );
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::watch::channel(RawMetadata::default());
    let client = MetadataClient::new(&meta.host, Duration::from_secs(5)).expect("client");
    let wcfg = WatchConfig { timeout_sec: 30, ..WatchConfig::default() };
    tokio::spawn(watch_with(client, tx, metrics.clone(), stop.clone(), wcfg));
    let (_gpu_tx, gpu_rx) = tokio::sync::watch::channel(Default::default());
    tokio::spawn(controller.run(rx, gpu_rx, CancellationToken::new(), stop.clone()));

    let keys = Keys::new("vigil", node);
    let status = keys.status("trainer-0");
    let label =
        |kube: &fake_kube::FakeKube| fake_kube::label(&kube.node(), "vigil.dev/maintenance");
    // Wait for the start-up publication.
    while label(&kube).is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut to_patch = Vec::new();
    let mut to_request = Vec::new();
    for _ in 0..n {
        let before = coord.hgetall(&status).await.unwrap().get("checkpoint_request").cloned();
        let t0 = Instant::now();
        meta.set("preempted", "TRUE").await;
        let (mut patched, mut requested) = (None, None);
        while patched.is_none() || requested.is_none() {
            if patched.is_none() && label(&kube).as_deref() == Some("terminating") {
                patched = Some(t0.elapsed());
            }
            if requested.is_none() {
                let rec = coord.hgetall(&status).await.unwrap();
                if let Some(id) = rec.get("checkpoint_request") {
                    if Some(id) != before.as_ref() {
                        requested = Some(t0.elapsed());
                        // Acknowledge at once, as a quick worker would.
                        coord
                            .hset(&status, &[("checkpoint_ack".into(), id.clone())], None)
                            .await
                            .unwrap();
                    }
                }
            }
            if t0.elapsed() > Duration::from_secs(10) {
                panic!("no reaction within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        to_patch.push(patched.unwrap());
        to_request.push(requested.unwrap());
        meta.set("preempted", "FALSE").await;
        while label(&kube).as_deref() != Some("none") {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Let the checkpoint round finish before the next notice.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!("metadata change → reaction, {n} preemption notices (poll resolution 1 ms)");
    report("metadata change → Node patched", to_patch);
    report("metadata change → checkpoint request", to_request);

    // A preemption inside a host-maintenance round whose worker never answers.
    let reason = |rec: &std::collections::HashMap<String, String>| {
        rec.get("checkpoint_reason").cloned().unwrap_or_default()
    };
    let (mut to_patch, mut to_request) = (Vec::new(), Vec::new());
    for i in 0..n {
        meta.set("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE").await;
        while reason(&coord.hgetall(&status).await.unwrap()) != "host-maintenance" {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Somewhere inside the round (spread over its first 2.5 s).
        let offset = Duration::from_millis(100 + (i as u64 * 2400) / n.max(1) as u64);
        tokio::time::sleep(offset).await;
        let t0 = Instant::now();
        meta.set("preempted", "TRUE").await;
        let (mut patched, mut requested) = (None, None);
        while patched.is_none() || requested.is_none() {
            if patched.is_none() && label(&kube).as_deref() == Some("terminating") {
                patched = Some(t0.elapsed());
            }
            if requested.is_none() && reason(&coord.hgetall(&status).await.unwrap()) == "preemption"
            {
                requested = Some(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(10) {
                panic!("no reaction to the second notice within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        to_patch.push(patched.unwrap());
        to_request.push(requested.unwrap());
        meta.set("preempted", "FALSE").await;
        meta.set("maintenance-event", "NONE").await;
        while label(&kube).as_deref() != Some("none") {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Both rounds end by their budgets before the next pair.
        tokio::time::sleep(Duration::from_millis(3_200)).await;
    }
    println!(
        "a preemption inside a host-maintenance round (worker silent, round budget 3 s), {n} notices"
    );
    report("second notice → Node patched", to_patch);
    report("second notice → checkpoint request", to_request);
    stop.cancel();
}
