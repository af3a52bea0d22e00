//! Benchmark (figures, not a test): what a healthy node costs Redis per cycle, for 1, 8 and 32
//! workers — the real agent (`Agent::cycle`) over the real Redis coordinator against a private
//! `redis-server`, with the simulated runtime standing in for Docker.
//!
//! Round trips are counted at the client (every coordinator call is one request and one
//! reply: a command, a pipeline or a script); commands are counted by Redis itself
//! (`INFO commandstats`, after `CONFIG RESETSTAT`; the commands a script runs are counted
//! there too).
//!
//! Run: `bash scripts/bench-redis.sh [CYCLES]`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod server;

use async_trait::async_trait;
use vigil::alerts::Notifier;
use vigil::config::Config;
use vigil::coord::redis::RedisCoordinator;
use vigil::coord::{heartbeat_value, CoordError, Coordinator, Keys, Reply, Request};
use vigil::cycle::agent::Agent;
use vigil::metrics::Metrics;
use vigil::runtime::sim::FakeRuntime;

use server::Server;

/// Counts round trips: each call is one exchange with Redis.
struct Counting {
    inner: RedisCoordinator,
    trips: AtomicU64,
}

impl Counting {
    fn trip(&self) {
        self.trips.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Coordinator for Counting {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn execute(&self, request: Request) -> Result<Reply, CoordError> {
        self.trip();
        self.inner.execute(request).await
    }
}

/// `INFO commandstats` as command → calls.
async fn commandstats(url: &str) -> HashMap<String, u64> {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').next()?.strip_prefix("calls=")?;
            Some((name.to_string(), calls.parse().ok()?))
        })
        .collect()
}

async fn reset(url: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut c).await.unwrap();
}

async fn one_size(url: &str, workers: usize, cycles: u64, gang: bool) {
    let node = format!("bench-{workers}-{gang}");
    let coord = Arc::new(Counting {
        inner: RedisCoordinator::new(url, Duration::from_secs(2)).unwrap(),
        trips: AtomicU64::new(0),
    });
    let runtime = FakeRuntime::default();
    for i in 0..workers {
        runtime.add(&format!("c{i}"), &format!("w{i}"));
    }
    let cfg = Config { node_name: node.clone(), ..Config::default() };
    let keys = Keys::new(&cfg.redis.key_prefix, &node);
    let metrics = Arc::new(Metrics::new());
    let mut agent = Agent::new(
        cfg,
        coord.clone(),
        Arc::new(runtime),
        Notifier::new(None, metrics.clone()),
        metrics,
    );
    let beat = |step: u64| {
        let (coord, keys) = (coord.clone(), keys.clone());
        async move {
            // NB: the workers' own writes, past the counter.
            let redis: &dyn Coordinator = &coord.inner;
            let now = redis.time().await.unwrap();
            for i in 0..workers {
                let mut fields = vec![
                    ("state".to_string(), "processing".to_string()),
                    ("heartbeat".to_string(), heartbeat_value(now)),
                    ("progress".to_string(), format!("step {step}")),
                ];
                if gang {
                    // Every worker a rank of one job across nodes (issue 29).
                    fields.push(("gang".to_string(), "bench/job".to_string()));
                    fields.push(("gang_size".to_string(), "1024".to_string()));
                }
                redis.hset(&keys.status(&format!("w{i}")), &fields, None).await.unwrap();
            }
        }
    };
    // The first cycle records each incarnation: not a steady state.
    beat(0).await;
    agent.cycle().await;
    reset(url).await;
    coord.trips.store(0, Ordering::Relaxed);
    for step in 1..=cycles {
        beat(step).await; // the workers' own writes, before the counters are read
        let before = commandstats(url).await;
        let trips_before = coord.trips.load(Ordering::Relaxed);
        let r = agent.cycle().await;
        assert!(r.coordinator_error.is_none(), "{r:?}");
        let after = commandstats(url).await;
        if step == cycles {
            let trips = coord.trips.load(Ordering::Relaxed) - trips_before;
            // This benchmark's own INFO is not the agent's (the workers beat before `before`).
            let mut cmds: Vec<(String, u64)> = after
                .iter()
                .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
                .filter(|(k, n)| *n > 0 && k != "info")
                .collect();
            cmds.sort();
            let total: u64 = cmds.iter().map(|(_, n)| n).sum();
            let label = if gang { " (each a rank of a gang)" } else { "" };
            println!(
                "{workers:>3} workers{label}: {trips:>3} round trips/cycle ({:.2}/worker), {total:>4} Redis commands/cycle ({:.2}/worker): {}",
                trips as f64 / workers as f64,
                total as f64 / workers as f64,
                cmds.iter()
                    .map(|(k, n)| format!("{k}={n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cycles: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let server = Server::start(&[]);
    let url = server.url();
    println!("a healthy node's cost per cycle (steady state; the last of {cycles} cycles; one private redis-server)");
    for workers in [1, 8, 32] {
        one_size(&url, workers, cycles, false).await;
    }
    // A gang member's entry goes in the cycle's batch: the same W + 2 (issue 29).
    one_size(&url, 8, cycles, true).await;
}
