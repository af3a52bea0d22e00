//! Opportunistic maintenance (opt-in): when a rescheduleable maintenance is pending, the node has
//! been idle long enough and the pool keeps `min_nodes` other nodes serving, take the pool's
//! claim (atomically: two idle nodes of a pool never go together) and ask GKE to perform the
//! maintenance now. The node controller publishes the label this asks for. The claim is renewed
//! every poll until the maintenance is over, so it never lapses under a label that is still on,
//! and an agent restarted while its node held it adopts it.
//!
//! Idle is the pure `crate::maintenance::policy_idle::idle_check` of what every witness says, gathered here:
//! the workers' records (through the runtime and the coordinator), the kubelet's PodResources
//! API, the pods of this node from the Kubernetes API, and NVML (the GPU report the controller
//! hands in). A witness that cannot answer is logged once when it stops answering and once when
//! it answers again; every change of the verdict is noted for the trail (`idle-check`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::accel::gpu::model::GpuStatus;
use crate::clock::{human, ms, Millis};
use crate::config::Config;
use crate::coord::lease::Lease;
use crate::coord::{Coordinator, Keys};
use crate::fleet::view as fleet;
use crate::kube::podresources::PodResourcesClient;
use crate::kube::pods::PodApi;
use crate::maintenance::policy::{
    claim_done, claim_holder, claim_token, opportunistic_due, reschedulable, serves, still_held,
};
use crate::maintenance::policy_idle::{
    idle_check, Busy, BusyReason, IdleInputs, PodKey, Witness, WorkerUse,
};
use crate::metrics::Metrics;
use crate::runtime::ContainerRuntime;
use crate::vocab::maintenance::{MaintenanceState, Phase};

/// What a tick changed about the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClaimStep {
    Unchanged,
    /// This node took the pool's claim: the label goes on.
    Claimed(String),
    /// This node no longer holds it (expired, taken over, or the episode ended): the label
    /// this node set goes.
    Released(String),
}

/// The pool's claim while this node holds it.
struct Claim {
    key: String,
    /// Its value ([`claim_token`]), naming this node.
    token: String,
    /// When Redis last confirmed it (taken, adopted or renewed).
    renewed: Instant,
    /// When this agent took or adopted it (the coordinator's clock).
    taken: Millis,
}

impl Claim {
    fn new(key: String, token: String, taken: Millis) -> Claim {
        Claim { key, token, renewed: Instant::now(), taken }
    }
}

pub(crate) struct Opportunistic {
    cfg: Config,
    keys: Keys,
    coord: Arc<dyn Coordinator>,
    runtime: Arc<dyn ContainerRuntime>,
    /// The Kubernetes API: the node's pods that request accelerators.
    pub(crate) pod_api: Option<Arc<dyn PodApi>>,
    /// The kubelet's PodResources API: the pods holding accelerator devices.
    pub(crate) kubelet: Option<Arc<PodResourcesClient>>,
    metrics: Arc<Metrics>,
    /// The pool's claim while this node holds it.
    claimed: Option<Claim>,
    /// When the agent started (for [`claim_done`]).
    started: Instant,
    /// The last idle verdict of this episode (`None`: none checked yet).
    last: Option<Busy>,
    /// A change of the verdict, for the trail (taken by the controller).
    pub(crate) note: Option<String>,
    /// The pool the claim is for (`fleet.pool`, else the Node's pool label once read, as
    /// `crate::node::policy_info::place` says); empty until known, and no claim is taken while
    /// it is.
    pub(crate) pool: String,
    /// The missing pool was said (once).
    said_no_pool: bool,
}

impl Opportunistic {
    pub fn new(
        cfg: &Config,
        coord: Arc<dyn Coordinator>,
        runtime: Arc<dyn ContainerRuntime>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Opportunistic {
            keys: Keys::new(&cfg.redis.key_prefix, &cfg.node_name),
            cfg: cfg.clone(),
            coord,
            runtime,
            pod_api: None,
            kubelet: None,
            metrics,
            claimed: None,
            started: Instant::now(),
            last: None,
            note: None,
            pool: cfg.fleet.pool.clone(),
            said_no_pool: false,
        }
    }

    /// Give the claim back (the episode it was taken for is over).
    pub(crate) async fn release(&mut self, why: &str) -> ClaimStep {
        let Some(c) = self.claimed.take() else { return ClaimStep::Unchanged };
        let _ = self.coord.del_if_owner(&c.key, &c.token).await;
        ClaimStep::Released(why.to_string())
    }

    /// One poll of the claim this node holds: released once its maintenance is over, renewed
    /// (compare-and-renew) until then, so that it never lapses while the label is on and a
    /// second node of the pool claims meanwhile.
    async fn hold(&mut self, st: &MaintenanceState) -> ClaimStep {
        if self.maintenance_over(st) {
            return self.release("maintenance done; pool claim released").await;
        }
        let ttl = self.cfg.opportunistic.claim_ttl;
        // NB: a request GKE does not act on (a notice it cannot start early, an eviction a PDB
        // blocks) must not hold the pool's turn until the window: it is given back after
        // `claim_ttl`, and the idle check decides again.
        if st.phase == Phase::Pending && self.waited(ttl).await {
            // NB: idle_for again before this node claims again: the pool's other idle nodes
            // get their turn first, not a label off and on at this node's next poll.
            let _ = self.coord.del(&[self.keys.idle_since()]).await;
            let why = "the maintenance did not start within opportunistic.claim_ttl of the request; pool claim given back";
            return self.release(why).await;
        }
        let Some(c) = self.claimed.as_mut() else { return ClaimStep::Unchanged };
        let renewed = self.coord.renew_if_owner(&c.key, &c.token, ttl).await.ok();
        if renewed == Some(true) {
            c.renewed = Instant::now();
        }
        if still_held(renewed, c.renewed.elapsed(), ttl, self.cfg.poll_interval) {
            return ClaimStep::Unchanged;
        }
        // NB: not released: either it is no longer ours, or Redis does not answer and it
        // lapses on its own after the label is off.
        self.claimed = None;
        ClaimStep::Released(match renewed {
            Some(_) => "the pool claim expired or was taken".into(),
            None => "Redis did not renew the pool claim: the label goes before it can lapse".into(),
        })
    }

    /// Whether the maintenance a held (or adopted) claim was taken for is over ([`claim_done`]).
    fn maintenance_over(&self, st: &MaintenanceState) -> bool {
        claim_done(st.phase, self.started.elapsed(), self.cfg.metadata.first_read_wait)
    }

    /// Whether the claim held was taken `ttl` ago or more (no answer: not known to be).
    async fn waited(&self, ttl: Duration) -> bool {
        let Some(c) = &self.claimed else { return false };
        let now = self.coord.time().await.ok();
        now.is_some_and(|now| now - c.taken >= ms(ttl))
    }

    /// Each poll while holding none (once the pool is known): a claim of this node's pool that
    /// names this node was taken by an agent of this node that is gone (this one before it
    /// restarted, or the other of an HA pair), and its label is still on the Node. It is adopted —
    /// held and renewed until its maintenance is over, as if taken now — or, when that is over
    /// already, released; either way its label is this agent's to take off. `None`: nothing
    /// to adopt (or Redis did not answer: asked again at the next poll).
    ///
    /// NB: adopted rather than released at once: the node may be in the maintenance it asked
    /// for, and a released claim would let a second node of the pool go too. Only once its
    /// holder has not renewed it for two polls: a live one (the other agent of an HA pair)
    /// keeps it, and two agents renewing one claim would fight over its label.
    async fn adopt(&mut self, st: &MaintenanceState) -> Option<ClaimStep> {
        let key = self.keys.maintenance_claim(&self.pool);
        let value = self.coord.get(&key).await.ok()?;
        let token = value.filter(|v| claim_holder(v) == Some(self.cfg.node_name.as_str()))?;
        let left = self.coord.owner_ttl(&key, &token).await.ok()??;
        let unrenewed = ms(self.cfg.opportunistic.claim_ttl) - left;
        if unrenewed <= ms(self.cfg.poll_interval * 2) {
            return None;
        }
        let c = Claim::new(key, token, self.coord.time().await.ok()?);
        if self.maintenance_over(st) {
            self.claimed = Some(c);
            let why = "the pool claim taken before the agent restarted is released: its maintenance is over";
            return Some(self.release(why).await);
        }
        // Compare-and-renew: a claim that lapsed since it was read is no longer this node's.
        let ttl = self.cfg.opportunistic.claim_ttl;
        let renewed = self.coord.renew_if_owner(&c.key, &c.token, ttl).await;
        // Not renewed (lapsed since it was read, or no answer): asked again at the next poll.
        if !matches!(renewed, Ok(true)) {
            return None;
        }
        self.claimed = Some(c);
        let pool = &self.pool;
        let detail = format!("adopted pool {pool}'s claim, taken by this node before the agent restarted: held until the maintenance is over");
        Some(ClaimStep::Claimed(detail))
    }

    /// One tick of the opportunistic rule for the current maintenance state; `gpus` is NVML as
    /// a witness (`crate::maintenance::policy_idle::gpu_witness`).
    pub(crate) async fn tick(
        &mut self,
        st: &MaintenanceState,
        gpus: Witness<Vec<GpuStatus>>,
    ) -> ClaimStep {
        if !self.cfg.opportunistic.enabled {
            return ClaimStep::Unchanged;
        }
        if self.claimed.is_some() {
            return self.hold(st).await;
        }
        if self.pool.is_empty() {
            // NB: no pool, no claim: before the first read of the Node (or on a Node without
            // GKE's pool label) the min_nodes rule has nothing to count.
            if reschedulable(st) && !self.said_no_pool {
                tracing::warn!("opportunistic maintenance waits: the node's pool is not known yet (fleet.pool unset, and no cloud.google.com/gke-nodepool label read from the Node)");
                self.said_no_pool = true;
            }
            return ClaimStep::Unchanged;
        }
        if let Some(step) = self.adopt(st).await {
            return step;
        }
        if !reschedulable(st) {
            // A stale idle-since from an earlier episode must not skip `idle_for` next time.
            let _ = self.coord.del(&[self.keys.idle_since()]).await;
            // The rescheduleable episode ended: the next one starts from scratch.
            if self.last.take().is_some() {
                for &r in BusyReason::ALL {
                    self.metrics.maintenance.busy(r.as_str(), false);
                }
            }
            return ClaimStep::Unchanged;
        }
        let Some((now, since)) = self.idle_since(gpus).await else { return ClaimStep::Unchanged };
        // NB: the fleet is read only once the node has been idle long enough to claim: an idle
        // node does not read every record of the fleet every tick.
        if now - since < ms(self.cfg.opportunistic.idle_for) {
            return ClaimStep::Unchanged;
        }
        let Some(others) = self.others_serving(now).await else { return ClaimStep::Unchanged };
        if !opportunistic_due(&self.cfg.opportunistic, now, since, others) {
            return ClaimStep::Unchanged;
        }
        self.claim(now, now - since, others).await
    }

    /// Since when the node has been idle, on the coordinator's clock (the first observer's
    /// time stands); `None` when not idle or unreadable.
    async fn idle_since(&mut self, gpus: Witness<Vec<GpuStatus>>) -> Option<(Millis, Millis)> {
        let now = self.coord.time().await.ok()?;
        let idle_key = self.keys.idle_since();
        let busy = idle_check(&IdleInputs {
            workers: self.workers().await.into(),
            pod_resources: self.pod_resources().await,
            pods: self.pods().await,
            gpus,
        });
        let idle = busy.idle();
        self.record(busy);
        if !idle {
            let _ = self.coord.del(&[idle_key]).await;
            return None;
        }
        let day = Duration::from_secs(24 * 3600);
        let _ = self.coord.set_nx(&idle_key, &now.to_string(), day).await;
        let since =
            self.coord.get(&idle_key).await.ok()?.and_then(|s| s.parse().ok()).unwrap_or(now);
        Some((now, since))
    }

    /// The running opted-in workers and what their records say, or why they cannot be read.
    async fn workers(&self) -> Result<Vec<WorkerUse>, String> {
        let listed = self.runtime.list_workers().await;
        let listed = listed.map_err(|e| format!("cannot list the workers: {e}"))?;
        let mut out = Vec::new();
        for c in listed.iter().filter(|c| c.running) {
            let fields = self.coord.hgetall(&self.keys.status(&c.worker)).await;
            let fields = fields.map_err(|e| format!("cannot read {}'s record: {e}", c.worker))?;
            out.push(WorkerUse {
                worker: c.worker.clone(),
                state: fields.get("state").cloned(),
                pod: c.pod_identity().map(|p| (p.namespace, p.name)),
                gpus: c.gpus.clone(),
            });
        }
        Ok(out)
    }

    /// The pods the kubelet gave accelerator devices; off without Kubernetes or without a
    /// PodResources socket (`runtime.pod_resources_socket = ""`).
    async fn pod_resources(&self) -> Witness<BTreeSet<PodKey>> {
        let Some(src) = self.kubelet.as_ref().filter(|_| self.cfg.kubernetes_on()) else {
            return Witness::Off;
        };
        src.gpus().await.map(|g| g.holders().clone()).map_err(|e| e.to_string()).into()
    }

    /// This node's non-terminal pods that request accelerators; off without Kubernetes.
    async fn pods(&self) -> Witness<BTreeSet<PodKey>> {
        if !self.cfg.kubernetes_on() {
            return Witness::Off;
        }
        let no_api =
            "no Kubernetes API client (see the start-up log), so this node's pods cannot be listed";
        let Some(api) = &self.pod_api else { return Witness::Unknown(no_api.into()) };
        match api.node_pods(&self.cfg.node_name).await {
            Ok(pods) => {
                let held = pods.into_iter().filter(|p| p.accelerators && !p.terminal());
                Witness::Known(held.map(|p| (p.namespace, p.name)).collect())
            }
            Err(e) => Witness::Unknown(format!("cannot list this node's pods: {e}")),
        }
    }

    /// Keep the verdict: the metric, a log line when a witness stops or starts answering, a
    /// trail note when the verdict changes.
    fn record(&mut self, busy: Busy) {
        for &r in BusyReason::ALL {
            let before = self.last.as_ref().is_some_and(|b| b.reasons.contains_key(&r));
            let now = busy.reasons.get(&r);
            self.metrics.maintenance.busy(r.as_str(), now.is_some());
            match (before, now) {
                (false, Some(seen)) if r.is_unknown() => tracing::warn!(
                    reason = r.as_str(),
                    detail = %seen.join("; "),
                    "opportunistic maintenance: a witness cannot answer, so the node counts as busy"
                ),
                (true, None) if r.is_unknown() => tracing::info!(
                    reason = r.as_str(),
                    "opportunistic maintenance: the witness answers again"
                ),
                _ => {}
            }
        }
        if self.last.as_ref().is_none_or(|l| l.names() != busy.names()) {
            tracing::info!(reasons = ?busy.names(), "opportunistic maintenance: {}", busy.detail());
            self.note = Some(busy.detail());
        }
        self.last = Some(busy);
    }

    /// The nodes of this node's pool that count toward `min_nodes` ([`serves`]), this one left
    /// out.
    async fn others_serving(&self, now: Millis) -> Option<usize> {
        let (views, _) = fleet::read(self.coord.as_ref(), &self.cfg.redis.key_prefix).await.ok()?;
        let others = views.into_iter().filter(|v| v.node != self.cfg.node_name);
        let same_pool = others.filter_map(|v| v.record).filter(|r| r.pool == self.pool);
        // The fleet view's health of the record with its notice left out: `serves` judges that.
        let none = || Phase::None.as_str().to_string();
        let health = |r: &fleet::NodeRecord| {
            fleet::health(Some(&fleet::NodeRecord { maintenance: none(), ..r.clone() }))
        };
        // NB: a claim lasts `claim_ttl` at least: a node whose window starts within it may go
        // while this one is away.
        let until = now + ms(self.cfg.opportunistic.claim_ttl);
        let serving =
            |r: &fleet::NodeRecord| serves(&r.maintenance, r.maintenance_window, health(r), until);
        Some(same_pool.filter(|r| serving(r)).count())
    }

    async fn claim(&mut self, now: Millis, idle: Millis, others: usize) -> ClaimStep {
        // NB: the claim is atomic (SET NX): two idle nodes of a pool never go together.
        let token = claim_token(&self.cfg.node_name, rand::random::<u32>());
        let key = self.keys.maintenance_claim(&self.pool);
        let ttl = self.cfg.opportunistic.claim_ttl;
        let taken = Lease::take(self.coord.as_ref(), key.clone(), token.clone(), ttl).await;
        let Ok(Some(_)) = taken else { return ClaimStep::Unchanged };
        self.claimed = Some(Claim::new(key, token, now));
        let (idle_time, pool) = (human(idle), &self.pool);
        let detail = format!("idle {idle_time} with {others} other node(s) of pool {pool} serving: asking GKE to perform the maintenance now");
        ClaimStep::Claimed(detail)
    }
}
