//! The maintenance controller: turns what the metadata server says into what the cluster sees
//! (Node labels, annotations, taint, Events), asks the workers to checkpoint when the node is
//! about to go, and tells the restart pipeline to stand down (maintenance makes healthy workers
//! look hung).
//!
//! It also owns the agent's own SIGTERM checkpoint, and the opt-in opportunistic maintenance.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::actions::alert::{Alert, AlertKind, Notifier};
use crate::actions::checkpoint::{self, Checkpointer, Outcome, WorkerResult};
use crate::actions::node::{EventType, NodeApi};
use crate::clock::{ms, rfc3339, Clock, Millis, SystemClock};
use crate::config::Config;
use crate::coord::{Coordinator, Keys};
use crate::model::gpu::{GpuHealth, GpuReport};
use crate::model::maintenance::{Interruption, MaintenanceState, Phase, RawMetadata};
use crate::model::worker::WorkerState;
use crate::observe::fleet;
use crate::observe::metrics::{GpuMetricsState, Metrics};
use crate::observe::trail::{Code, Trail};
use crate::policy::maintenance::{
    derive, event_for, gpu_desired, interruption_starts, node_desired, pending_near,
};
use crate::runtime::ContainerRuntime;

/// Longest wait on one Kubernetes call: the Node is informative, checkpoints are what matter.
const KUBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the rest of the agent needs to know about the node.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    pub maintenance: MaintenanceState,
    /// A pending notice whose window is near enough to stand restarts down.
    pub pending_near: bool,
    /// Restarts stay suppressed until then after a maintenance event ends.
    pub settle_until: Option<tokio::time::Instant>,
}

impl NodeFacts {
    /// Whether restarts stand down. Ongoing and terminating always; a pending notice only once
    /// its window is near (`pending_near`, set by the controller from
    /// `metadata.pending_horizon`): GCE posts PENDING notices days ahead, and a hung worker must
    /// not wait days. Plus the settle period after a notice ends.
    pub fn in_maintenance(&self, now: tokio::time::Instant) -> bool {
        match self.maintenance.phase {
            Phase::Ongoing | Phase::Terminating => true,
            Phase::Pending if self.pending_near => true,
            _ => self.settle_until.is_some_and(|t| now < t),
        }
    }
}

pub type SharedFacts = Arc<RwLock<NodeFacts>>;

pub struct Controller {
    pub cfg: Config,
    pub keys: Keys,
    pub coord: Arc<dyn Coordinator>,
    pub runtime: Arc<dyn ContainerRuntime>,
    pub node_api: Option<Arc<dyn NodeApi>>,
    pub metrics: Arc<Metrics>,
    pub trail: Trail,
    pub facts: SharedFacts,
    pub checkpointer: Checkpointer,
    state: MaintenanceState,
    checkpointed_episode: bool,
    /// When the last checkpoint round ended (a SIGTERM right after one does not repeat it).
    last_checkpoint_at: Option<tokio::time::Instant>,
    /// The perform-maintenance label must be removed once after the claim is released.
    release_label_pending: std::sync::atomic::AtomicBool,
    /// When the GPU reasons were last published (reason-only changes are rate-limited).
    gpu_published_at: Option<tokio::time::Instant>,
    last_checkpoint: Option<String>,
    /// Whether this node currently holds the pool's opportunistic-maintenance claim.
    claimed: Option<String>,
    /// The latest GPU report (monitoring off until the GPU monitor says otherwise).
    gpu: GpuReport,
    gpu_seen: GpuMetricsState,
    notifier: Option<Notifier>,
}

impl Controller {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: Config,
        coord: Arc<dyn Coordinator>,
        runtime: Arc<dyn ContainerRuntime>,
        node_api: Option<Arc<dyn NodeApi>>,
        metrics: Arc<Metrics>,
        trail: Trail,
        facts: SharedFacts,
    ) -> Controller {
        let keys = Keys::new(&cfg.redis.key_prefix, &cfg.node_name);
        let checkpointer = Checkpointer {
            coord: coord.clone(),
            runtime: runtime.clone(),
            keys: keys.clone(),
            default_method: checkpoint::Method::resolve(
                &cfg.checkpoint.method,
                cfg.checkpoint.signal,
            ),
            default_signal: cfg.checkpoint.signal,
            poll: Duration::from_millis(200),
            http: reqwest::Client::new(),
        };
        Controller {
            cfg,
            keys,
            coord,
            runtime,
            node_api,
            metrics,
            trail,
            facts,
            checkpointer,
            state: MaintenanceState::default(),
            checkpointed_episode: false,
            last_checkpoint_at: None,
            release_label_pending: std::sync::atomic::AtomicBool::new(false),
            gpu_published_at: None,
            last_checkpoint: None,
            claimed: None,
            gpu: GpuReport::default(),
            gpu_seen: GpuMetricsState::default(),
            notifier: None,
        }
    }

    /// Alerts for node-level GPU failures go here.
    pub fn with_notifier(mut self, notifier: Notifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// A new GPU report: metrics always; the Node, an Event, the trail and an alert when the
    /// node's GPU health or its reasons change.
    pub async fn apply_gpu(&mut self, report: GpuReport) {
        self.metrics.record_gpu(&report, &mut self.gpu_seen);
        let health_changed =
            report.monitoring != self.gpu.monitoring || report.node != self.gpu.node;
        // Reasons carry counts (an XID seen n times, n ECC errors): publishing every change would
        // patch the Node on every XID. Reason-only changes go out at most once a minute.
        let reasons_due = report.node_reasons != self.gpu.node_reasons
            && self
                .gpu_published_at
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
        let changed = health_changed || reasons_due;
        if !changed {
            // Keep the previous report: its reasons are what the Node shows.
            let reasons = std::mem::take(&mut self.gpu.node_reasons);
            self.gpu = GpuReport {
                node_reasons: reasons,
                ..report
            };
            return;
        }
        self.gpu_published_at = Some(tokio::time::Instant::now());
        let prev = std::mem::replace(&mut self.gpu, report);
        let r = &self.gpu;
        let detail = format!(
            "GPU health {} → {}{}",
            prev.node.as_str(),
            r.node.as_str(),
            if r.node_reasons.is_empty() {
                String::new()
            } else {
                format!(": {}", r.node_reasons.join("; "))
            }
        );
        let (monitoring, node) = (r.monitoring, r.node);
        if monitoring {
            self.note("-", Code::GpuHealth, detail.clone()).await;
        }
        self.publish().await;
        if prev.node != node && monitoring {
            let (reason, kind) = match node {
                GpuHealth::Failed => ("VigilGpuFailed", EventType::Warning),
                GpuHealth::Degraded => ("VigilGpuDegraded", EventType::Warning),
                GpuHealth::Healthy => ("VigilGpuHealthy", EventType::Normal),
            };
            self.event(reason, &format!("vigil: {detail}"), kind).await;
            if node == GpuHealth::Failed {
                if let Some(n) = &self.notifier {
                    let a = Alert::new(
                        AlertKind::GpuFailed,
                        &self.cfg.node_name,
                        format!("{detail}; a restart cannot fix hardware: drain the node and have the GPU checked"),
                    );
                    n.send(&a).await;
                }
            }
        }
    }

    async fn now(&self) -> Millis {
        // The trail prefers the coordinator's clock; the node's is the fallback when it is down.
        match self.coord.time().await {
            Ok(t) => t,
            Err(_) => SystemClock.now(),
        }
    }

    async fn note(&self, worker: &str, decision: Code, detail: String) {
        let at = self.now().await;
        let phase = self.state.phase.as_str();
        if let Err(e) = self
            .trail
            .record(at, worker, phase, decision, detail, None)
            .await
        {
            tracing::warn!(error = %e, decision = decision.as_str(), "decision not stored in the trail");
        }
    }

    /// Make the Node show the current state (no write when it already does).
    pub async fn publish(&self) {
        let Some(api) = &self.node_api else { return };
        let mut desired = node_desired(
            &self.cfg.kubernetes,
            &self.state,
            self.last_checkpoint.as_deref(),
            // NB: only a label this node set is ever removed: an operator's own is left alone.
            if self.claimed.is_some() {
                Some(true)
            } else if self
                .release_label_pending
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                Some(false)
            } else {
                None
            },
        );
        gpu_desired(
            &self.cfg.kubernetes,
            &self.gpu,
            self.cfg.gpu.taint_on_failure,
            &mut desired,
        );
        let call = tokio::time::timeout(KUBE_TIMEOUT, api.reconcile(&self.cfg.node_name, &desired));
        let result = match call.await {
            Ok(r) => r,
            Err(_) => {
                self.metrics.kube_error("patch");
                tracing::error!("the Kubernetes API did not answer within {KUBE_TIMEOUT:?}; the Node may be stale");
                return;
            }
        };
        if result.is_ok() {
            self.release_label_pending
                .store(false, std::sync::atomic::Ordering::SeqCst);
        }
        if let Err(e) = result {
            self.metrics.kube_error(e.op());
            tracing::error!(error = %e, "could not update the Node; its labels may be stale");
        }
    }

    async fn event(&self, reason: &str, message: &str, kind: EventType) {
        let Some(api) = &self.node_api else { return };
        let call = tokio::time::timeout(
            KUBE_TIMEOUT,
            api.event(&self.cfg.node_name, reason, message, kind),
        );
        let Ok(result) = call.await else {
            self.metrics.kube_error("event");
            tracing::warn!(
                reason,
                "the Kubernetes API did not answer; Event not recorded"
            );
            return;
        };
        if let Err(e) = result {
            self.metrics.kube_error(e.op());
            tracing::warn!(error = %e, reason, "could not record the Event");
        }
    }

    fn set_phase_metric(&self, phase: Phase) {
        for p in [
            Phase::None,
            Phase::Pending,
            Phase::Ongoing,
            Phase::Terminating,
        ] {
            self.metrics
                .maintenance
                .get_or_create(&vec![("phase", p.as_str())])
                .set(i64::from(p == phase));
        }
    }

    /// Act on a new maintenance state.
    pub async fn apply(&mut self, next: MaintenanceState) {
        if next == self.state {
            return;
        }
        let prev = std::mem::replace(&mut self.state, next.clone());
        let now = self.now().await;
        {
            let mut f = self.facts.write().unwrap_or_else(|p| p.into_inner());
            f.maintenance = next.clone();
            f.pending_near = pending_near(&next, now, self.cfg.metadata.pending_horizon);
            let suppressing = |p: Phase| matches!(p, Phase::Ongoing | Phase::Terminating);
            if !suppressing(next.phase) && suppressing(prev.phase) {
                f.settle_until = Some(tokio::time::Instant::now() + self.cfg.metadata.settle);
            }
        }
        self.set_phase_metric(next.phase);
        if interruption_starts(prev.phase, next.phase) {
            let kind = next
                .interruption
                .unwrap_or(Interruption::HostMaintenance)
                .as_str();
            for reason in &next.reasons {
                self.metrics
                    .interruptions
                    .get_or_create(&vec![("type", kind), ("reason", reason)])
                    .inc();
            }
        }
        if matches!(next.phase, Phase::None | Phase::Pending) {
            self.checkpointed_episode = false;
        }
        let detail = format!(
            "{} → {} (reasons: {}; window {} – {}; can_reschedule={})",
            prev.phase.as_str(),
            next.phase.as_str(),
            if next.reasons.is_empty() {
                "none".to_string()
            } else {
                next.reasons.join(",")
            },
            next.window_start.as_deref().unwrap_or("-"),
            next.window_end.as_deref().unwrap_or("-"),
            next.can_reschedule
        );
        // The pool claim ends with the episode it was taken for.
        if next.phase == Phase::None && self.claimed.is_some() {
            self.release_claim().await;
        }
        // NB: a termination is always checkpointed, even after an ongoing migration already
        // was; an ongoing one once per episode.
        let checkpoint = match next.phase {
            Phase::Terminating => prev.phase != Phase::Terminating,
            Phase::Ongoing => !self.checkpointed_episode,
            _ => false,
        };
        let (reason, budget) = if next.interruption == Some(Interruption::Preemption) {
            ("preemption", self.cfg.checkpoint.preemption_budget)
        } else {
            ("host-maintenance", self.cfg.checkpoint.maintenance_budget)
        };
        // NB: the checkpoint requests go out first and run alongside the Node update: on Spot
        // the whole budget is 30 s, and a slow API server must not eat into it.
        let requests = async {
            if checkpoint {
                Some(self.request_checkpoints(reason, budget).await)
            } else {
                None
            }
        };
        let node = async {
            self.note("-", Code::Maintenance, detail.clone()).await;
            self.publish().await;
            if prev.phase != next.phase {
                let (reason, kind) = event_for(next.phase);
                self.event(reason, &format!("vigil: maintenance {detail}"), kind)
                    .await;
            }
        };
        let (results, ()) = tokio::join!(requests, node);
        if let Some(results) = results {
            self.checkpointed_episode = true;
            self.record_checkpoint(reason, &results).await;
        }
    }

    /// Ask every worker to checkpoint, wait, and record the outcome everywhere.
    pub async fn checkpoint(&mut self, reason: &str, budget: Duration) -> Vec<WorkerResult> {
        let results = self.request_checkpoints(reason, budget).await;
        self.record_checkpoint(reason, &results).await;
        results
    }

    /// Deliver the requests and wait for the acknowledgements, all within `budget` (listing the
    /// workers included). A listing that fails is one `failed` result, not "nothing to do".
    async fn request_checkpoints(&self, reason: &str, budget: Duration) -> Vec<WorkerResult> {
        let started = tokio::time::Instant::now();
        let listed = tokio::time::timeout(budget, self.runtime.list_workers()).await;
        let workers = match listed {
            Ok(Ok(w)) => w,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "no answer".to_string(),
                };
                self.metrics.runtime_errors.inc();
                tracing::error!(error = %why, "cannot list workers to checkpoint");
                return vec![WorkerResult {
                    worker: "*".into(),
                    method: "invalid",
                    outcome: Outcome::Failed,
                    waited: started.elapsed(),
                    detail: format!("cannot list the workers: {why}"),
                }];
            }
        };
        self.checkpointer
            .run(&workers, reason, budget.saturating_sub(started.elapsed()))
            .await
    }

    async fn record_checkpoint(&mut self, reason: &str, results: &[WorkerResult]) {
        self.last_checkpoint_at = Some(tokio::time::Instant::now());
        for r in results {
            self.metrics
                .checkpoints
                .get_or_create(&vec![("method", r.method), ("outcome", r.outcome.as_str())])
                .inc();
            self.metrics
                .checkpoint_seconds
                .observe(r.waited.as_secs_f64());
            let decision = match r.outcome {
                Outcome::Acked => Code::CheckpointAcked,
                Outcome::TimedOut => Code::CheckpointTimedOut,
                Outcome::Failed => Code::CheckpointFailed,
            };
            let detail = format!(
                "{reason}: {} via {} after {:.1}s",
                r.detail,
                r.method,
                r.waited.as_secs_f64()
            );
            self.note(&r.worker, decision, detail).await;
        }
        let now = self.now().await;
        let summary = format!(
            "{} {reason}: {}",
            rfc3339(now),
            checkpoint::summary(results)
        );
        self.last_checkpoint = Some(summary.clone());
        self.publish().await;
        let all_acked = results.iter().all(|r| r.outcome == Outcome::Acked);
        self.event(
            "VigilCheckpoint",
            &format!("vigil: checkpoint requested ({summary})"),
            if all_acked {
                EventType::Normal
            } else {
                EventType::Warning
            },
        )
        .await;
    }

    async fn release_claim(&mut self) {
        if let Some(token) = self.claimed.take() {
            self.release_label_pending
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let key = self.keys.maintenance_claim(&self.cfg.fleet.pool);
            let _ = self.coord.del_if_owner(&key, &token).await;
            self.note(
                "-",
                Code::PerformMaintenance,
                "maintenance done; pool claim released".into(),
            )
            .await;
        }
    }

    /// Opportunistic maintenance: label the node for GKE to start a rescheduleable maintenance
    /// now, when it is idle, the pool can spare it, and it wins the pool's claim.
    pub async fn opportunistic(&mut self) {
        let o = self.cfg.opportunistic.clone();
        if !o.enabled {
            return;
        }
        if let Some(token) = self.claimed.clone() {
            // The claim is a Redis key with a TTL: if it expired (or was taken), this node no
            // longer speaks for the pool, and its label must go.
            let key = self.keys.maintenance_claim(&self.cfg.fleet.pool);
            if let Ok(None) = self.coord.owner_ttl(&key, &token).await {
                self.release_claim().await;
                self.publish().await;
            }
            return;
        }
        let st = &self.state;
        if st.phase != Phase::Pending || !st.can_reschedule {
            // A stale idle-since from an earlier episode must not skip `idle_for` next time.
            let _ = self.coord.del(&[self.keys.idle_since()]).await;
            return;
        }
        let Ok(now) = self.coord.time().await else {
            return;
        };
        let idle = match self.all_idle().await {
            Some(i) => i,
            None => return,
        };
        let idle_key = self.keys.idle_since();
        if !idle {
            let _ = self.coord.del(&[idle_key]).await;
            return;
        }
        let _ = self
            .coord
            .set_nx(&idle_key, &now.to_string(), Duration::from_secs(24 * 3600))
            .await;
        let since: Millis = match self.coord.get_many(&[idle_key]).await {
            Ok(v) => v
                .into_iter()
                .flatten()
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(now),
            Err(_) => return,
        };
        if now - since < ms(o.idle_for) {
            return;
        }
        let pool = &self.cfg.fleet.pool;
        let others_healthy =
            match fleet::read(self.coord.as_ref(), &self.cfg.redis.key_prefix).await {
                Ok((views, _)) => views
                    .iter()
                    .filter(|v| v.node != self.cfg.node_name)
                    .filter(|v| v.record.as_ref().is_some_and(|r| &r.pool == pool))
                    .filter(|v| v.health == "healthy")
                    .count(),
                Err(_) => return,
            };
        if others_healthy < o.min_nodes as usize {
            return;
        }
        // NB: the claim is atomic (SET NX): two idle nodes of a pool never go together.
        let token = format!("{}:{:08x}", self.cfg.node_name, rand::random::<u32>());
        let key = self.keys.maintenance_claim(pool);
        if let Ok(true) = self.coord.set_nx(&key, &token, o.claim_ttl).await {
            {
                self.claimed = Some(token);
                self.note(
                    "-",
                    Code::PerformMaintenance,
                    format!(
                        "idle {} with {others_healthy} other healthy node(s) in pool {pool}: asking GKE to perform the maintenance now",
                        crate::clock::human(now - since)
                    ),
                )
                .await;
                self.publish().await;
                self.event(
                    "VigilPerformMaintenance",
                    "vigil: node idle; perform-maintenance requested",
                    EventType::Normal,
                )
                .await;
            }
        }
    }

    /// True when every worker's record says idle; `None` when that cannot be read.
    async fn all_idle(&self) -> Option<bool> {
        let workers = self.runtime.list_workers().await.ok()?;
        for c in &workers {
            let fields = self
                .coord
                .hgetall(&self.keys.status(&c.worker))
                .await
                .ok()?;
            let state = fields.get("state").map(|s| WorkerState::parse(s));
            if state != Some(WorkerState::Idle) {
                return Some(false);
            }
        }
        Some(true)
    }

    /// Follow the metadata watcher until `term` (SIGTERM: checkpoint, then return) or `stop`.
    pub async fn run(
        mut self,
        mut rx: watch::Receiver<RawMetadata>,
        mut gpu_rx: watch::Receiver<GpuReport>,
        term: CancellationToken,
        stop: CancellationToken,
    ) {
        self.gpu = gpu_rx.borrow_and_update().clone();
        self.metrics.record_gpu(&self.gpu, &mut self.gpu_seen);
        self.set_phase_metric(Phase::None);
        // Bring the Node in line at start-up (clears what a previous run may have left).
        let first = derive(&rx.borrow_and_update());
        if first == self.state {
            self.publish().await;
        } else {
            self.apply(first).await;
        }
        let mut tick = tokio::time::interval(self.cfg.poll_interval);
        let mut metadata_open = true;
        let mut gpu_open = true;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = term.cancelled() => {
                    // A preemption's own SIGTERM follows its checkpoint within seconds: asking the
                    // workers twice would only cost them the time to save again.
                    let recent = self.last_checkpoint_at.is_some_and(|t| t.elapsed() < Duration::from_secs(60));
                    if self.cfg.checkpoint.on_sigterm && !recent {
                        let budget = self.cfg.checkpoint.sigterm_budget;
                        self.checkpoint("agent-sigterm", budget).await;
                    }
                    break;
                }
                changed = rx.changed(), if metadata_open => {
                    if changed.is_err() {
                        // The watcher is off (not on GCE): keep serving SIGTERM checkpoints.
                        metadata_open = false;
                        continue;
                    }
                    let next = derive(&rx.borrow_and_update());
                    self.apply(next).await;
                }
                changed = gpu_rx.changed(), if gpu_open => {
                    if changed.is_err() {
                        gpu_open = false;
                        continue;
                    }
                    let report = gpu_rx.borrow_and_update().clone();
                    self.apply_gpu(report).await;
                }
                _ = tick.tick() => self.opportunistic().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KubernetesConfig;
    use crate::policy::maintenance::PERFORM_MAINTENANCE_LABEL;

    fn st(phase: Phase, reasons: Vec<&'static str>) -> MaintenanceState {
        MaintenanceState {
            phase,
            reasons,
            window_start: Some("2026-11-30T10:00:00Z".into()),
            window_end: Some("2026-11-30T12:00:00Z".into()),
            can_reschedule: true,
            ..MaintenanceState::default()
        }
    }

    #[test]
    fn terminating_sets_the_taint_and_everything_else_removes_it() {
        let k = KubernetesConfig::default();
        let d = node_desired(&k, &st(Phase::Terminating, vec!["preempted"]), None, None);
        assert_eq!(d.add_taints.len(), 1);
        assert_eq!(d.add_taints[0].key, "vigil.dev/termination-imminent");
        assert_eq!(d.add_taints[0].effect, "NoSchedule");
        assert_eq!(
            d.labels["vigil.dev/maintenance"].as_deref(),
            Some("terminating")
        );
        assert_eq!(
            d.annotations["vigil.dev/maintenance-reasons"].as_deref(),
            Some("preempted")
        );
        for phase in [Phase::None, Phase::Pending, Phase::Ongoing] {
            let d = node_desired(&k, &st(phase, vec![]), None, None);
            assert!(d.add_taints.is_empty());
            assert_eq!(d.remove_taints, vec!["vigil.dev/termination-imminent"]);
        }
        let off = KubernetesConfig {
            taint_on_termination: false,
            ..KubernetesConfig::default()
        };
        assert!(
            node_desired(&off, &st(Phase::Terminating, vec![]), None, None)
                .add_taints
                .is_empty()
        );
    }

    #[test]
    fn clearing_removes_window_and_reasons() {
        let k = KubernetesConfig::default();
        let d = node_desired(&k, &MaintenanceState::default(), Some("x"), Some(false));
        assert_eq!(d.labels["vigil.dev/maintenance"].as_deref(), Some("none"));
        assert_eq!(d.labels["vigil.dev/can-reschedule"], None);
        assert_eq!(d.annotations["vigil.dev/maintenance-window-start"], None);
        assert_eq!(d.annotations["vigil.dev/maintenance-reasons"], None);
        assert_eq!(
            d.annotations["vigil.dev/last-checkpoint"].as_deref(),
            Some("x")
        );
        assert_eq!(d.labels[PERFORM_MAINTENANCE_LABEL], None);
    }

    #[test]
    fn a_pending_notice_stands_restarts_down_only_near_its_window() {
        // 2026-11-30T10:00:00Z
        let start = 1_796_032_800_000;
        let hour = Duration::from_secs(3600);
        let pending = MaintenanceState {
            phase: Phase::Pending,
            window_start: Some("2026-11-30T10:00:00Z".into()),
            ..MaintenanceState::default()
        };
        assert!(
            !pending_near(&pending, start - 3_600_001, hour),
            "days ahead: restarts go on"
        );
        assert!(
            pending_near(&pending, start - 3_600_000, hour),
            "within the horizon"
        );
        let unknown = MaintenanceState {
            window_start: None,
            ..pending.clone()
        };
        assert!(pending_near(&unknown, 0, hour), "no date: caution wins");
        let now = tokio::time::Instant::now();
        let far = NodeFacts {
            maintenance: pending.clone(),
            pending_near: false,
            settle_until: None,
        };
        assert!(!far.in_maintenance(now));
        let near = NodeFacts {
            pending_near: true,
            ..far.clone()
        };
        assert!(near.in_maintenance(now));
    }

    #[test]
    fn interruptions_count_once_per_episode() {
        assert!(interruption_starts(Phase::None, Phase::Terminating));
        assert!(interruption_starts(Phase::Pending, Phase::Ongoing));
        assert!(!interruption_starts(Phase::Ongoing, Phase::Terminating));
        assert!(!interruption_starts(Phase::None, Phase::Pending));
    }

    #[test]
    fn settle_keeps_restarts_suppressed_after_maintenance() {
        let now = tokio::time::Instant::now();
        let f = NodeFacts {
            pending_near: false,
            maintenance: MaintenanceState::default(),
            settle_until: Some(now + Duration::from_secs(60)),
        };
        assert!(f.in_maintenance(now));
        assert!(!f.in_maintenance(now + Duration::from_secs(61)));
        assert!(!NodeFacts::default().in_maintenance(now));
    }
}
