//! `vigil demo`: the seed's night, replayed in seconds on any machine (no GPU, cloud, cluster or
//! Redis). The real policy, pipeline, coordinator semantics and maintenance controller run
//! against the simulation adapters (`crate::runtime::sim`) and a fake clock that jumps 15 s per cycle, so
//! the brief's real thresholds (120 s stale, 3 min delay, 10 min cooldown) apply unchanged.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::alerts::{AlertKind, Notifier};
use crate::clock::{hhmmss, Clock, FakeClock, Millis};
use crate::config::Config;
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{heartbeat_value, Coordinator, Keys};
use crate::cycle::agent::Agent;
use crate::metrics::Metrics;
use crate::node::controller::{Controller, SharedFacts};
use crate::recording::{RecordingNodeApi, RecordingSink};
use crate::runtime::sim::FakeRuntime;
use crate::vocab::maintenance::{Interruption, MaintenanceState, Phase, Source};

/// 2026-11-30T02:00:00Z, the start of the night.
const NIGHT: Millis = 1_796_004_000_000;
const TICK: Duration = Duration::from_secs(15);
const NODE: &str = "gpu-node-7";
const WORKER: &str = "trainer-0";

fn at(min: i64, sec: i64) -> Millis {
    NIGHT + (min * 60 + sec) * 1000
}

/// What the demo observed, for the closing lines and for tests.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Summary {
    pub(crate) hang_at: Millis,
    pub(crate) alerted_at: Option<Millis>,
    pub(crate) restarted_at: Option<Millis>,
    pub(crate) recovered_at: Option<Millis>,
    pub(crate) restarts: usize,
    pub(crate) checkpoint: Option<String>,
}

/// Replay the night, writing the timeline to `out`; `pace` is the real time per 15 s cycle.
pub(crate) async fn run(out: &mut dyn Write, pace: Duration) -> std::io::Result<Summary> {
    let clock = FakeClock::at(NIGHT);
    let coord: Arc<dyn Coordinator> = Arc::new(MemoryCoordinator::new(Arc::new(clock.clone())));
    let runtime = FakeRuntime::default();
    runtime.add("c-3f2a9b1e", WORKER);
    let sink = RecordingSink::default();
    let node_api = RecordingNodeApi::default();
    let metrics = Arc::new(Metrics::new());
    let cfg = Config {
        node_name: NODE.into(),
        ..Config::default()
    };
    let keys = Keys::new(&cfg.redis.key_prefix, NODE);
    let facts = SharedFacts::default();
    let mut agent = Agent::new(
        cfg.clone(),
        coord.clone(),
        Arc::new(runtime.clone()),
        Notifier::new(Some(Arc::new(sink.clone())), metrics.clone()),
        metrics.clone(),
    )
    .with_facts(facts.clone());
    let mut controller = Controller::new(
        cfg.clone(),
        coord.clone(),
        Arc::new(runtime.clone()),
        metrics.clone(),
        agent.trail(),
    )
    .with_node_api(Arc::new(node_api.clone()))
    .with_facts(facts);

    writeln!(
        out,
        "vigil demo — the night of seed 000, replayed with the real policy and pipeline"
    )?;
    writeln!(out, "node {NODE}, worker {WORKER}; stale after 2m, restart after 3m more, cooldown 10m, breaker 3/day")?;
    writeln!(
        out,
        "(time is simulated: one line of the loop = 15 s; in the seed this took 6 hours)\n"
    )?;

    // The worker process: acknowledges checkpoint requests while it is alive.
    let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let acker = {
        let coord = coord.clone();
        let key = keys.status(WORKER);
        let alive = alive.clone();
        tokio::spawn(async move {
            loop {
                if alive.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Ok(rec) = coord.hgetall(&key).await {
                        if let Some(req) = rec.get("checkpoint_request") {
                            if rec.get("checkpoint_ack").is_none_or(|a| a.is_empty()) {
                                let _ = coord
                                    .hset(&key, &[("checkpoint_ack".into(), req.clone())], None)
                                    .await;
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let mut summary = Summary {
        hang_at: at(14, 0),
        ..Summary::default()
    };
    let mut printed_trail = 0usize;
    let mut printed_alerts = 0usize;
    let mut step = 0u64;
    let mut booted_at: Option<Millis> = None;
    let mut last_labels: BTreeMap<String, Option<String>> = BTreeMap::new();
    let end = at(47, 0);
    while clock.now() < end {
        let now = clock.now();
        // The worker: beats and makes progress until the heap corruption at 02:14; after our
        // restart it loads its model for 90 s (no beats), then works again.
        let restarted = runtime.restarts("c-3f2a9b1e") > 0;
        if restarted && booted_at.is_none() {
            booted_at = Some(now + 90_000);
        }
        let working = now < summary.hang_at || booted_at.is_some_and(|b| now >= b);
        if working {
            step += 1;
            coord
                .hset(
                    &keys.status(WORKER),
                    &[
                        ("state".into(), "processing".into()),
                        ("heartbeat".into(), heartbeat_value(now)),
                        ("job".into(), "llm-finetune-042".into()),
                        ("progress".into(), format!("step-{step}")),
                    ],
                    None,
                )
                .await
                .map_err(std::io::Error::other)?;
        }
        alive.store(working, std::sync::atomic::Ordering::SeqCst);
        if now == summary.hang_at {
            writeln!(out, "{}  WORKER  heap corruption: the process freezes mid-job (state stays `processing`)", hhmmss(now))?;
        }
        if let Some(b) = booted_at.filter(|b| *b == now) {
            writeln!(
                out,
                "{}  WORKER  model loaded after 90 s of booting; beating again",
                hhmmss(b)
            )?;
        }
        // The maintenance notice of the second act.
        if now == at(40, 0) {
            writeln!(
                out,
                "{}  GCE     upcoming-maintenance: PENDING (can_reschedule=true)",
                hhmmss(now)
            )?;
            controller
                .apply(MaintenanceState {
                    phase: Phase::Pending,
                    reasons: vec!["upcoming-pending"],
                    can_reschedule: true,
                    window_start: Some("2026-11-30T03:00:00Z".into()),
                    window_end: Some("2026-11-30T04:00:00Z".into()),
                    interruption: None,
                    sources: vec![Source::Metadata],
                })
                .await;
        }
        if now == at(43, 0) {
            writeln!(
                out,
                "{}  GCE     maintenance-event: TERMINATE_ON_HOST_MAINTENANCE",
                hhmmss(now)
            )?;
            controller
                .apply(MaintenanceState {
                    phase: Phase::Terminating,
                    reasons: vec!["terminate-on-host-maintenance"],
                    interruption: Some(Interruption::HostMaintenance),
                    sources: vec![Source::Metadata],
                    ..MaintenanceState::default()
                })
                .await;
        }

        agent.cycle().await;

        // Print what happened: decisions, alerts, Node changes.
        let trail = coord
            .read_recent(&keys.trail(), 10_000)
            .await
            .map_err(std::io::Error::other)?;
        for (_, e) in trail.iter().rev().skip(printed_trail) {
            let decision = e.get("decision").map(String::as_str).unwrap_or("");
            if matches!(decision, "agent-started" | "suspect") {
                continue;
            }
            let t = e.get("at").and_then(|a| a.parse().ok()).unwrap_or(now);
            writeln!(
                out,
                "{}  DECIDE  {:<16} {:<22} {}",
                hhmmss(t),
                e.get("verdict").map(String::as_str).unwrap_or(""),
                decision,
                e.get("detail").map(String::as_str).unwrap_or("")
            )?;
            match decision {
                "restarted" => summary.restarted_at = summary.restarted_at.or(Some(t)),
                "recovered" => summary.recovered_at = summary.recovered_at.or(Some(t)),
                _ => {}
            }
        }
        printed_trail = trail.len();
        let alerts = sink.0.lock().map(|a| a.clone()).unwrap_or_default();
        for a in alerts.iter().skip(printed_alerts) {
            writeln!(out, "{}  ALERT   {}", hhmmss(now), a.summary())?;
            if a.kind == AlertKind::Hung {
                summary.alerted_at = summary.alerted_at.or(Some(now));
            }
        }
        printed_alerts = alerts.len();
        let labels = node_api.last().labels;
        if !labels.is_empty() && labels != last_labels {
            let shown: Vec<String> = labels
                .iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
                .collect();
            let taint = if node_api.last().add_taints.is_empty() {
                String::new()
            } else {
                "  + taint vigil.dev/termination-imminent:NoSchedule".into()
            };
            writeln!(out, "{}  NODE    {}{taint}", hhmmss(now), shown.join(" "))?;
            last_labels = labels;
        }
        if let Some(c) = node_api
            .last()
            .annotations
            .get("vigil.dev/last-checkpoint")
            .cloned()
            .flatten()
        {
            if summary.checkpoint.as_deref() != Some(c.as_str()) {
                writeln!(
                    out,
                    "{}  NODE    vigil.dev/last-checkpoint: {c}",
                    hhmmss(now)
                )?;
                summary.checkpoint = Some(c);
            }
        }

        clock.advance(TICK);
        if !pace.is_zero() {
            tokio::time::sleep(pace).await;
        }
    }
    acker.abort();
    summary.restarts = runtime.restarts("c-3f2a9b1e");
    writeln!(out)?;
    let m = |t: Option<Millis>| t.map(hhmmss).unwrap_or_else(|| "never".into());
    writeln!(
        out,
        "summary: hang {} → alert {} → restart {} → healthy again {} ({} restart, no second restart while booting)",
        hhmmss(summary.hang_at),
        m(summary.alerted_at),
        m(summary.restarted_at),
        m(summary.recovered_at),
        summary.restarts
    )?;
    if let Some(c) = &summary.checkpoint {
        writeln!(
            out,
            "maintenance: the worker checkpointed before termination ({c})"
        )?;
    }
    writeln!(
        out,
        "ask it why: every line above marked DECIDE is in the decision trail (`vigil explain`)"
    )?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_night_ends_with_one_restart_a_recovery_and_a_checkpoint() {
        let mut out = Vec::new();
        let s = super::run(&mut out, std::time::Duration::ZERO)
            .await
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(s.restarts, 1, "{text}");
        let (alert, restart, healthy) = (
            s.alerted_at.unwrap(),
            s.restarted_at.unwrap(),
            s.recovered_at.unwrap(),
        );
        assert!(
            s.hang_at < alert && alert < restart && restart < healthy,
            "{text}"
        );
        // 120 s stale + confirmation + 3 min persistence: the restart is due ~5 min after.
        assert!(
            restart - s.hang_at >= 300_000 && restart - s.hang_at <= 360_000,
            "{text}"
        );
        assert!(s.checkpoint.unwrap().contains("acked=1"), "{text}");
        assert!(
            text.contains("timer-started") && text.contains("restarted"),
            "{text}"
        );
        assert!(text.contains("vigil.dev/maintenance=terminating"), "{text}");
    }
}
