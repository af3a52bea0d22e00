//! `vigil demo`: the seed's night, replayed in seconds on any machine (no GPU, cloud, cluster or
//! Redis). The real policy, pipeline, coordinator semantics and maintenance controller run
//! against the simulation adapters (`crate::runtime::sim`) and a fake clock that jumps 15 s per cycle, so
//! the brief's real thresholds (120 s stale, 3 min delay, 10 min cooldown) apply unchanged.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::alerts::{AlertKind, Notifier};
use crate::clock::{hhmmss, Clock, FakeClock, Millis};
use crate::config::Config;
use crate::coord::memory::MemoryCoordinator;
use crate::coord::{heartbeat_value, Coordinator};
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
const CONTAINER: &str = "c-3f2a9b1e";

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
    let mut night = Night::new();
    intro(out)?;
    let acker = night.spawn_acker();
    let end = at(47, 0);
    while night.clock.now() < end {
        let now = night.clock.now();
        night.worker(out, now).await?;
        night.notices(out, now).await?;
        night.agent.cycle().await;
        // Print what happened: decisions, alerts, Node changes.
        night.print_decisions(out, now).await?;
        night.print_alerts(out, now)?;
        night.print_node(out, now)?;
        night.clock.advance(TICK);
        if !pace.is_zero() {
            tokio::time::sleep(pace).await;
        }
    }
    acker.abort();
    night.summary.restarts = night.runtime.restarts(CONTAINER);
    close(out, &night.summary)?;
    Ok(night.summary)
}

fn intro(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "vigil demo — the night of seed 000, replayed with the real policy and pipeline\n\
         node {NODE}, worker {WORKER}; stale after 2m, restart after 3m more, cooldown 10m, breaker 3/day\n\
         (time is simulated: one line of the loop = 15 s; in the seed this took 6 hours)\n"
    )
}

fn close(out: &mut dyn Write, summary: &Summary) -> std::io::Result<()> {
    let m = |t: Option<Millis>| t.map(hhmmss).unwrap_or_else(|| "never".into());
    let hang = hhmmss(summary.hang_at);
    let alert = m(summary.alerted_at);
    let restart = m(summary.restarted_at);
    let healthy = m(summary.recovered_at);
    let restarts = summary.restarts;
    writeln!(out, "\nsummary: hang {hang} → alert {alert} → restart {restart} → healthy again {healthy} ({restarts} restart, no second restart while booting)")?;
    if let Some(c) = &summary.checkpoint {
        writeln!(out, "maintenance: the worker checkpointed before termination ({c})")?;
    }
    writeln!(
        out,
        "ask it why: every line above marked DECIDE is in the decision trail (`vigil explain`)"
    )
}

/// The night's world: the real agent and controller on the simulation adapters, the worker,
/// and what has been printed so far.
struct Night {
    clock: FakeClock,
    coord: Arc<dyn Coordinator>,
    runtime: FakeRuntime,
    sink: RecordingSink,
    node_api: RecordingNodeApi,
    agent: Agent,
    controller: Controller,
    /// The worker process is alive (it acknowledges checkpoint requests).
    alive: Arc<AtomicBool>,
    summary: Summary,
    printed_trail: usize,
    printed_alerts: usize,
    step: u64,
    booted_at: Option<Millis>,
    last_labels: BTreeMap<String, Option<String>>,
}

impl Night {
    fn new() -> Night {
        let clock = FakeClock::at(NIGHT);
        let coord: Arc<dyn Coordinator> = Arc::new(MemoryCoordinator::new(Arc::new(clock.clone())));
        let runtime = FakeRuntime::default();
        runtime.add(CONTAINER, WORKER);
        let sink = RecordingSink::default();
        let node_api = RecordingNodeApi::default();
        let metrics = Arc::new(Metrics::new());
        let cfg = Config { node_name: NODE.into(), ..Config::default() };
        let facts = SharedFacts::default();
        let rt: Arc<dyn crate::runtime::ContainerRuntime> = Arc::new(runtime.clone());
        let notifier = Notifier::new(Some(Arc::new(sink.clone())), metrics.clone());
        let agent = Agent::new(cfg.clone(), coord.clone(), rt.clone(), notifier, metrics.clone())
            .with_facts(facts.clone());
        let controller = Controller::new(cfg, coord.clone(), rt, metrics, agent.trail())
            .with_node_api(Arc::new(node_api.clone()))
            .with_facts(facts);
        Night {
            clock,
            coord,
            runtime,
            sink,
            node_api,
            agent,
            controller,
            alive: Arc::new(AtomicBool::new(true)),
            summary: Summary { hang_at: at(14, 0), ..Summary::default() },
            printed_trail: 0,
            printed_alerts: 0,
            step: 0,
            booted_at: None,
            last_labels: BTreeMap::new(),
        }
    }

    /// The worker process: acknowledges checkpoint requests while it is alive.
    fn spawn_acker(&self) -> tokio::task::JoinHandle<()> {
        let (coord, alive) = (self.coord.clone(), self.alive.clone());
        let key = self.agent.keys().status(WORKER);
        tokio::spawn(async move {
            loop {
                if alive.load(Ordering::SeqCst) {
                    let rec = coord.hgetall(&key).await.unwrap_or_default();
                    let acked = rec.get("checkpoint_ack").is_some_and(|a| !a.is_empty());
                    if let Some(req) = rec.get("checkpoint_request").filter(|_| !acked) {
                        let ack = [("checkpoint_ack".to_string(), req.clone())];
                        let _ = coord.hset(&key, &ack, None).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }

    /// The worker: beats and makes progress until the heap corruption at 02:14; after our
    /// restart it loads its model for 90 s (no beats), then works again.
    async fn worker(&mut self, out: &mut dyn Write, now: Millis) -> std::io::Result<()> {
        let restarted = self.runtime.restarts(CONTAINER) > 0;
        if restarted && self.booted_at.is_none() {
            self.booted_at = Some(now + 90_000);
        }
        let working = now < self.summary.hang_at || self.booted_at.is_some_and(|b| now >= b);
        if working {
            self.step += 1;
            let fields = [
                ("state".into(), "processing".into()),
                ("heartbeat".into(), heartbeat_value(now)),
                ("job".into(), "llm-finetune-042".into()),
                ("progress".into(), format!("step-{}", self.step)),
            ];
            let key = self.agent.keys().status(WORKER);
            self.coord.hset(&key, &fields, None).await.map_err(std::io::Error::other)?;
        }
        self.alive.store(working, Ordering::SeqCst);
        if now == self.summary.hang_at {
            writeln!(out, "{}  WORKER  heap corruption: the process freezes mid-job (state stays `processing`)", hhmmss(now))?;
        }
        if let Some(b) = self.booted_at.filter(|b| *b == now).map(hhmmss) {
            writeln!(out, "{b}  WORKER  model loaded after 90 s of booting; beating again")?;
        }
        Ok(())
    }

    /// The maintenance notices of the second act.
    async fn notices(&mut self, out: &mut dyn Write, now: Millis) -> std::io::Result<()> {
        let t = hhmmss(now);
        let notice = if now == at(40, 0) {
            writeln!(out, "{t}  GCE     upcoming-maintenance: PENDING (can_reschedule=true)")?;
            MaintenanceState {
                phase: Phase::Pending,
                reasons: vec!["upcoming-pending"],
                can_reschedule: true,
                window_start: Some("2026-11-30T03:00:00Z".into()),
                window_end: Some("2026-11-30T04:00:00Z".into()),
                interruption: None,
                sources: vec![Source::Metadata],
            }
        } else if now == at(43, 0) {
            writeln!(out, "{t}  GCE     maintenance-event: TERMINATE_ON_HOST_MAINTENANCE")?;
            MaintenanceState {
                phase: Phase::Terminating,
                reasons: vec!["terminate-on-host-maintenance"],
                interruption: Some(Interruption::HostMaintenance),
                sources: vec![Source::Metadata],
                ..MaintenanceState::default()
            }
        } else {
            return Ok(());
        };
        self.controller.apply(notice).await;
        Ok(())
    }

    /// The decision trail's new entries.
    async fn print_decisions(&mut self, out: &mut dyn Write, now: Millis) -> std::io::Result<()> {
        let trail = self.coord.read_recent(&self.agent.keys().trail(), 10_000).await;
        let trail = trail.map_err(std::io::Error::other)?;
        for (_, e) in trail.iter().rev().skip(self.printed_trail) {
            let field = |k: &str| e.get(k).map(String::as_str).unwrap_or("");
            let decision = field("decision");
            if matches!(decision, "agent-started" | "suspect") {
                continue;
            }
            let t = e.get("at").and_then(|a| a.parse().ok()).unwrap_or(now);
            let (when, verdict, detail) = (hhmmss(t), field("verdict"), field("detail"));
            writeln!(out, "{when}  DECIDE  {verdict:<16} {decision:<22} {detail}")?;
            let s = &mut self.summary;
            match decision {
                "restarted" => s.restarted_at = s.restarted_at.or(Some(t)),
                "recovered" => s.recovered_at = s.recovered_at.or(Some(t)),
                _ => {}
            }
        }
        self.printed_trail = trail.len();
        Ok(())
    }

    /// The alerts sent since the last cycle.
    fn print_alerts(&mut self, out: &mut dyn Write, now: Millis) -> std::io::Result<()> {
        let alerts = self.sink.0.lock().map(|a| a.clone()).unwrap_or_default();
        for a in alerts.iter().skip(self.printed_alerts) {
            writeln!(out, "{}  ALERT   {}", hhmmss(now), a.summary())?;
            if a.kind == AlertKind::Hung {
                self.summary.alerted_at = self.summary.alerted_at.or(Some(now));
            }
        }
        self.printed_alerts = alerts.len();
        Ok(())
    }

    /// The Node's labels and taint when they changed, and its last checkpoint.
    fn print_node(&mut self, out: &mut dyn Write, now: Millis) -> std::io::Result<()> {
        let last = self.node_api.last();
        if !last.labels.is_empty() && last.labels != self.last_labels {
            let shown =
                last.labels.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")));
            let shown: Vec<String> = shown.collect();
            let taint = "  + taint vigil.dev/termination-imminent:NoSchedule";
            let taint = if last.add_taints.is_empty() { "" } else { taint };
            writeln!(out, "{}  NODE    {}{taint}", hhmmss(now), shown.join(" "))?;
            self.last_labels = last.labels.clone();
        }
        let checkpoint = last.annotations.get("vigil.dev/last-checkpoint").cloned().flatten();
        if let Some(c) = checkpoint.filter(|c| self.summary.checkpoint.as_ref() != Some(c)) {
            writeln!(out, "{}  NODE    vigil.dev/last-checkpoint: {c}", hhmmss(now))?;
            self.summary.checkpoint = Some(c);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_night_ends_with_one_restart_a_recovery_and_a_checkpoint() {
        let mut out = Vec::new();
        let s = super::run(&mut out, std::time::Duration::ZERO).await.unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(s.restarts, 1, "{text}");
        let (alert, restart, healthy) =
            (s.alerted_at.unwrap(), s.restarted_at.unwrap(), s.recovered_at.unwrap());
        assert!(s.hang_at < alert && alert < restart && restart < healthy, "{text}");
        // 120 s stale + confirmation + 3 min persistence: the restart is due ~5 min after.
        assert!(restart - s.hang_at >= 300_000 && restart - s.hang_at <= 360_000, "{text}");
        assert!(s.checkpoint.unwrap().contains("acked=1"), "{text}");
        assert!(text.contains("timer-started") && text.contains("restarted"), "{text}");
        assert!(text.contains("vigil.dev/maintenance=terminating"), "{text}");
    }
}
