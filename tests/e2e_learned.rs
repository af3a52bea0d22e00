//! End to end, a gang restarted on its learned rhythm (issue 46): four `vigil run` processes
//! (four node names, one Redis, the real Docker daemon) at the production defaults — a 5 s
//! poll, `stale_after` 2 m, `restart_delay` 3 m — with `[policy.learned] restarts = true`, one
//! rank each in a container that ignores SIGTERM. The job beats every second for a few minutes
//! (its rhythm learned by every rank's agent and kept in Redis), then stops as a collective:
//! the time from the last beat to each rank's restart, and to its first beat after it, printed.
//!
//! Minutes long, so not in the test command: `bash scripts/e2e-learned-gang.sh` runs it
//! (`VIGIL_E2E_LEARN_S`, 180 by default: how long the job trains before it hangs).
//!
//! Beside it, in-process (the fleet harness, a fake clock: in the test command), what a day does
//! to a rhythm learned of one incarnation.

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::e2e::Setup;
use common::fleet::Fleet;
use common::real::{beat, shared_redis_url, unique, VigilProcess, WorkerContainer};
use vigil::alerts::AlertKind;

const RANKS: usize = 4;

/// The production defaults but for learned restarts (history of a minute, ten samples: learned
/// in a few minutes, not six hours) and a short stop grace (the ranks ignore SIGTERM).
fn config(s: &Setup) -> PathBuf {
    let text = format!(
        r#"node_name = "{node}"
poll_interval = "5s"
[redis]
key_prefix = "{prefix}"
[server]
listen = "{listen}"
[runtime]
worker_label = "{label}"
stop_grace = "3s"
[policy.learned]
enabled = true
restarts = true
history = "1m"
min_samples = 10
[worker_api]
listen = "{api}"
auth = "none"
"#,
        node = s.node,
        prefix = s.prefix,
        listen = s.listen,
        label = s.label,
        api = s.worker_listen,
    );
    let path = s.dir.path().join("vigil.toml");
    std::fs::write(&path, text).unwrap();
    path
}

struct Rank {
    s: Setup,
    cfg: PathBuf,
    container: WorkerContainer,
}

impl Rank {
    fn beat(&self, gang: &str, redis: &str, step: u64) {
        let step = format!("step-{step}");
        let extra = ["--gang", gang, "--gang-size", "4", "--progress", &step];
        let (code, out, err) =
            beat(&self.cfg, &self.s.worker, "processing", &extra, &[("REDIS_URL", redis)]);
        assert_eq!(code, 0, "vigil beat failed: {out} {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "minutes long: run by scripts/e2e-learned-gang.sh"]
async fn a_gang_with_a_learned_rhythm_is_restarted_within_a_minute_of_its_last_beat() {
    let learn =
        std::env::var("VIGIL_E2E_LEARN_S").ok().and_then(|v| v.parse().ok()).unwrap_or(180u64);
    let redis = shared_redis_url();
    let prefix = unique("learned");
    let gang = unique("ml/llama-");
    let ranks: Vec<Rank> = (0..RANKS)
        .map(|i| {
            let mut s = Setup::new("learned");
            s.prefix = prefix.clone();
            s.worker = format!("rank-{i}");
            let cfg = config(&s);
            let container = WorkerContainer::start(&s.label, &s.worker);
            Rank { s, cfg, container }
        })
        .collect();
    let agents: Vec<VigilProcess> = ranks
        .iter()
        .map(|r| VigilProcess::spawn(&["run"], &r.cfg, &[("REDIS_URL", &redis)]))
        .collect();
    let logs = || -> String {
        let all: Vec<String> = agents.iter().map(|a| a.log_text()).collect();
        all.join("\n----\n")
    };
    // The job trains: every rank beats once a second, in step.
    let began = Instant::now();
    let mut step = 0;
    while began.elapsed() < Duration::from_secs(learn) {
        let round = Instant::now();
        for r in &ranks {
            r.beat(&gang, &redis, step);
        }
        step += 1;
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(round.elapsed())).await;
    }
    // The collective stops: its last beats, every rank within a second.
    let before: Vec<String> = ranks.iter().map(|r| r.container.started_at()).collect();
    let last = Instant::now();
    println!("trained {learn} s ({step} steps of 1 s), then the collective stopped: no rank beats");
    // Each rank's restart (its container started again) and its first beat after it: the
    // new incarnation beats as soon as it runs (no compile here).
    let mut restarted: Vec<Option<Duration>> = vec![None; RANKS];
    let mut first_beat: Vec<Option<Duration>> = vec![None; RANKS];
    while last.elapsed() < Duration::from_secs(400) && first_beat.iter().any(Option::is_none) {
        for (i, r) in ranks.iter().enumerate() {
            if restarted[i].is_none() && r.container.started_at() != before[i] {
                restarted[i] = Some(last.elapsed());
                r.beat(&gang, &redis, step);
                first_beat[i] = Some(last.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secs = |d: &Option<Duration>| {
        d.map_or("never".to_string(), |d| format!("{:.1} s", d.as_secs_f64()))
    };
    for i in 0..RANKS {
        println!(
            "rank-{i}: last beat -> restart {}, -> first beat after it {}",
            secs(&restarted[i]),
            secs(&first_beat[i])
        );
    }
    println!("(the fixed rule with these defaults: stale_after 2m + confirm_after 10s + restart_delay 3m, about 310 s)");
    let text = logs();
    assert!(
        restarted.iter().all(|t| t.is_some_and(|t| t <= Duration::from_secs(60))),
        "not every rank restarted within a minute of its last beat: {restarted:?}\n{text}"
    );
    assert!(
        text.contains("On the learned rhythm"),
        "the decision stood on the learned rhythm:\n{text}"
    );
    assert_eq!(text.matches("decision=\"gang-decided\"").count(), 1, "one decision:\n{text}");
}

/// The record of a worker's incarnation (`P:{N}:worker:W:incarnation`, 24 h) is refreshed with
/// each cycle's batch, so a job that runs for days in one incarnation keeps what its agent
/// learned of it. Were the record to lapse a day after it was written, the next look would take
/// the same container for a new incarnation and start its own samples over (the fixed rule until
/// it has shown `min_samples` again). A worker beats every 5 s for six minutes (its rhythm
/// learned), then is looked at hourly for 26 hours (a silence learned each time, so its history
/// is written back and kept), then hangs: found on its learned rhythm (~20 s: 4 × its 5 s
/// silences, and the confirming look), not after the fixed rule's two minutes.
#[tokio::test]
async fn a_rhythm_learned_of_an_incarnation_outlives_its_first_day() {
    let poll = Duration::from_secs(5);
    let mut fleet = Fleet::builder()
        .node("gpu-1")
        .poll(poll)
        .config(move |_, c| {
            c.poll_interval = poll;
            c.policy.learned.enabled = true;
        })
        .build();
    fleet.nodes[0].runtime.add("c1", "trainer-0");
    for _ in 0..72 {
        fleet.write(0, "trainer-0", "processing", fleet.now(), &[]).await;
        fleet.tick().await;
    }
    for _ in 0..26 {
        fleet.clock.advance(Duration::from_secs(3600) - poll);
        fleet.write(0, "trainer-0", "processing", fleet.now(), &[]).await;
        fleet.tick().await;
    }
    let last = fleet.now() - 5_000;
    while fleet.sink.count(AlertKind::Hung) == 0 && fleet.now() - last < 300_000 {
        fleet.tick().await;
    }
    let found = fleet.now() - last;
    assert!(
        found < 60_000,
        "found hung {found} ms after its last beat: by the fixed rule, what was learned of its incarnation forgotten; {:?}",
        fleet.decisions(0).await
    );
}
