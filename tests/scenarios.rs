//! The seed's scenarios (a)–(l), each a named test, driven through the real agent and pipeline
//! with the in-process coordinator, a fake clock and a fake runtime: the brief's default
//! durations (120 s stale, 3 min delay, 10 min cooldown...) run in microseconds, with no sleeps.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::fakes::{FakeRuntime, RecordingSink};
use common::fleet::{Fleet, DAY_START};
use common::wiring::{node_config, write_record};
use vigil::alerts::{AlertKind, Notifier, Resolve};
use vigil::clock::{utc_day, FakeClock, Millis};
use vigil::config::Config;
use vigil::coord::memory::MemoryCoordinator;
use vigil::coord::{heartbeat_value, Coordinator, Keys};
use vigil::cycle::agent::{Agent, CycleReport};
use vigil::hang::policy::Verdict;
use vigil::metrics::Metrics;

const POLL: Duration = Duration::from_secs(15);

/// The one node (`gpu-1`) of the scenarios, on the shared fleet harness, with handles on what
/// they read: the clock, the coordinator, the node's runtime and keys, the alert sink, the
/// coordinator's off switch.
struct World {
    fleet: Fleet,
    clock: FakeClock,
    store: Arc<dyn Coordinator>,
    runtime: FakeRuntime,
    sink: RecordingSink,
    keys: Keys,
    down: Arc<AtomicBool>,
}

fn config(node: &str, tweak: impl Fn(&mut Config)) -> Config {
    let mut cfg = node_config(node);
    tweak(&mut cfg);
    cfg.validate().expect("scenario config is valid");
    cfg
}

impl World {
    fn new(tweak: impl Fn(&mut Config) + 'static) -> World {
        Self::with_agents(1, tweak)
    }

    /// `n` agents watching the same node through the same coordinator and runtime, and the
    /// node's one worker, `trainer-0` in container `c1`.
    fn with_agents(n: usize, tweak: impl Fn(&mut Config) + 'static) -> World {
        let fleet = Fleet::builder()
            .node("gpu-1")
            .agents_per_node(n)
            .poll(POLL)
            .config(move |_, c| tweak(c))
            .build();
        let node = &fleet.nodes[0];
        node.runtime.add("c1", "trainer-0");
        World {
            clock: fleet.clock.clone(),
            store: fleet.store.clone(),
            runtime: node.runtime.clone(),
            sink: fleet.sink.clone(),
            keys: node.keys.clone(),
            down: fleet.down.clone(),
            fleet,
        }
    }

    /// The node's agents.
    fn agents(&mut self) -> &mut Vec<Agent> {
        &mut self.fleet.nodes[0].agents
    }

    /// Another agent on the node, with its own config (a rolling update's new instance).
    fn add_agent(&mut self, cfg: Config) {
        self.fleet.add_agent(0, cfg);
    }

    fn now(&self) -> Millis {
        self.clock_now()
    }

    fn clock_now(&self) -> Millis {
        use vigil::clock::Clock;
        self.clock.now()
    }

    /// The worker writes its record, heartbeat stamped with the shared clock.
    async fn beat(&self, worker: &str, state: &str, progress: &str) {
        write_record(
            self.store.as_ref(),
            &self.keys.status(worker),
            state,
            self.now(),
            &[("job", "job-7"), ("progress", progress)],
        )
        .await;
    }

    /// Rank `rank` of `ranks` in `worker`'s container beats (its own fields, `state@r`...).
    async fn beat_rank(&self, worker: &str, rank: u32, ranks: u32, progress: &str) {
        let hb = vigil::coord::heartbeat_value(self.now());
        let fields = vec![
            ("ranks".to_string(), ranks.to_string()),
            ("job".to_string(), "job-7".to_string()),
            (format!("state@{rank}"), "processing".to_string()),
            (format!("heartbeat@{rank}"), hb),
            (format!("progress@{rank}"), progress.to_string()),
        ];
        self.store.hset(&self.keys.status(worker), &fields, None).await.unwrap();
    }

    /// `n` times: `trainer-0` beats (alive, in `state`, at `progress`), then one tick.
    async fn beat_and_tick(&mut self, n: usize, state: &str, progress: &str) {
        for _ in 0..n {
            self.beat("trainer-0", state, progress).await;
            self.tick().await;
        }
    }

    /// Advance the clock by one poll interval and run one cycle of every agent.
    async fn tick(&mut self) -> Vec<CycleReport> {
        self.fleet.tick().await
    }

    /// Tick until `until` (absolute, from DAY_START) has passed.
    async fn run_until(&mut self, until: Duration) {
        while self.now() < DAY_START + until.as_millis() as Millis {
            self.tick().await;
        }
    }

    async fn run_for(&mut self, d: Duration) {
        self.fleet.run_for(d).await
    }

    async fn get(&self, key: &str) -> Option<String> {
        self.fleet.get(key).await
    }

    async fn decisions(&self) -> Vec<String> {
        common::wiring::trail_decisions(self.store.as_ref(), &self.keys).await
    }

    async fn breaker(&self) -> u64 {
        self.store.counter(&self.keys.breaker(&utc_day(self.now()))).await.unwrap()
    }
}

fn mins(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

/// A worker that beat once at t=0 and then hung, run until just past its restart:
/// stale after 120 s (t=135 first sighting, t=150 confirmed), restart due at 150 + 180 = 330 s.
async fn hung_and_restarted(w: &mut World) {
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(330)).await;
    assert_eq!(w.runtime.restarts("c1"), 1, "one restart at the end of the delay");
}

#[tokio::test]
async fn hang_is_restarted_exactly_once_after_the_delay_with_alert_and_trail() {
    let mut w = World::new(|_| {});
    let before = w.runtime.started_at("c1");
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(315)).await;
    assert_eq!(w.runtime.restarts("c1"), 0, "not before restart_delay");
    assert!(w.get(&w.keys.incident("trainer-0")).await.is_some());
    w.tick().await; // t = 330
    assert_eq!(w.runtime.restarts("c1"), 1);
    assert_ne!(w.runtime.started_at("c1"), before);
    assert_eq!(w.sink.count(AlertKind::Hung), 1);
    let restarting = w.sink.of(AlertKind::Restarting);
    assert_eq!(restarting.len(), 1);
    assert!(restarting[0].logs.as_deref().unwrap().contains("step 42"));
    assert_eq!(restarting[0].job.as_deref(), Some("job-7"));
    let d = w.decisions().await;
    for want in ["suspect", "timer-started", "alerted", "restarted"] {
        assert!(d.iter().any(|x| x == want), "{want} missing from {d:?}");
    }
    assert_eq!(w.breaker().await, 1);
    assert!(w.get(&w.keys.cooldown("trainer-0")).await.is_some());
    assert!(w.get(&w.keys.incident("trainer-0")).await.is_none());
}

/// The value of the one sample of `series` (name and labels, as encoded) in a scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn per_worker_series_follow_the_verdict_and_leave_with_the_worker() {
    let mut w = World::new(|_| {});
    hung_and_restarted(&mut w).await;
    let text = w.agents()[0].metrics().encode();
    let worker = "{worker=\"trainer-0\"}";
    let hung = "vigil_worker_state{worker=\"trainer-0\",state=\"hung\"}";
    assert_eq!(sample(&text, hung), Some(1.0), "{text}");
    // The cycle that restarts exports the stage it decided in; the next one the restart's.
    let stage =
        |s: &str| format!("vigil_worker_incident_stage{{worker=\"trainer-0\",stage=\"{s}\"}}");
    assert_eq!(sample(&text, &stage("due")), Some(1.0), "{text}");
    let age = sample(&text, &format!("vigil_worker_heartbeat_age_seconds{worker}"));
    assert_eq!(age, Some(330.0), "beat at t=0, judged at t=330: {text}");
    let restart = format!("vigil_worker_last_restart_timestamp_seconds{worker}");
    let at = (DAY_START + 330_000) as f64 / 1000.0;
    assert_eq!(sample(&text, &restart), Some(at), "{text}");

    w.tick().await;
    let text = w.agents()[0].metrics().encode();
    let booting = "vigil_worker_state{worker=\"trainer-0\",state=\"booting\"}";
    assert_eq!(sample(&text, booting), Some(1.0), "{text}");
    assert_eq!(sample(&text, &stage("booting")), Some(1.0), "{text}");
    assert_eq!(sample(&text, &stage("due")), None, "one stage series per worker: {text}");
    assert_eq!(sample(&text, hung), None, "one state series per worker: {text}");
    assert_eq!(sample(&text, &restart), Some(at), "{text}");

    // The container loses its opt-in label: the worker is no longer watched here.
    w.runtime.add_unlabelled("c1");
    w.tick().await;
    let text = w.agents()[0].metrics().encode();
    assert!(!text.contains("trainer-0"), "{text}");
}

#[tokio::test]
async fn scenario_a_booting_container_is_not_restarted_during_cooldown() {
    let mut w = World::new(|_| {});
    hung_and_restarted(&mut w).await;
    // The old record still says processing with a stale heartbeat for the whole cooldown.
    w.run_for(mins(10) - POLL).await;
    assert_eq!(w.runtime.restarts("c1"), 1, "no second restart while booting");
    assert!(w.get(&w.keys.incident("trainer-0")).await.is_none(), "no timer while booting");
    assert!(w.get(&w.keys.suspect("trainer-0")).await.is_none());
    let verdicts = w.tick().await;
    assert_ne!(verdicts[0].verdicts[0].1, Verdict::Booting, "cooldown ends after 10 min");
}

/// Issue 27: booting ends at the restarted worker's first beat, not at the end of the 10 min
/// cooldown. It came back (one beat), hung again: that is a new incident, found, alerted and
/// restarted after the usual detection and delay — the breaker still counts it.
#[tokio::test]
async fn booting_ends_at_the_first_beat_and_a_new_hang_is_a_new_incident() {
    let mut w = World::new(|_| {});
    let t0 = w.now();
    hung_and_restarted(&mut w).await; // restarted at t = 330 s
    w.run_for(Duration::from_secs(30)).await;
    let verdicts = w.tick().await;
    assert_eq!(verdicts[0].verdicts[0].1, Verdict::Booting, "silent: still booting");
    // The new incarnation's first beat (at t = 375 s), then nothing: hung again.
    w.beat("trainer-0", "processing", "step-2").await;
    let verdicts = w.tick().await;
    assert_eq!(verdicts[0].verdicts[0].1, Verdict::Healthy, "booted");
    assert!(w.get(&w.keys.cooldown("trainer-0")).await.is_none());
    assert!(w.decisions().await.iter().any(|d| d == "booted"));
    // Stale after 120 s, confirmed, then the 3 min delay: a second restart well inside what
    // the cooldown would have covered (330 s + 10 min = 930 s).
    w.run_for(Duration::from_secs(330)).await;
    assert_eq!(w.runtime.restarts("c1"), 2, "the new hang is restarted");
    assert!(w.now() - t0 < 930_000, "at {} ms", w.now() - t0);
    assert_eq!(w.sink.count(AlertKind::Hung), 2, "one hung alert per incident");
    assert_eq!(w.breaker().await, 2, "each restart takes a breaker unit");
}

/// Issue 31, item 2: a restarted hang's time lost, phase by phase, adds up to its last beat →
/// the new incarnation's first beat: in the trail (with the incident), the counters and the
/// histogram, and in the node record `vigil status` reads.
#[tokio::test]
async fn a_restarted_hang_says_what_it_lost_phase_by_phase() {
    let mut w = World::new(|_| {});
    hung_and_restarted(&mut w).await; // last beat t = 0, confirmed t = 150, command t = 330
    w.run_for(Duration::from_secs(30)).await;
    w.tick().await; // t = 375
    w.beat("trainer-0", "processing", "step-2").await;
    w.tick().await; // the first beat (t = 375) seen at t = 390
    let entries = w.store.read_recent(&w.keys.trail(), 200).await.unwrap();
    let lost: Vec<_> = entries
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e.get("decision").map(String::as_str) == Some("time-lost"))
        .collect();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(
        lost[0]["detail"],
        "lost 6m 15s = detection 2m 30s (last beat → verdict) + decision 3m (→ restart command) + restart 0ms (→ new incarnation) + recovery 45s (→ first beat)"
    );
    let incident = lost[0].get("incident").expect("the incident's id");
    assert!(entries.iter().any(|(_, e)| {
        e.get("decision").map(String::as_str) == Some("restarted")
            && e.get("incident") == Some(incident)
    }));
    assert!(w.get(&w.keys.lost("trainer-0")).await.is_none(), "done with");
    let text = w.agents()[0].metrics().encode();
    for (series, want) in [
        ("vigil_lost_seconds_total{cause=\"hang\"}", 330.0),
        ("vigil_lost_seconds_total{cause=\"restart\"}", 45.0),
        ("vigil_lost_seconds_total{cause=\"preemption\"}", 0.0),
        ("vigil_time_to_recovery_seconds_sum", 375.0),
        ("vigil_time_to_recovery_seconds_count", 1.0),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    let record = w.store.hgetall(&w.keys.agent()).await.unwrap();
    let day: std::collections::BTreeMap<String, f64> =
        serde_json::from_str(&record["lost"]).unwrap();
    assert_eq!((day["hang"], day["restart"]), (330.0, 45.0));
}

/// Issue 27: several ranks in one container (torchrun: one process per GPU). Rank 1 stops while
/// rank 0 keeps beating: the container is as healthy as its worst rank — hung, alerted naming
/// rank 1, restarted once.
#[tokio::test]
async fn one_hung_rank_is_not_hidden_by_the_others_beats() {
    let mut w = World::new(|_| {});
    w.beat_rank("trainer-0", 1, 2, "step-1").await;
    let mut step = 0;
    while w.runtime.restarts("c1") == 0 && step < 60 {
        step += 1;
        w.beat_rank("trainer-0", 0, 2, &format!("step-{step}")).await;
        w.tick().await;
    }
    assert_eq!(w.runtime.restarts("c1"), 1, "the container of the hung rank is restarted");
    let hung = w.sink.of(AlertKind::Hung);
    assert_eq!(hung.len(), 1);
    assert!(hung[0].detail.contains("rank 1 of 2"), "{}", hung[0].detail);
}

/// Every rank beating: healthy, however many there are; a rank that never wrote is no
/// better than a hung one (it is not guessed to be fine).
#[tokio::test]
async fn ranks_that_all_beat_are_healthy_and_a_silent_one_is_not() {
    let mut w = World::new(|_| {});
    for step in 0..20 {
        for r in 0..4 {
            w.beat_rank("trainer-0", r, 4, &format!("step-{step}")).await;
        }
        let v = w.tick().await;
        assert_eq!(v[0].verdicts[0].1, Verdict::Healthy, "step {step}");
    }
    let mut w = World::new(|_| {});
    w.beat_rank("trainer-0", 0, 2, "step-1").await;
    let v = w.tick().await;
    assert_eq!(v[0].verdicts[0].1, Verdict::Unreachable, "rank 1 has written nothing");
}

/// A rank whose heartbeat is milliseconds where seconds belong (decades ahead) is not hidden
/// behind the others' beats: the container's record is invalid, alerted naming that rank, and
/// never restarted on it; a stale rank beside it is still a hang.
#[tokio::test]
async fn a_rank_beating_from_the_future_is_said_and_does_not_hide_a_hang() {
    let mut w = World::new(|_| {});
    let from_the_future = |w: &World| {
        let fields = [("state@1", "processing".to_string()), ("heartbeat@1", w.now().to_string())];
        fields.map(|(k, v)| (k.to_string(), v))
    };
    for step in 0..5 {
        w.beat_rank("trainer-0", 0, 2, &format!("step-{step}")).await;
        w.store.hset(&w.keys.status("trainer-0"), &from_the_future(&w), None).await.unwrap();
        let v = w.tick().await;
        assert_eq!(v[0].verdicts[0].1, Verdict::Unreachable, "step {step}");
    }
    let unreachable = w.sink.of(AlertKind::Unreachable);
    assert_eq!(unreachable.len(), 1, "one page for the episode");
    assert!(unreachable[0].detail.contains("rank 1 of 2"), "{}", unreachable[0].detail);
    assert!(unreachable[0].detail.contains("ahead of the coordinator's clock"));
    // Rank 0 stops: a hang, restarted whatever rank 1's clock says.
    let mut ticks = 0;
    while w.runtime.restarts("c1") == 0 && ticks < 60 {
        ticks += 1;
        w.store.hset(&w.keys.status("trainer-0"), &from_the_future(&w), None).await.unwrap();
        w.tick().await;
    }
    assert_eq!(w.runtime.restarts("c1"), 1, "the stale rank's container is restarted");
    assert!(w.sink.of(AlertKind::Hung)[0].detail.contains("rank 0 of 2"));
}

/// A restarted worker that never beats is booting for the whole cooldown, as before: without a
/// beat there is no telling a slow boot from a new hang.
#[tokio::test]
async fn a_restarted_worker_that_never_beats_boots_for_the_whole_cooldown() {
    let mut w = World::new(|_| {});
    hung_and_restarted(&mut w).await;
    w.run_for(mins(10) - POLL).await;
    assert_eq!(w.runtime.restarts("c1"), 1);
    assert!(!w.decisions().await.iter().any(|d| d == "booted"));
}

#[tokio::test]
async fn scenario_b_two_agents_on_one_node_restart_once() {
    let mut w = World::with_agents(2, |_| {});
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(330) + mins(5)).await;
    assert_eq!(w.runtime.restarts("c1"), 1);
    assert_eq!(w.sink.count(AlertKind::Hung), 1, "one alert per incident, not per agent");
    assert_eq!(w.sink.count(AlertKind::Restarting), 1);
    assert_eq!(w.breaker().await, 1);
}

#[tokio::test]
async fn scenario_c_fresh_heartbeat_before_the_command_cancels_and_cleans_up() {
    let mut w = World::new(|_| {});
    // While logs are collected, the worker comes back.
    let store = w.store.clone();
    let key = w.keys.status("trainer-0");
    let clock = w.clock.clone();
    w.runtime.on_logs(move || {
        use vigil::clock::Clock;
        let store = store.clone();
        let key = key.clone();
        let hb = heartbeat_value(clock.now());
        // The hook runs inside the agent's task; the in-memory store's hset completes at once.
        futures_block(async move {
            store.hset(&key, &[("heartbeat".to_string(), hb)], None).await.unwrap()
        });
    });
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(330)).await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    assert!(w.get(&w.keys.incident("trainer-0")).await.is_none(), "timer cleaned");
    assert!(w.get(&w.keys.cooldown("trainer-0")).await.is_none());
    assert_eq!(w.breaker().await, 0, "nothing ran, nothing consumed");
    assert!(w.decisions().await.contains(&"cancelled-recovered".to_string()));
}

/// Drive a future that never waits (the in-memory store) to completion from sync code.
fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

#[tokio::test]
async fn scenario_d_fourth_hang_in_a_day_is_not_restarted_and_the_alert_says_why() {
    // NB: restarts that never help stop after two (`restarts_that_bring_no_progress_stop`);
    // this one is about the breaker.
    let mut w = World::new(|c| c.policy.max_fruitless_restarts = 0);
    w.beat("trainer-0", "processing", "step-1").await;
    // Never recovers: restart, 10 min cooldown, hang again, restart... for four hours.
    w.run_for(Duration::from_secs(4 * 3600)).await;
    assert_eq!(w.runtime.restarts("c1"), 3, "the breaker caps a day at 3");
    assert_eq!(w.breaker().await, 3);
    let open = w.sink.of(AlertKind::BreakerOpen);
    assert_eq!(open.len(), 1, "one breaker alert, not one per cycle");
    assert!(open[0].detail.contains("circuit breaker open"), "{}", open[0].detail);
    assert!(w.decisions().await.contains(&"skipped-breaker-open".to_string()));
    let text = w.agents()[0].metrics().encode();
    assert!(common::has_sample(&text, "vigil_breaker_used 3"), "{text}");
    assert!(common::has_sample(&text, "vigil_breaker_open 1"), "{text}");
    assert!(common::has_sample(&text, "vigil_breaker_limit 3"), "{text}");
}

#[tokio::test]
async fn breaker_resets_at_midnight_utc() {
    let mut w = World::new(|_| {});
    // Start 40 minutes before midnight: the hang restarts at 23:25 + 5.5 min...
    w.clock.set(DAY_START + 86_400_000 - 40 * 60_000);
    let day = utc_day(w.now());
    w.store.set(&w.keys.breaker(&day), "3", Duration::from_secs(3600 * 48)).await.unwrap();
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_for(mins(35)).await;
    assert_eq!(w.runtime.restarts("c1"), 0, "yesterday's breaker is full");
    w.run_for(mins(10)).await;
    assert_eq!(w.runtime.restarts("c1"), 1, "a new UTC day has a new breaker");
    assert_ne!(utc_day(w.now()), day);
}

/// Logs that cannot be read hold a hung worker's restart back for two polls from their first
/// failure (their retries, no breaker unit used), then the restart goes ahead without them, its
/// page saying why: a hung worker is never left hung for a page's log tail. One `logs-failed` page
/// and one trail entry for the incident, not one per cycle.
#[tokio::test]
async fn scenario_e_logs_that_cannot_be_read_hold_the_restart_back_two_polls_then_not_at_all() {
    let mut w = World::new(|_| {});
    w.runtime.fail_logs(true);
    w.beat("trainer-0", "processing", "step-1").await;
    // Due at 330 s: the logs fail there and at 345 s.
    w.run_until(Duration::from_secs(345)).await;
    assert_eq!(w.runtime.restarts("c1"), 0, "the logs get their retries");
    assert_eq!(w.breaker().await, 0, "breaker untouched");
    assert!(w.get(&w.keys.lock()).await.is_none(), "lock released");
    let aborted = |d: &[String]| d.iter().filter(|x| *x == "aborted-logs-failed").count();
    let d = w.decisions().await;
    assert_eq!(aborted(&d), 1, "once per incident, not per cycle: {d:?}");
    let failed = w.sink.of(AlertKind::LogsFailed);
    assert_eq!(failed.len(), 1);
    let said = &failed[0].detail;
    assert!(said.contains("without the logs once they have failed for 30s"), "{said}");
    w.tick().await; // 360 s: two polls after the first failure
    assert_eq!(w.runtime.restarts("c1"), 1, "restarted without its logs");
    assert_eq!(w.breaker().await, 1);
    let restarting = w.sink.of(AlertKind::Restarting);
    assert_eq!(restarting.len(), 1, "{:?}", w.sink.kinds());
    assert_eq!(restarting[0].logs, None);
    let said = &restarting[0].detail;
    assert!(
        said.contains("without its logs: they could not be read for 30s")
            && said.contains("log driver none"),
        "says the logs could not be read, and why: {said}"
    );
    let d = w.decisions().await;
    assert_eq!(aborted(&d), 1, "{d:?}");
    assert!(d.contains(&"restarted".to_string()), "{d:?}");
    assert_eq!(w.sink.count(AlertKind::LogsFailed), 1);
}

/// Logs that come back before the bound are attached as ever: the failure held the restart back
/// one cycle and no longer.
#[tokio::test]
async fn logs_readable_again_before_the_bound_go_with_the_restart() {
    let mut w = World::new(|_| {});
    w.runtime.fail_logs(true);
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(330)).await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    w.runtime.fail_logs(false);
    w.tick().await;
    assert_eq!(w.runtime.restarts("c1"), 1, "retried on the next cycle");
    assert_eq!(w.breaker().await, 1);
    let restarting = w.sink.of(AlertKind::Restarting);
    assert!(restarting[0].logs.as_deref().unwrap().contains("step 42"));
}

/// The bound is the incident's: a restart that failed after its logs did is retried after its
/// backoff without waiting for the logs again, and the trail still says the failure once.
#[tokio::test]
async fn a_retry_does_not_wait_again_for_logs_that_failed_past_the_bound() {
    let mut w = World::new(|_| {});
    w.runtime.fail_logs(true);
    w.runtime.fail_next_restarts(1);
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(360)).await;
    assert_eq!(w.sink.count(AlertKind::RestartFailed), 1, "{:?}", w.sink.kinds());
    // One stop grace (30 s) later, at 390 s.
    w.tick().await;
    w.tick().await;
    assert_eq!(w.runtime.restarts("c1"), 1, "retried without the logs: {:?}", w.sink.kinds());
    let restarting = w.sink.of(AlertKind::Restarting);
    assert_eq!(restarting.len(), 2, "the released dedup key lets the retry alert");
    assert!(restarting.iter().all(|a| a.logs.is_none() && a.detail.contains("without its logs")));
    let d = w.decisions().await;
    assert_eq!(d.iter().filter(|x| *x == "aborted-logs-failed").count(), 1, "{d:?}");
}

#[tokio::test]
async fn scenario_f_still_hung_after_escalate_after_pages_exactly_once() {
    let mut w = World::new(|_| {});
    hung_and_restarted(&mut w).await;
    // Cooldown (10 min) = escalate_after (10 min); the second restart would come ~3.5 min later.
    w.run_for(mins(13)).await;
    let pages = w.sink.of(AlertKind::Escalation);
    assert_eq!(pages.len(), 1, "{:?}", w.sink.kinds());
    assert!(pages[0].page, "escalations are pages");
    assert!(w.decisions().await.contains(&"escalated".to_string()));
}

#[tokio::test]
async fn recovery_after_restart_never_escalates() {
    let mut w = World::new(|_| {});
    hung_and_restarted(&mut w).await;
    w.run_for(mins(2)).await;
    w.beat("trainer-0", "processing", "step-2").await;
    w.beat_and_tick(80, "processing", "step-2").await;
    assert_eq!(w.sink.count(AlertKind::Escalation), 0);
    assert!(w.get(&w.keys.restarted("trainer-0")).await.is_none());
}

#[tokio::test]
async fn the_incidents_end_resolves_its_alerts_in_the_sinks() {
    let mut w = World::new(|_| {});
    hung_and_restarted(&mut w).await;
    assert!(w.sink.count(AlertKind::Hung) >= 1);
    let resolved = w.sink.resolved();
    assert!(
        !resolved.contains(&("trainer-0".into(), Resolve::Recovered)),
        "not recovered yet: {resolved:?}"
    );
    w.run_for(mins(2)).await;
    w.beat("trainer-0", "processing", "step-2").await;
    w.beat_and_tick(80, "processing", "step-2").await;
    let resolved = w.sink.resolved();
    assert!(
        resolved.contains(&("trainer-0".into(), Resolve::Recovered)),
        "healthy after our restart: the incident's alerts resolve: {resolved:?}"
    );
    assert!(!resolved.contains(&("trainer-0".into(), Resolve::Gone)));
}

#[tokio::test]
async fn a_removed_workers_open_alerts_resolve() {
    let mut w = World::new(|_| {});
    w.run_for(mins(60)).await;
    assert_eq!(w.sink.count(AlertKind::Unreachable), 1);
    assert!(!w.sink.resolved().contains(&("trainer-0".into(), Resolve::Gone)));
    w.runtime.remove("c1");
    w.tick().await;
    assert!(
        w.sink.resolved().contains(&("trainer-0".into(), Resolve::Gone)),
        "its container is gone: {:?}",
        w.sink.resolved()
    );
}

#[tokio::test]
async fn scenario_g_failed_restart_pages_at_once_and_retries_next_cycle() {
    let mut w = World::new(|_| {});
    w.runtime.fail_next_restarts(1);
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(330)).await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    let failed = w.sink.of(AlertKind::RestartFailed);
    assert_eq!(failed.len(), 1);
    assert!(failed[0].page);
    assert!(
        failed[0].detail.contains("the restart call failed")
            && failed[0].detail.contains("device or resource busy")
            && failed[0].detail.contains("its start time did not change"),
        "says what was observed: {}",
        failed[0].detail
    );
    assert!(
        w.get(&w.keys.cooldown("trainer-0")).await.is_none(),
        "no cooldown for a restart that did not happen"
    );
    // NB: not the next cycle (15 s later): a worker that ignores SIGTERM takes the whole stop
    // grace (30 s) to stop, and each try takes a breaker unit.
    w.tick().await;
    assert_eq!(w.runtime.restarts("c1"), 0, "no retry before the stop grace");
    assert_eq!(w.breaker().await, 1);
    w.tick().await;
    assert_eq!(w.runtime.restarts("c1"), 1, "retried once the stop grace passed");
    assert_eq!(
        w.sink.count(AlertKind::Restarting),
        2,
        "the released dedup key lets the retry alert"
    );
}

#[tokio::test]
async fn failed_restarts_back_off_and_page_once_per_incident() {
    // NB: about the backoff; with the default limit the third try, after two failed ones,
    // would be refused as fruitless (`restarts_that_bring_no_progress_stop_after_two`).
    let mut w = World::new(|c| c.policy.max_fruitless_restarts = 0);
    w.runtime.fail_next_restarts(2);
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(330)).await;
    assert_eq!(w.sink.count(AlertKind::RestartFailed), 1);
    // The second try comes one stop grace (30 s) after the first, and fails too.
    w.tick().await;
    w.tick().await;
    assert_eq!(w.sink.count(AlertKind::RestartFailed), 2);
    assert_eq!(w.breaker().await, 2);
    // The third waits twice as long (60 s): not after 45 s, then after 60 s, and it works.
    for _ in 0..3 {
        w.tick().await;
    }
    assert_eq!(w.runtime.restarts("c1"), 0, "backed off: {:?}", w.sink.kinds());
    assert_eq!(w.breaker().await, 2, "no unit taken while backing off");
    w.tick().await;
    assert_eq!(w.runtime.restarts("c1"), 1);
    assert_eq!(w.breaker().await, 3);

    let failed = w.sink.of(AlertKind::RestartFailed);
    assert_eq!(failed.len(), 2, "{:?}", w.sink.kinds());
    assert!(failed[0].page && !failed[0].update, "the first failure pages");
    assert!(
        !failed[1].page && failed[1].update,
        "the second updates the page without paging again"
    );
    assert_eq!(failed[0].incident, failed[1].incident, "one incident");
    assert_eq!((failed[0].attempt, failed[1].attempt), (Some(1), Some(2)));
    assert!(failed[1].detail.contains("retried in 1m"), "{}", failed[1].detail);
    let trail = w.decisions().await;
    assert_eq!(trail.iter().filter(|d| *d == "restart-failed").count(), 2, "{trail:?}");
    assert_eq!(trail.iter().filter(|d| *d == "restarted").count(), 1);
}

#[tokio::test]
async fn scenario_h_missing_record_alerts_once_and_never_restarts() {
    let mut w = World::new(|_| {});
    w.run_for(mins(60)).await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    assert_eq!(w.sink.count(AlertKind::Unreachable), 1);
    // It comes back: the episode closes, and a new disappearance alerts again.
    w.beat("trainer-0", "idle", "").await;
    w.tick().await;
    w.store.del(&[w.keys.status("trainer-0")]).await.unwrap();
    w.tick().await;
    assert_eq!(w.sink.count(AlertKind::Unreachable), 2);
    assert!(
        w.sink.resolved().contains(&("trainer-0".into(), Resolve::Episode(AlertKind::Unreachable))),
        "the episode's end resolves its alert: {:?}",
        w.sink.resolved()
    );
}

#[tokio::test]
async fn scenario_i_frozen_progress_with_fresh_heartbeat_alerts_only() {
    let mut w = World::new(|_| {});
    w.beat_and_tick(60 * 4, "processing", "step-100").await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    assert_eq!(w.sink.count(AlertKind::Stalled), 1);
    assert!(w.get(&w.keys.incident("trainer-0")).await.is_none());
}

#[tokio::test]
async fn scenario_j_errored_for_error_for_restarts_through_the_same_breaker() {
    let mut w = World::new(|_| {});
    w.beat_and_tick(29 * 4, "error", "step-1").await;
    assert_eq!(w.runtime.restarts("c1"), 0, "not before error_for");
    w.beat_and_tick(8, "error", "step-1").await;
    assert_eq!(w.runtime.restarts("c1"), 1);
    assert_eq!(w.breaker().await, 1, "the same per-node breaker");
    assert_eq!(w.sink.count(AlertKind::Errored), 1);
}

#[tokio::test]
async fn errored_worker_is_blocked_by_a_breaker_that_hangs_filled() {
    let mut w = World::new(|_| {});
    let day = utc_day(w.now());
    w.store.set(&w.keys.breaker(&day), "3", Duration::from_secs(3600)).await.unwrap();
    w.beat_and_tick(40 * 4, "error", "step-1").await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    assert_eq!(w.sink.count(AlertKind::BreakerOpen), 1);
}

/// A cap's alert is node-wide (docs/alerts.md): no worker, container, job or gang. The end of
/// the incident it refused must not resolve it (the sinks that keep alerts open resolve by
/// worker): the cap still refuses the node's other workers, and its page key allows no second.
async fn a_caps_alert_is_node_wide(mut w: World, kind: AlertKind) {
    // Hung: confirmed at 150 s; the cap refuses its restart when the delay ends (330 s).
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(450)).await;
    assert_eq!(w.runtime.restarts("c1"), 0, "refused by the cap");
    let sent = w.sink.of(kind);
    assert_eq!(sent.len(), 1, "{:?}", w.sink.kinds());
    let a = &sent[0];
    assert_eq!(a.worker, None, "node-wide: {}", a.summary());
    assert!(a.container.is_none() && a.job.is_none() && a.gang.is_none(), "{}", a.summary());
    // The worker recovers: its incident ends and its own alerts resolve, not the cap's.
    w.beat_and_tick(4, "processing", "step-2").await;
    let resolved = w.sink.resolved();
    assert!(resolved.contains(&("trainer-0".into(), Resolve::Recovered)), "{resolved:?}");
    let ends_it = |(worker, _): &(String, Resolve)| a.worker.as_ref() == Some(worker);
    assert!(!resolved.iter().any(ends_it), "the cap's alert stays open: {resolved:?}");
}

#[tokio::test]
async fn the_breakers_alert_is_node_wide_and_outlives_the_incident_it_refused() {
    let w = World::new(|_| {});
    let day = utc_day(w.now());
    w.store.set(&w.keys.breaker(&day), "3", Duration::from_secs(3600)).await.unwrap();
    a_caps_alert_is_node_wide(w, AlertKind::BreakerOpen).await;
}

#[tokio::test]
async fn the_fleet_budgets_alert_is_node_wide_and_outlives_the_incident_it_refused() {
    let w = World::new(|c| {
        c.safety.fleet_budget = 1;
        c.safety.fleet_window = mins(60);
    });
    // This window's one unit, spent by another node.
    let window = w.now().div_euclid(mins(60).as_millis() as Millis);
    w.store.set(&w.keys.fleet_budget(window), "1", mins(120)).await.unwrap();
    a_caps_alert_is_node_wide(w, AlertKind::BudgetExhausted).await;
}

#[tokio::test]
async fn scenario_k_fleet_budget_exhausted_stops_restarts_everywhere_with_one_alert() {
    let mut w = World::new(|c| c.safety.fleet_budget = 1);
    // A second node with its own agent and hung worker, same fleet.
    let cfg2 = config("gpu-2", |c| c.safety.fleet_budget = 1);
    w.add_agent(cfg2.clone());
    let keys2 = Keys::new("vigil", "gpu-2");
    // Both agents share the fake runtime; give node 2 its own container.
    w.runtime.add("c2", "trainer-9");
    w.beat("trainer-0", "processing", "step-1").await;
    write_record(w.store.as_ref(), &keys2.status("trainer-9"), "processing", w.now(), &[]).await;
    w.run_for(mins(20)).await;
    let total = w.runtime.restarts("c1") + w.runtime.restarts("c2");
    assert_eq!(total, 1, "one restart in the whole fleet this window");
    assert_eq!(w.sink.count(AlertKind::BudgetExhausted), 1, "one alert, fleet-wide");
    // The node that was refused did not keep a breaker unit it never used.
    let day = utc_day(w.now());
    let b1 = w.store.counter(&w.keys.breaker(&day)).await.unwrap();
    let b2 = w.store.counter(&keys2.breaker(&day)).await.unwrap();
    assert_eq!(b1 + b2, 1);
    // Every agent says so, for the fleet-budget alert rule.
    for a in w.agents().iter() {
        let text = a.metrics().encode();
        for want in [
            "vigil_fleet_budget_used 1",
            "vigil_fleet_budget_limit 1",
            "vigil_fleet_budget_exhausted 1",
        ] {
            assert!(common::has_sample(&text, want), "{want} missing from\n{text}");
        }
    }
}

/// One cycle of node 0's agent with the coordinator down or up, its worker beating: a cycle
/// that fails closed exactly when the coordinator is down, and the gauge that says so at once.
async fn coordinator_cycle(f: &mut Fleet, down: bool) {
    f.down.store(down, Ordering::SeqCst);
    let now = f.now();
    let step = now.to_string();
    f.write(0, "trainer-0", "processing", now, &[("progress", step.as_str())]).await;
    let report = f.tick().await.remove(0);
    assert_eq!(report.coordinator_error.is_some(), down);
    let text = f.nodes[0].metrics.encode();
    let up = common::has_sample(&text, "vigil_coordinator_up 1");
    assert_eq!(up, !down, "the gauge moves at once");
}

/// One failed cycle alone is a blip (a command that timed out once, a failover's moment): the
/// cycle fails closed and no `coordinator-down` goes out. One that starts within three poll
/// intervals, a minute at least, of the last failure is an outage, said once — a coordinator that
/// fails every other cycle is down, not blipping.
#[tokio::test(start_paused = true)]
async fn a_failed_cycle_alone_is_a_blip_and_one_failing_every_other_cycle_is_down() {
    let mut f = Fleet::builder().poll(Duration::from_secs(15)).build();
    f.nodes[0].runtime.add("c0", "trainer-0");
    // Blips ninety seconds apart (past three poll intervals, and the minute): nothing said.
    for _ in 0..3 {
        coordinator_cycle(&mut f, true).await;
        coordinator_cycle(&mut f, false).await;
        tokio::time::advance(Duration::from_secs(90)).await;
    }
    assert_eq!(f.sink.count(AlertKind::CoordinatorDown), 0, "blips only");
    // Fifty seconds after the last (past three poll intervals, within the minute): down.
    coordinator_cycle(&mut f, true).await;
    coordinator_cycle(&mut f, false).await;
    tokio::time::advance(Duration::from_secs(50)).await;
    coordinator_cycle(&mut f, true).await;
    assert_eq!(f.sink.count(AlertKind::CoordinatorDown), 1, "an outage");
    // Failing every other cycle from then on: the same outage, said once.
    for _ in 0..6 {
        coordinator_cycle(&mut f, false).await;
        tokio::time::advance(Duration::from_secs(15)).await;
        coordinator_cycle(&mut f, true).await;
    }
    assert_eq!(f.sink.count(AlertKind::CoordinatorDown), 1, "once");
    assert_eq!(f.nodes[0].runtime.restarts("c0"), 0);
}

/// A coordinator blip during a runtime outage: the next cycle cannot list the workers, yet its
/// writes go through, so the gauge says the coordinator is back (left at 0, Prometheus's
/// `VigilCoordinatorDown` fired for a healthy Redis until the runtime returned).
#[tokio::test(start_paused = true)]
async fn the_coordinator_comes_back_during_a_runtime_outage() {
    let mut f = Fleet::builder().poll(Duration::from_secs(15)).build();
    f.nodes[0].runtime.add("c0", "trainer-0");
    coordinator_cycle(&mut f, false).await;
    f.nodes[0].runtime.set_down(true);
    f.down.store(true, Ordering::SeqCst);
    let report = f.tick().await.remove(0);
    assert!(report.runtime_error.is_some() && report.coordinator_error.is_some());
    f.down.store(false, Ordering::SeqCst);
    let since = written_in_the_outage(&mut f).await;
    assert_eq!(since, f.now(), "down since the first cycle that wrote it");
    written_in_the_outage(&mut f).await;
    assert!(common::has_sample(&f.nodes[0].metrics.encode(), "vigil_runtime_up 0"));
    assert_eq!(f.sink.count(AlertKind::CoordinatorDown), 0, "one blip");
    assert_eq!(f.sink.count(AlertKind::RuntimeDown), 1);
    // An agent started in the outage writes too: its predecessor's workers, the gauge at 1.
    f.restart_agents(0);
    assert_eq!(written_in_the_outage(&mut f).await, since, "its predecessor's");
    // The runtime is back: the record says so, with the workers as they are.
    f.nodes[0].runtime.set_down(false);
    tokio::time::advance(Duration::from_secs(15)).await;
    assert_eq!(f.tick().await.remove(0).runtime_error, None);
    let record = f.store.hgetall(&f.nodes[0].keys.agent()).await.unwrap();
    assert_eq!(record["runtime_down"], "");
}

/// One cycle of node 0 in a runtime outage, its coordinator up: the cycle goes through at the
/// coordinator (the gauge at 1), and the record it writes is stamped now, with the workers as
/// the runtime last showed them and since when the runtime is down (returned).
async fn written_in_the_outage(f: &mut Fleet) -> Millis {
    tokio::time::advance(Duration::from_secs(15)).await;
    let report = f.tick().await.remove(0);
    assert!(report.runtime_error.is_some() && report.coordinator_error.is_none());
    let text = f.nodes[0].metrics.encode();
    assert!(common::has_sample(&text, "vigil_coordinator_up 1"), "{text}");
    let record = f.store.hgetall(&f.nodes[0].keys.agent()).await.unwrap();
    assert_eq!(record["updated_at"], f.now().to_string());
    assert_eq!(record["workers"], r#"{"trainer-0":"healthy"}"#);
    record["runtime_down"].parse().expect("the runtime is down")
}

#[tokio::test]
async fn scenario_l_coordinator_down_mid_incident_fails_closed_and_resumes_the_same_timer() {
    let mut w = World::new(|_| {});
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(200)).await;
    let timer = w.get(&w.keys.incident("trainer-0")).await.expect("timer started");
    w.down.store(true, Ordering::SeqCst);
    w.run_until(Duration::from_secs(600)).await;
    assert_eq!(w.runtime.restarts("c1"), 0, "no lock, no breaker, no restart");
    assert_eq!(w.sink.count(AlertKind::CoordinatorDown), 1, "said once per outage");
    w.down.store(false, Ordering::SeqCst);
    assert_eq!(w.get(&w.keys.incident("trainer-0")).await, Some(timer.clone()));
    w.tick().await;
    assert_eq!(w.runtime.restarts("c1"), 1, "the incident resumes with its original start time");
    let restarted = w.store.read_recent(&w.keys.trail(), 1).await.unwrap();
    let incident_id = timer.split_once(':').unwrap().1;
    assert_eq!(restarted[0].1["incident"], incident_id);
}

#[tokio::test]
async fn dry_run_decides_everything_but_never_restarts() {
    let mut w = World::new(|c| c.dry_run = true);
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(345)).await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    let would = w.sink.of(AlertKind::WouldRestart);
    assert_eq!(would.len(), 1);
    assert!(would[0].summary().contains("would restart"), "{}", would[0].summary());
    assert!(w.decisions().await.contains(&"would-restart".to_string()));
    assert_eq!(w.breaker().await, 0, "observe mode consumes no budget");
    assert!(w.get(&w.keys.cooldown("trainer-0")).await.is_some());
}

#[tokio::test]
async fn another_holder_of_the_lock_means_skip() {
    let mut w = World::new(|_| {});
    w.store.set(&w.keys.lock(), "someone-else", Duration::from_secs(3600)).await.unwrap();
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(600)).await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    let d = w.decisions().await;
    assert_eq!(d.iter().filter(|x| *x == "skipped-lock-held").count(), 1, "{d:?}");
    assert_eq!(
        w.get(&w.keys.lock()).await.as_deref(),
        Some("someone-else"),
        "never released by a non-owner"
    );
}

#[tokio::test]
async fn a_new_incarnation_is_never_hit_by_a_stale_decision() {
    let mut w = World::new(|_| {});
    // The container is replaced (same id, new start) while logs are collected.
    let rt = w.runtime.clone();
    w.runtime.on_logs(move || rt.add("c1", "trainer-0"));
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(330)).await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    assert!(w.decisions().await.contains(&"skipped-container-changed".to_string()));
    assert_eq!(w.breaker().await, 0);
}

#[tokio::test]
async fn two_containers_with_one_worker_id_are_never_restarted() {
    let mut w = World::new(|_| {});
    w.runtime.add("c9", "trainer-0");
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_for(mins(30)).await;
    assert_eq!(w.runtime.restarts("c1") + w.runtime.restarts("c9"), 0);
    assert_eq!(w.sink.count(AlertKind::Ambiguous), 1);
    // One of them goes: the page is resolved (a sink that keeps alerts open stops re-posting).
    let ended = ("trainer-0".to_string(), Resolve::Episode(AlertKind::Ambiguous));
    assert!(!w.sink.resolved().contains(&ended));
    w.runtime.remove("c9");
    w.tick().await;
    assert!(w.sink.resolved().contains(&ended), "{:?}", w.sink.resolved());
}

/// Both containers of an ambiguous id go at once: the episode is over, so the id carried twice
/// again later is alerted again (it once stayed marked as said for the day).
#[tokio::test]
async fn an_ambiguity_that_went_with_both_containers_is_alerted_again_when_it_returns() {
    let mut w = World::new(|_| {});
    w.runtime.add("c9", "trainer-0");
    w.tick().await;
    assert_eq!(w.sink.count(AlertKind::Ambiguous), 1);
    w.runtime.remove("c1");
    w.runtime.remove("c9");
    w.tick().await;
    w.runtime.add("c1", "trainer-0");
    w.runtime.add("c9", "trainer-0");
    w.tick().await;
    assert_eq!(w.sink.count(AlertKind::Ambiguous), 2, "a new episode");
}

#[tokio::test]
async fn runtime_down_is_an_alert_not_a_crash() {
    let mut w = World::new(|_| {});
    w.runtime.set_down(true);
    w.run_for(mins(5)).await;
    assert_eq!(w.sink.count(AlertKind::RuntimeDown), 1);
    w.runtime.set_down(false);
    let r = w.tick().await;
    assert!(r[0].runtime_error.is_none());
}

#[tokio::test]
async fn a_restart_outside_vigil_counts_as_booting() {
    let mut w = World::new(|_| {});
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(200)).await;
    assert!(w.get(&w.keys.incident("trainer-0")).await.is_some());
    // An operator runs `docker restart` in the middle of the delay.
    w.runtime.add("c1", "trainer-0");
    w.run_until(Duration::from_secs(200) + mins(9)).await;
    assert_eq!(w.runtime.restarts("c1"), 0, "the booting container is left alone");
    assert!(w.decisions().await.contains(&"external-restart".to_string()));
}

#[tokio::test]
async fn a_restart_whose_reply_was_lost_is_still_a_restart() {
    let mut w = World::new(|_| {});
    w.runtime.lose_next_restart_replies(1);
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(330)).await;
    assert_eq!(w.runtime.restarts("c1"), 1);
    assert!(w.get(&w.keys.cooldown("trainer-0")).await.is_some(), "cooldown kept");
    w.run_for(mins(5)).await;
    assert_eq!(w.runtime.restarts("c1"), 1, "the booting container is not restarted again");
    assert_eq!(w.sink.count(AlertKind::RestartFailed), 0);
}

#[tokio::test]
async fn the_error_clock_restarts_after_our_restart() {
    let mut w = World::new(|_| {});
    w.beat_and_tick(31 * 4, "error", "step-1").await;
    assert_eq!(w.runtime.restarts("c1"), 1);
    // Still `error` after the cooldown: a new error_for must pass, not an instant restart.
    w.beat_and_tick(25 * 4, "error", "step-1").await;
    assert_eq!(w.runtime.restarts("c1"), 1, "{:?}", w.decisions().await);
    w.beat_and_tick(20 * 4, "error", "step-1").await;
    assert_eq!(w.runtime.restarts("c1"), 2);
}

#[tokio::test]
async fn observe_mode_never_pages_an_escalation() {
    let mut w = World::new(|c| c.dry_run = true);
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_for(mins(60)).await;
    assert_eq!(w.sink.count(AlertKind::Escalation), 0);
    assert!(w.sink.count(AlertKind::WouldRestart) >= 1);
    assert_eq!(w.runtime.restarts("c1"), 0);
}

/// An operator's `docker restart` inside our cooldown starts a new incarnation, which boots just
/// like ours: it gets a whole cooldown of its own, not what was left of ours.
#[tokio::test]
async fn an_operator_restart_inside_our_cooldown_gets_a_full_cooldown() {
    let mut w = World::new(|_| {});
    hung_and_restarted(&mut w).await; // restarted at t = 330 s; our cooldown runs to 930 s
    w.run_until(Duration::from_secs(630)).await;
    w.runtime.add("c1", "trainer-0"); // the operator's restart at 630 s
    w.run_until(Duration::from_secs(1000)).await;
    let r = w.tick().await;
    assert_eq!(
        r[0].verdicts[0].1,
        Verdict::Booting,
        "still booting past our cooldown's end: the new incarnation's own cooldown runs to 1230 s"
    );
    assert_eq!(w.runtime.restarts("c1"), 1, "ours only");
    assert!(w.decisions().await.contains(&"external-restart".to_string()));
    w.run_until(Duration::from_secs(1245)).await;
    let r = w.tick().await;
    assert_ne!(r[0].verdicts[0].1, Verdict::Booting, "and then it ends");
}

/// Our own restart is not taken for an operator's: its cooldown is not renewed.
#[tokio::test]
async fn our_own_restart_keeps_its_cooldown() {
    let mut w = World::new(|_| {});
    hung_and_restarted(&mut w).await; // at 330 s
    w.run_until(Duration::from_secs(935)).await;
    let r = w.tick().await;
    assert_ne!(r[0].verdicts[0].1, Verdict::Booting, "ten minutes, not more");
    assert!(!w.decisions().await.contains(&"external-restart".to_string()));
}

/// A paused worker is an operator's decision: one alert, no timer, no restart while paused;
/// once it runs again, a hang is a new incident with its own delay.
#[tokio::test]
async fn a_paused_worker_is_alerted_once_and_never_restarted() {
    let mut w = World::new(|_| {});
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(60)).await;
    w.runtime.set_paused("c1", true);
    w.run_until(mins(30)).await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    assert_eq!(w.sink.count(AlertKind::Paused), 1, "once per episode");
    assert!(w.get(&w.keys.incident("trainer-0")).await.is_none(), "no timer");
    w.runtime.set_paused("c1", false);
    // Still stale once unpaused: suspect, confirmed, then the full restart delay.
    w.run_for(Duration::from_secs(150)).await;
    assert_eq!(w.runtime.restarts("c1"), 0, "a new incident waits its delay");
    w.run_for(Duration::from_secs(200)).await;
    assert_eq!(w.runtime.restarts("c1"), 1);
}

/// A label value that is not a worker id (here with a `:`, which would be read into Redis key
/// names) makes no worker: one alert, never evaluated, never restarted; the others go on.
#[tokio::test]
async fn an_invalid_worker_id_is_one_alert_and_never_a_worker() {
    let mut w = World::new(|_| {});
    w.runtime.add("c9", "trainer-0:incarnation");
    hung_and_restarted(&mut w).await;
    w.run_for(mins(5)).await;
    assert_eq!(w.sink.count(AlertKind::InvalidWorkerId), 1, "once per container");
    assert_eq!(w.runtime.restarts("c9"), 0);
    let r = w.tick().await;
    assert!(r[0].verdicts.iter().all(|(worker, _)| worker == "trainer-0"), "{:?}", r[0].verdicts);
}

/// A worker that writes milliseconds where seconds belong looks fresh for ever unless its
/// record is taken for invalid: unreachable, one alert that says what is wrong.
#[tokio::test]
async fn a_heartbeat_from_the_future_is_one_alert_that_says_why() {
    let mut w = World::new(|_| {});
    write_record(w.store.as_ref(), &w.keys.status("trainer-0"), "processing", w.now() * 1000, &[])
        .await;
    let r = w.tick().await;
    assert_eq!(r[0].verdicts[0].1, Verdict::Unreachable);
    w.run_for(mins(10)).await;
    let alerts = w.sink.of(AlertKind::Unreachable);
    assert_eq!(alerts.len(), 1, "once per episode");
    assert!(alerts[0].detail.contains("ahead of the coordinator's clock"), "{}", alerts[0].detail);
    assert_eq!(w.runtime.restarts("c1"), 0);
}

/// Two agents on one node (a rolling update): one `ambiguous` alert and one trail entry per
/// episode for the node, not one per agent.
#[tokio::test]
async fn two_agents_report_an_ambiguous_worker_once_for_the_node() {
    let mut w = World::with_agents(2, |_| {});
    w.runtime.add("c2", "trainer-0");
    w.run_for(mins(5)).await;
    assert_eq!(w.sink.count(AlertKind::Ambiguous), 1, "once per node");
    let d = w.decisions().await;
    assert_eq!(d.iter().filter(|x| *x == "skipped-ambiguous").count(), 1, "{d:?}");
    assert_eq!(w.runtime.restarts("c1") + w.runtime.restarts("c2"), 0);
}

/// A worker whose container exited (and nothing replaced it) is reported once, never started;
/// an old exited container next to its running replacement is no second claim on the worker.
#[tokio::test]
async fn an_exited_worker_is_reported_once_and_never_started() {
    let mut w = World::new(|_| {});
    w.beat("trainer-0", "processing", "step-1").await;
    w.runtime.stop("c1");
    w.run_for(mins(20)).await;
    assert_eq!(w.sink.count(AlertKind::Exited), 1, "once per episode");
    assert_eq!(w.runtime.restarts("c1"), 0);
    // A replacement container starts (the old one stays, exited): it is the worker now.
    w.runtime.add("c2", "trainer-0");
    w.beat("trainer-0", "processing", "step-2").await;
    let r = w.tick().await;
    assert_eq!(
        r[0].verdicts,
        vec![("trainer-0".to_string(), Verdict::Booting)],
        "one worker, its new incarnation booting"
    );
    assert_eq!(w.sink.count(AlertKind::Ambiguous), 0, "history is not a second claim");
}

#[tokio::test]
async fn a_restart_after_which_the_container_exits_again_says_so() {
    let mut w = World::new(|_| {});
    w.runtime.exit_after_next_restarts(1);
    w.beat("trainer-0", "processing", "step-1").await;
    w.run_until(Duration::from_secs(330)).await;
    assert_eq!(w.runtime.restarts("c1"), 1);
    let failed = w.sink.of(AlertKind::RestartFailed);
    assert_eq!(failed.len(), 1, "{:?}", w.sink.kinds());
    assert!(
        failed[0].detail.contains(
            "the restart call returned, but the container started again and exited at once"
        ),
        "{}",
        failed[0].detail
    );
    w.run_for(mins(15)).await;
    assert_eq!(w.runtime.restarts("c1"), 1, "an exited container is never started by Vigil");
    assert_eq!(w.sink.count(AlertKind::Exited), 1, "reported once");
}

/// An agent died after claiming a restart (its cooldown marker names the incarnation) and
/// before recording the outcome; the runtime carried the command out. The next agent finds the
/// new incarnation, records the restart in the trail, and gives it a full cooldown.
#[tokio::test]
async fn a_restart_whose_agent_died_mid_command_is_found_by_the_next_agent() {
    let mut w = World::new(|_| {});
    w.beat("trainer-0", "processing", "step-1").await;
    w.tick().await;
    let before = format!("c1:{}", w.runtime.started_at("c1"));
    // What the dead agent left: its claim, and the restart that ran without it.
    let claim = format!("{}:inc-1:{before}", w.now());
    w.store.set(&w.keys.cooldown("trainer-0"), &claim, mins(10)).await.unwrap();
    w.runtime.restart_externally("c1");
    w.tick().await;
    let entries = w.store.read_recent(&w.keys.trail(), 100).await.unwrap();
    let found = entries
        .iter()
        .find(|(_, f)| f["decision"] == "restarted")
        .map(|(_, f)| f["detail"].clone())
        .expect("the restart is in the trail");
    assert!(found.contains("did not record its outcome"), "{found}");
    let marker = w.get(&w.keys.cooldown("trainer-0")).await.unwrap();
    assert!(marker.ends_with(":external"), "a full cooldown of its own: {marker}");
    w.run_for(mins(9)).await;
    assert_eq!(w.runtime.restarts("c1"), 0, "booting, left alone");
}

/// Issue 19: a worker whose restarts belong to another controller (JobSet, Pathways, an
/// operator) says so — here in its record, `restarts = alert-only` — and its hang is alerted,
/// recorded once (`skipped-alert-only`) and never restarted: no lock, no breaker unit.
#[tokio::test]
async fn an_alert_only_worker_is_reported_and_never_restarted() {
    let mut w = World::new(|_| {});
    write_record(
        w.store.as_ref(),
        &w.keys.status("trainer-0"),
        "processing",
        w.now(),
        &[("job", "job-7"), ("restarts", "alert-only")],
    )
    .await;
    w.run_for(mins(30)).await;
    assert_eq!(w.runtime.restarts("c1"), 0);
    assert_eq!(w.breaker().await, 0, "no breaker unit spent");
    let hung = w.sink.of(AlertKind::Hung);
    assert_eq!(hung.len(), 1, "one alert for the incident");
    assert!(hung[0].detail.contains("alert only"), "{}", hung[0].detail);
    let d = w.decisions().await;
    assert_eq!(d.iter().filter(|x| *x == "skipped-alert-only").count(), 1, "{d:?}");
    assert!(!d.iter().any(|x| x == "restarted" || x == "would-restart"), "{d:?}");
}

/// Tick (no beat: the worker is hung) until `trainer-0` has been restarted `n` times in all,
/// for at most `within`.
async fn hung_until_restarts(w: &mut World, n: usize, within: Duration) -> bool {
    let end = w.now() + within.as_millis() as Millis;
    while w.runtime.restarts("c1") < n && w.now() < end {
        w.tick().await;
    }
    w.runtime.restarts("c1") >= n
}

/// The worker resumes from its checkpoint at step `from` and trains to step `to`, a step a tick.
async fn trains(w: &mut World, from: u64, to: u64) {
    for step in from..=to {
        w.beat("trainer-0", "processing", &format!("step-{step}")).await;
        w.tick().await;
    }
}

/// The worker hangs at step 100, is restarted, resumes from step 90 and hangs at 100 again,
/// twice; then 40 minutes pass (a third restart would have come).
async fn twice_restarted_without_progress(w: &mut World) {
    w.beat("trainer-0", "processing", "step-100").await;
    assert!(hung_until_restarts(w, 1, mins(8)).await);
    trains(w, 90, 100).await;
    assert!(hung_until_restarts(w, 2, mins(8)).await);
    trains(w, 90, 100).await;
    w.run_for(mins(40)).await;
}

/// Issue 31: a worker that resumes from its checkpoint and hangs again at the same step is not
/// restarted a third time: two restarts brought no progress past step 100, one page says so
/// (and the trail), the breaker keeps its last unit. Progress past step 100 ends the run, and
/// the next hang is restarted again.
#[tokio::test]
async fn restarts_that_bring_no_progress_stop_after_two_and_page_once() {
    let mut w = World::new(|_| {});
    twice_restarted_without_progress(&mut w).await;
    assert_eq!(w.runtime.restarts("c1"), 2, "no third restart that cannot help");
    assert_eq!(w.breaker().await, 2, "the breaker's last unit is kept");
    let pages = w.sink.of(AlertKind::Fruitless);
    assert_eq!(pages.len(), 1, "one page: {:?}", w.sink.kinds());
    assert!(pages[0].page);
    assert!(
        pages[0]
            .detail
            .contains("restarts are not helping: 2 restart(s), no progress past step 100 since"),
        "{}",
        pages[0].detail
    );
    let d = w.decisions().await;
    assert_eq!(d.iter().filter(|x| *x == "skipped-fruitless").count(), 1, "{d:?}");
    // It goes on (a person restarted it, or it was slow): step 101 is past where it stopped.
    trains(&mut w, 100, 101).await;
    assert!(w.get(&w.keys.fruitless("trainer-0")).await.is_none(), "the run is over");
    assert!(hung_until_restarts(&mut w, 3, mins(8)).await, "the next hang is restarted");
}

/// A run of fruitless restarts is its job's: a new job started under the same worker id (its
/// record names another `job`), from step 0 within the run's week, is restarted when it hangs —
/// before, it was refused at once, paged as "no progress past step 100" of the old job.
#[tokio::test]
async fn a_new_job_under_the_same_worker_id_is_not_refused_for_the_old_job_s_run() {
    let mut w = World::new(|_| {});
    twice_restarted_without_progress(&mut w).await;
    assert_eq!(w.runtime.restarts("c1"), 2, "the old job's third restart refused");
    assert_eq!(w.sink.count(AlertKind::Fruitless), 1);
    // Another job starts in the same container name: step 0 on, then it hangs at step 20.
    for step in 0..=20 {
        let (key, now) = (w.keys.status("trainer-0"), w.now());
        let progress = format!("step-{step}");
        write_record(
            w.store.as_ref(),
            &key,
            "processing",
            now,
            &[("job", "job-8"), ("progress", &progress)],
        )
        .await;
        w.tick().await;
    }
    assert!(w.get(&w.keys.fruitless("trainer-0")).await.is_none(), "the old job's run is over");
    assert!(hung_until_restarts(&mut w, 3, mins(8)).await, "the new job's hang is restarted");
    assert_eq!(w.sink.count(AlertKind::Fruitless), 1, "{:?}", w.sink.kinds());
    let run = w.get(&w.keys.fruitless("trainer-0")).await.expect("the new job's run");
    assert!(run.ends_with(":20:job-8"), "{run}");
}

/// The fleet simulation's seed 171192 (this issue's sweep): a restart that ran, but that the
/// agent saw fail (its reply lost, the runtime then unreachable for the check), while in the
/// slow runtime's window — past the claim's line, the lock's TTL — the old incarnation beat
/// past where it stopped. Those beats came before the restart: no progress of it. The new incarnation hangs at once: with one fruitless
/// restart allowed, no second restart (those beats ended the run, and it was restarted again).
#[tokio::test]
async fn beats_of_the_old_incarnation_during_a_restart_seen_failed_are_no_progress() {
    let mut w = World::new(|c| c.policy.max_fruitless_restarts = 1);
    let (store, key, clock, rt) =
        (w.store.clone(), w.keys.status("trainer-0"), w.clock.clone(), w.runtime.clone());
    let once = AtomicBool::new(true);
    w.runtime.on_restart(move |_| {
        use vigil::clock::Clock;
        if !once.swap(false, Ordering::SeqCst) {
            return;
        }
        clock.advance(Duration::from_secs(200));
        let fields = [
            ("state".to_string(), "processing".to_string()),
            ("heartbeat".to_string(), heartbeat_value(clock.now())),
            ("progress".to_string(), "step-101".to_string()),
        ];
        futures_block(store.hset(&key, &fields, None)).unwrap();
        rt.set_down(true);
    });
    w.runtime.lose_next_restart_replies(1);
    w.beat("trainer-0", "processing", "step-100").await;
    assert!(hung_until_restarts(&mut w, 1, mins(8)).await);
    assert_eq!(w.sink.count(AlertKind::RestartFailed), 1, "seen failed");
    w.runtime.set_down(false);
    w.run_for(mins(60)).await;
    assert_eq!(w.runtime.restarts("c1"), 1, "no second restart: {:?}", w.decisions().await);
    assert_eq!(w.sink.count(AlertKind::Fruitless), 1, "{:?}", w.sink.kinds());
}

/// A restart that helps (the worker trains past where it stopped) never counts towards the
/// limit, however many hangs a day brings; `max_fruitless_restarts = 0` turns the limit off.
#[tokio::test]
async fn restarts_that_help_are_never_stopped() {
    let mut w = World::new(|c| c.safety.breaker_per_day = 10);
    let mut at = 100;
    w.beat("trainer-0", "processing", &format!("step-{at}")).await;
    for n in 1..=4 {
        assert!(hung_until_restarts(&mut w, n, mins(8)).await, "restart {n}");
        trains(&mut w, at - 5, at + 10).await;
        at += 10;
    }
    assert_eq!(w.sink.count(AlertKind::Fruitless), 0);
    let mut off = World::new(|c| c.policy.max_fruitless_restarts = 0);
    off.beat("trainer-0", "processing", "step-1").await;
    off.run_for(Duration::from_secs(4 * 3600)).await;
    assert_eq!(off.runtime.restarts("c1"), 3, "only the breaker stops it");
    assert_eq!(off.sink.count(AlertKind::Fruitless), 0);
}

/// One look by every agent, `after` the last: the clock moves, each agent runs one cycle.
async fn look(w: &mut World, after: Duration) {
    w.clock.advance(after);
    for a in w.agents().iter_mut() {
        a.cycle().await;
    }
}

/// Issue 31, item 5: a worker that beats every 2 s is found hung 16 s after its last beat with
/// `[policy.learned]` on (8.9 s learned: 4 × its 2 s silences, their bucket's bound; then the
/// confirming look), two minutes sooner than the fixed rule; its restart still waits for the
/// fixed `stale_after` (and `restart_delay`), never cancelled and retried in between. (70
/// looks: an incarnation's first 30 silences only settle it, the next 30 are learned.)
#[tokio::test]
async fn a_learned_rhythm_finds_the_hang_sooner_and_the_restart_still_waits_for_the_fixed_rule() {
    let mut w = World::new(|c| {
        c.policy.learned.enabled = true;
        c.policy.restart_delay = Duration::from_secs(30);
    });
    for _ in 0..70 {
        w.beat("trainer-0", "processing", "step-1").await;
        look(&mut w, Duration::from_secs(2)).await;
    }
    let text = w.agents()[0].metrics().encode();
    assert_eq!(
        sample(&text, "vigil_worker_allowed_silence_seconds{worker=\"trainer-0\"}"),
        Some(8.916),
        "4 × the 2 s silences it came back from\n{text}"
    );
    let last = w.now() - 2_000;
    while w.sink.count(AlertKind::Hung) == 0 && w.now() - last < 60_000 {
        look(&mut w, Duration::from_secs(2)).await;
    }
    assert_eq!(w.now() - last, 16_000, "found hung 16 s after the last beat");
    while w.now() - last <= 120_000 {
        assert_eq!(w.runtime.restarts("c1"), 0, "not before the fixed rule, at {}", w.now() - last);
        look(&mut w, Duration::from_secs(2)).await;
    }
    assert_eq!(w.runtime.restarts("c1"), 1, "restarted once the fixed rule holds");
    let d = w.decisions().await;
    assert!(!d.iter().any(|x| x == "cancelled-recovered"), "{d:?}");
    assert_eq!(d.iter().filter(|x| *x == "timer-started").count(), 1, "{d:?}");
    assert_eq!(w.sink.count(AlertKind::Hung), 1);
}

/// Issue 31, item 5, with two instances on the node that judge differently (one learned, one
/// not: an HA pair, a rolling update, an agent just restarted): one incident, one alert, never
/// closed by the instance whose fixed rule calls the same silence fresh, one restart.
#[tokio::test]
async fn an_instance_that_has_not_learned_never_closes_a_learned_incident() {
    let mut w = World::new(|c| {
        c.policy.learned.enabled = true;
        c.policy.restart_delay = Duration::from_secs(30);
    });
    w.add_agent(config("gpu-1", |c| {
        c.policy.restart_delay = Duration::from_secs(30);
    }));
    for _ in 0..70 {
        w.beat("trainer-0", "processing", "step-1").await;
        look(&mut w, Duration::from_secs(2)).await;
    }
    let last = w.now() - 2_000;
    while w.now() - last <= 130_000 {
        look(&mut w, Duration::from_secs(2)).await;
    }
    assert_eq!(w.runtime.restarts("c1"), 1);
    let d = w.decisions().await;
    assert_eq!(d.iter().filter(|x| *x == "timer-started").count(), 1, "{d:?}");
    assert!(!d.iter().any(|x| x == "recovered" || x == "cancelled-recovered"), "{d:?}");
    assert_eq!(w.sink.count(AlertKind::Hung), 1, "{:?}", w.sink.kinds());
}

/// Issue 46: a worker beating every 2 s for 200 s (its history in the coordinator, written once
/// a minute, past `history`), then hung: with `[policy.learned] restarts = true` it is restarted
/// once its incident persisted for its usual silence (8.9 s: 4 × its 2 s silences), 26 s after
/// its last beat, not after the fixed rule's two minutes.
#[tokio::test]
async fn a_learned_restart_comes_from_the_coordinators_history_within_seconds() {
    let mut w = learning_world();
    let last = learn_then_hang(&mut w).await;
    let restarted = until_restarted(&mut w, last).await;
    assert_eq!(restarted, Some(26_000), "{:?}", w.decisions().await);
    assert_eq!(w.sink.count(AlertKind::Hung), 1);
}

/// Issue 46: the same worker, its history gone from the coordinator while it hangs (lost in a
/// failover, evicted: gone at every look): what this agent learned in its own memory restarts
/// nothing sooner — the fixed rule does, as without learning. (The agent writes what it learned
/// back within a minute; from then on it is the shared copy again.)
#[tokio::test]
async fn a_learned_restart_never_stands_on_one_agents_memory() {
    let mut w = learning_world();
    let last = learn_then_hang(&mut w).await;
    let key = w.keys.rhythm("trainer-0");
    assert!(w.get(&key).await.is_some(), "the history was written");
    let mut restarted = None;
    while restarted.is_none() && w.now() - last < 180_000 {
        w.store.del(std::slice::from_ref(&key)).await.unwrap();
        look(&mut w, Duration::from_secs(2)).await;
        restarted = (w.runtime.restarts("c1") > 0).then(|| w.now() - last);
    }
    assert!(restarted.is_some_and(|t| t > 120_000), "by the fixed rule: {restarted:?}");
}

fn learning_world() -> World {
    World::new(|c| {
        c.policy.learned.enabled = true;
        c.policy.learned.restarts = true;
        c.policy.learned.history = Duration::from_secs(60);
        c.policy.restart_delay = Duration::from_secs(30);
    })
}

/// 100 beats 2 s apart (the first 30 settle the incarnation, the rest are learned and written
/// at 62 s, 122 s and 182 s), then silence; the last beat's time.
async fn learn_then_hang(w: &mut World) -> Millis {
    for _ in 0..100 {
        w.beat("trainer-0", "processing", "step-1").await;
        look(w, Duration::from_secs(2)).await;
    }
    w.now() - 2_000
}

/// Looks every 2 s until the worker is restarted (at most 3 minutes): how long after `last`.
async fn until_restarted(w: &mut World, last: Millis) -> Option<Millis> {
    while w.now() - last < 180_000 {
        look(w, Duration::from_secs(2)).await;
        if w.runtime.restarts("c1") > 0 {
            return Some(w.now() - last);
        }
    }
    None
}

/// Every request an agent makes, by its shape: `read N` (the clock and N workers), `batch`, or
/// the request's name.
struct Shapes {
    inner: Arc<dyn Coordinator>,
    seen: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl Coordinator for Shapes {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn execute(
        &self,
        request: vigil::coord::Request,
    ) -> Result<vigil::coord::Reply, vigil::coord::CoordError> {
        use vigil::coord::Request;
        let shape = match &request {
            Request::ReadWorkers(w) => format!("read {}", w.len()),
            Request::Batch(_) => "batch".to_string(),
            other => {
                format!("{other:?}").split([' ', '(', '{']).next().unwrap_or_default().to_string()
            }
        };
        self.seen.lock().unwrap().push(shape);
        self.inner.execute(request).await
    }
}

/// Issue 43: a healthy cycle is two round trips whatever the number of workers — the clock and
/// every worker's record and marks in one read, the node's writes in one batch — and a worker
/// evaluated after one that acted is read again on its own, never judged on the cycle's older
/// read.
#[tokio::test]
async fn a_healthy_cycle_is_two_round_trips_and_a_worker_after_one_that_acted_is_read_again() {
    let clock = FakeClock::at(DAY_START);
    let store: Arc<dyn Coordinator> = Arc::new(MemoryCoordinator::new(Arc::new(clock.clone())));
    let shapes = Arc::new(Shapes { inner: store.clone(), seen: Default::default() });
    let runtime = FakeRuntime::default();
    let workers = ["a-hangs", "b-fine", "c-fine"];
    for (i, w) in workers.iter().enumerate() {
        runtime.add(&format!("c{i}"), w);
    }
    let cfg = config("gpu-1", |_| {});
    let keys = Keys::new(&cfg.redis.key_prefix, &cfg.node_name);
    let metrics = Arc::new(Metrics::new());
    let notifier = Notifier::new(None, metrics.clone());
    let mut agent = Agent::new(cfg, shapes.clone(), Arc::new(runtime), notifier, metrics);
    let beat = |w: &'static str| {
        let (store, keys, clock) = (store.clone(), keys.clone(), clock.clone());
        async move {
            use vigil::clock::Clock;
            let at = clock.now();
            write_record(store.as_ref(), &keys.status(w), "processing", at, &[]).await;
        }
    };
    // The first cycles record each incarnation (writes): not a steady state.
    for _ in 0..2 {
        for w in workers {
            beat(w).await;
        }
        agent.cycle().await;
        clock.advance(POLL);
    }
    for w in workers {
        beat(w).await;
    }
    shapes.seen.lock().unwrap().clear();
    let report = agent.cycle().await;
    assert!(report.verdicts.iter().all(|(_, v)| *v == Verdict::Healthy));
    assert_eq!(*shapes.seen.lock().unwrap(), ["read 3", "batch"]);

    // `a-hangs` falls silent: the cycle that first sees it stale writes its suspect mark, and
    // the two workers after it are read again, each on its own.
    let mut acted = None;
    for _ in 0..20 {
        clock.advance(POLL);
        beat("b-fine").await;
        beat("c-fine").await;
        shapes.seen.lock().unwrap().clear();
        let report = agent.cycle().await;
        let seen = shapes.seen.lock().unwrap().clone();
        if seen != ["read 3", "batch"] {
            acted = Some((report, seen));
            break;
        }
    }
    let (report, seen) = acted.expect("the hang is seen within 20 polls");
    assert_eq!(seen.first().map(String::as_str), Some("read 3"), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("batch"), "{seen:?}");
    let rereads = seen.iter().filter(|s| *s == "read 1").count();
    assert_eq!(rereads, 2, "b and c read again after a acted: {seen:?}");
    let first_reread = seen.iter().position(|s| s == "read 1").unwrap();
    assert!(
        seen[1..first_reread].iter().any(|s| s != "read 1"),
        "a's own request came first: {seen:?}"
    );
    let verdict = |w: &str| report.verdicts.iter().find(|(x, _)| x == w).map(|(_, v)| *v);
    assert_eq!(verdict("b-fine"), Some(Verdict::Healthy));
    assert_eq!(verdict("c-fine"), Some(Verdict::Healthy));
}
