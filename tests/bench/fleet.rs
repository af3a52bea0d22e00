//! Benchmark (figures, not a test): a fleet of N simulated nodes × W workers against one real
//! `redis-server`, each node replaying exactly a healthy agent's cycle through the agent's own
//! Redis coordinator code — the cycle's one read (the clock and every worker's record and marks,
//! the same keys the agent reads, in one script), and the node's batch (record, fleet index, progress marks, counters) — at a
//! given poll interval, with random phases. It reports Redis's CPU (from `INFO cpu`), the latency
//! of every round trip (p50/p99/p99.9), and late cycles (a cycle that started more than one poll
//! interval after the previous one).
//!
//! The load generator shares the machine with Redis; its connections are a pool (`--conns`),
//! where real agents hold one each (size `maxclients` for the real count: docs/running.md).
//!
//! With `gang` after them, the fleet runs three times at the default poll: without a gang, with a
//! gang of 1,000 nodes (its ranks' entries in each member node's batch), and with that gang hung
//! (each member node also reads the gang's state every cycle and tries the reader's lease, and the
//! one that wins it reads the whole view, as the agents do while their ranks are suspect).
//!
//! Run: `bash scripts/bench-fleet.sh [NODES] [WORKERS] [SECONDS] [gang]`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod server;

use server::Server;
use vigil::coord::redis::RedisCoordinator;
use vigil::coord::{heartbeat_value, Coordinator, Keys, Op};
use vigil::fleet::view::{publish_ops, NodeRecord, Upkeep};
use vigil::hang::policy_gang::{shard_of, shards};
use vigil::hang::restart::worker_read_keys;

/// Redis's own CPU seconds (user + sys).
async fn redis_cpu(url: &str) -> f64 {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut c).await.unwrap();
    info.lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}

/// One field of `INFO section`.
async fn redis_info(url: &str, section: &str, field: &str) -> String {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO").arg(section).query_async(&mut c).await.unwrap();
    info.lines().find_map(|l| l.strip_prefix(field)).unwrap_or("?").trim().to_string()
}

#[derive(Default)]
struct Figures {
    latencies_us: Mutex<Vec<u32>>,
    cycles: AtomicU64,
    late: AtomicU64,
    errors: AtomicU64,
}

/// How the fleet's first nodes take part in one gang (issue 29).
#[derive(Clone, Copy, PartialEq, Debug)]
enum GangMode {
    /// No gang.
    None,
    /// The first `members` nodes are ranks of one gang (`workers` ranks each): each writes its
    /// ranks' entries in the gang's view with its batch, as a healthy member's agent does.
    Healthy { members: usize },
    /// The same gang, hung: every member node also reads the whole view each cycle (its shards,
    /// then the gang's state), as while its own ranks are suspect.
    Hung { members: usize },
}

const GANG: &str = "bench/llama";

/// A member entry as an agent writes it (the short JSON of `hang::model_gang::Member`).
fn entry(node: &str, worker: &str, now: i64) -> String {
    format!(
        r#"{{"n":"{node}","w":"{worker}","v":"healthy","s":"w","hb":{now},"ok":120000,"st":{},"at":{now},"br":3,"c":"ml/{node}-{worker}/main"}}"#,
        now - 3_600_000
    )
}

#[allow(clippy::too_many_arguments)]
async fn node_loop(
    coord: Arc<dyn Coordinator>,
    node: usize,
    workers: usize,
    poll: Duration,
    until: Instant,
    figures: Arc<Figures>,
    gang: GangMode,
) {
    let name = format!("fleet-{node}");
    let keys = Keys::new("vigil", &name);
    let worker_names: Vec<String> = (0..workers).map(|w| format!("w{w}")).collect();
    let asked: Vec<_> = worker_names.iter().map(|w| worker_read_keys(&keys, w)).collect();
    // As the agent's cycle does (`fleet::heartbeat`): the node's place and the index's pruning
    // with its first publication, then every ten minutes.
    let mut upkept_at: Option<Instant> = None;
    let mut lat = Vec::new();
    // A random phase, so the fleet does not beat in step.
    let phase = Duration::from_millis((node as u64 * 7919) % poll.as_millis().max(1) as u64);
    let mut next = Instant::now() + phase;
    let mut step = 0u64;
    while next < until {
        tokio::time::sleep_until(next.into()).await;
        let started = Instant::now();
        if started > next + poll {
            figures.late.fetch_add(1, Ordering::Relaxed);
        }
        step += 1;
        let timed = |t: Instant, lat: &mut Vec<u32>| lat.push(t.elapsed().as_micros() as u32);
        // The cycle's one read: the clock and every worker's record and marks.
        let t = Instant::now();
        let Ok(read) = coord.read_workers(&asked).await else {
            figures.errors.fetch_add(1, Ordering::Relaxed);
            next += poll;
            continue;
        };
        timed(t, &mut lat);
        let now = read.now;
        let mut ops = Vec::new();
        for w in &worker_names {
            ops.push(Op::Set {
                key: keys.progress(w),
                value: format!("{now}:step {step}"),
                ttl: Duration::from_secs(24 * 3600),
            });
        }
        let rec = NodeRecord {
            node: name.clone(),
            pool: "bench".into(),
            slice: String::new(),
            maintenance: "none".into(),
            gpu: "unknown".into(),
            workers: worker_names.iter().map(|w| (w.clone(), "healthy".to_string())).collect(),
            places: Default::default(),
            version: "bench".into(),
            dry_run: false,
            updated_at: now,
            ..NodeRecord::default()
        };
        let upkeep = match upkept_at {
            Some(at) if at.elapsed() < Duration::from_secs(600) => Upkeep::NONE,
            _ => {
                upkept_at = Some(Instant::now());
                Upkeep::ALL
            }
        };
        let mut all = publish_ops(&keys, &rec, Duration::from_secs(90), upkeep);
        all.extend(ops);
        all.push(Op::Counter { key: keys.breaker("2026-11-30") });
        all.push(Op::Counter { key: keys.fleet_budget(now / 3_600_000) });
        let members = match gang {
            GangMode::None => 0,
            GangMode::Healthy { members } | GangMode::Hung { members } => members,
        };
        let size = (members * workers) as u32;
        if node < members {
            let shards = shards(Some(size));
            all.push(Op::Hset {
                key: keys.gang_members(GANG, shard_of(&name, shards)),
                fields: worker_names
                    .iter()
                    .map(|w| (format!("{name}/{w}"), entry(&name, w, now)))
                    .collect(),
                ttl: Some(Duration::from_secs(540)),
            });
        }
        if node < members && matches!(gang, GangMode::Hung { .. }) {
            // As an agent of a suspect member does: the gang's state, the reader's lease for
            // this poll interval, and — for the one agent that wins it — the whole view.
            let state =
                [keys.gang_incident(GANG), keys.gang_decision(GANG), keys.gang_restarted(GANG)];
            let t = Instant::now();
            match coord.get_many(&state).await {
                Ok(_) => timed(t, &mut lat),
                Err(_) => {
                    figures.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            let t = Instant::now();
            let reader = coord.set_nx(&keys.gang_reader(GANG), &name, poll).await;
            timed(t, &mut lat);
            if reader.unwrap_or(false) {
                let views: Vec<String> =
                    (0..shards(Some(size))).map(|s| keys.gang_members(GANG, s)).collect();
                let t = Instant::now();
                match coord.hgetall_many(&views).await {
                    Ok(_) => timed(t, &mut lat),
                    Err(_) => {
                        figures.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let t = Instant::now();
        match coord.batch(&all).await {
            Ok(_) => timed(t, &mut lat),
            Err(_) => {
                figures.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        figures.cycles.fetch_add(1, Ordering::Relaxed);
        next += poll;
    }
    figures.latencies_us.lock().unwrap().extend(lat);
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

async fn run(
    url: &str,
    nodes: usize,
    workers: usize,
    poll: Duration,
    secs: u64,
    conns: usize,
    gang: GangMode,
) {
    let pool: Vec<Arc<dyn Coordinator>> = (0..conns)
        .map(|_| {
            Arc::new(RedisCoordinator::new(url, Duration::from_secs(2)).unwrap())
                as Arc<dyn Coordinator>
        })
        .collect();
    // The workers' records, as workers write them.
    let seed = &pool[0];
    let now = seed.time().await.unwrap();
    for node in 0..nodes {
        let keys = Keys::new("vigil", &format!("fleet-{node}"));
        let ops: Vec<Op> = (0..workers)
            .map(|w| Op::Hset {
                key: keys.status(&format!("w{w}")),
                fields: vec![
                    ("state".into(), "processing".into()),
                    ("heartbeat".into(), heartbeat_value(now)),
                    ("progress".into(), "step 1".into()),
                ],
                ttl: Some(Duration::from_secs(3600)),
            })
            .collect();
        seed.batch(&ops).await.unwrap();
    }
    let figures = Arc::new(Figures::default());
    let cpu0 = redis_cpu(url).await;
    let wall = Instant::now();
    let until = wall + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..nodes)
        .map(|n| {
            tokio::spawn(node_loop(
                pool[n % conns].clone(),
                n,
                workers,
                poll,
                until,
                figures.clone(),
                gang,
            ))
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = wall.elapsed().as_secs_f64();
    let cpu = (redis_cpu(url).await - cpu0) / elapsed * 100.0;
    let memory = redis_info(url, "memory", "used_memory_human:").await;
    let mut lat = std::mem::take(&mut *figures.latencies_us.lock().unwrap());
    lat.sort_unstable();
    let gang_text = match gang {
        GangMode::None => String::new(),
        GangMode::Healthy { members } => format!(", a gang of {members} nodes x {workers} ranks"),
        GangMode::Hung { members } => format!(
            ", a gang of {members} nodes x {workers} ranks, hung (every member node reads the gang's state, one a poll the whole view)"
        ),
    };
    println!(
        "{nodes} nodes x {workers} workers{gang_text}, poll {poll:?}, {secs} s: {:.0} round trips/s, Redis CPU {cpu:.1}% of a core, latency p50 {:.2} ms p99 {:.2} ms p99.9 {:.2} ms, {} cycles, {} late, {} errors, Redis memory {memory}",
        lat.len() as f64 / elapsed,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&lat, 0.999),
        figures.cycles.load(Ordering::Relaxed),
        figures.late.load(Ordering::Relaxed),
        figures.errors.load(Ordering::Relaxed),
    );
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let nodes = args.first().copied().unwrap_or(10_000) as usize;
    let workers = args.get(1).copied().unwrap_or(8) as usize;
    let secs = args.get(2).copied().unwrap_or(30);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let server = Server::start(&["--maxclients", "20000"]);
        let url = server.url();
        println!(
            "fleet simulation against one redis-server (the load generator on the same machine)"
        );
        let gang = std::env::args().any(|a| a == "gang");
        if gang {
            // Issue 29: the same fleet without and with a gang of 1,000 nodes (or all of them).
            let members = nodes.min(1_000);
            let poll = Duration::from_secs(15);
            for mode in [GangMode::None, GangMode::Healthy { members }, GangMode::Hung { members }]
            {
                run(&url, nodes, workers, poll, secs, 64, mode).await;
            }
            return;
        }
        for poll in [Duration::from_secs(15), Duration::from_secs(5)] {
            run(&url, nodes, workers, poll, secs, 64, GangMode::None).await;
        }
    });
}
