//! Opportunistic maintenance (opt-in): when a rescheduleable maintenance is pending, the node has
//! been idle long enough and the pool keeps `min_nodes` other healthy nodes, take the pool's
//! claim (atomically: two idle nodes of a pool never go together) and ask GKE to perform the
//! maintenance now. The node controller publishes the label this asks for.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{human, Millis};
use crate::config::Config;
use crate::coord::lease::Lease;
use crate::coord::{read_status, Coordinator, Keys};
use crate::model::maintenance::MaintenanceState;
use crate::model::worker::WorkerState;
use crate::observe::fleet;
use crate::policy::maintenance::{opportunistic_due, reschedulable};
use crate::runtime::ContainerRuntime;

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

pub(crate) struct Opportunistic {
    cfg: Config,
    keys: Keys,
    coord: Arc<dyn Coordinator>,
    runtime: Arc<dyn ContainerRuntime>,
    /// The claim's token while this node holds it.
    claimed: Option<Lease>,
    /// The pool the claim is for (`fleet.pool`, else the Node's pool label once read); empty
    /// until known, and no claim is taken while it is.
    pool: String,
    /// The missing pool was said (once).
    said_no_pool: bool,
}

impl Opportunistic {
    pub fn new(
        cfg: &Config,
        coord: Arc<dyn Coordinator>,
        runtime: Arc<dyn ContainerRuntime>,
    ) -> Self {
        Opportunistic {
            keys: Keys::new(&cfg.redis.key_prefix, &cfg.node_name),
            cfg: cfg.clone(),
            coord,
            runtime,
            claimed: None,
            pool: cfg.fleet.pool.clone(),
            said_no_pool: false,
        }
    }

    /// The node's pool, as `crate::policy::node_info::place` says (`fleet.pool` wins).
    pub fn set_pool(&mut self, pool: &str) {
        self.pool = pool.to_string();
    }

    fn claim_key(&self) -> String {
        self.keys.maintenance_claim(&self.pool)
    }

    /// Give the claim back (the episode it was taken for is over).
    pub async fn release(&mut self, why: &str) -> ClaimStep {
        let Some(lease) = self.claimed.take() else {
            return ClaimStep::Unchanged;
        };
        let _ = lease.release(self.coord.as_ref()).await;
        ClaimStep::Released(why.to_string())
    }

    /// One tick of the opportunistic rule for the current maintenance state.
    pub async fn tick(&mut self, st: &MaintenanceState) -> ClaimStep {
        if !self.cfg.opportunistic.enabled {
            return ClaimStep::Unchanged;
        }
        if let Some(lease) = &self.claimed {
            // The claim is a Redis key with a TTL: if it expired (or was taken), this node no
            // longer speaks for the pool, and its label must go.
            if let Ok(None) = lease.left(self.coord.as_ref()).await {
                return self.release("the pool claim expired or was taken").await;
            }
            return ClaimStep::Unchanged;
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
        if !reschedulable(st) {
            // A stale idle-since from an earlier episode must not skip `idle_for` next time.
            let _ = self.coord.del(&[self.keys.idle_since()]).await;
            return ClaimStep::Unchanged;
        }
        let Some((now, since)) = self.idle_since().await else {
            return ClaimStep::Unchanged;
        };
        // NB: the fleet is read only once the node has been idle long enough to claim: an idle
        // node does not read every record of the fleet every tick.
        if now - since < crate::clock::ms(self.cfg.opportunistic.idle_for) {
            return ClaimStep::Unchanged;
        }
        let Some(others) = self.others_healthy().await else {
            return ClaimStep::Unchanged;
        };
        if !opportunistic_due(&self.cfg.opportunistic, now, since, others) {
            return ClaimStep::Unchanged;
        }
        self.claim(now - since, others).await
    }

    /// Since when every worker has been idle, on the coordinator's clock (the first observer's
    /// time stands); `None` when not idle or unreadable.
    async fn idle_since(&self) -> Option<(Millis, Millis)> {
        let now = self.coord.time().await.ok()?;
        let idle_key = self.keys.idle_since();
        if !self.all_idle().await? {
            let _ = self.coord.del(&[idle_key]).await;
            return None;
        }
        let day = Duration::from_secs(24 * 3600);
        let _ = self.coord.set_nx(&idle_key, &now.to_string(), day).await;
        let stored = self.coord.get_many(&[idle_key]).await.ok()?;
        let since = stored
            .into_iter()
            .flatten()
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(now);
        Some((now, since))
    }

    /// True when every worker's record says idle; `None` when that cannot be read.
    async fn all_idle(&self) -> Option<bool> {
        let workers = self.runtime.list_workers().await.ok()?;
        for c in workers.iter().filter(|c| c.running) {
            let (_, fields) = read_status(self.coord.as_ref(), &self.keys, &c.worker)
                .await
                .ok()?;
            let state = fields.get("state").map(|s| WorkerState::parse(s));
            if state != Some(WorkerState::Idle) {
                return Some(false);
            }
        }
        Some(true)
    }

    /// Healthy nodes of this node's pool, this one left out.
    async fn others_healthy(&self) -> Option<usize> {
        let pool = &self.pool;
        let (views, _) = fleet::read(self.coord.as_ref(), &self.cfg.redis.key_prefix)
            .await
            .ok()?;
        let healthy = views
            .iter()
            .filter(|v| v.node != self.cfg.node_name)
            .filter(|v| v.record.as_ref().is_some_and(|r| &r.pool == pool))
            .filter(|v| v.health == "healthy")
            .count();
        Some(healthy)
    }

    async fn claim(&mut self, idle: Millis, others: usize) -> ClaimStep {
        // NB: the claim is atomic (SET NX): two idle nodes of a pool never go together.
        let token = format!("{}:{:08x}", self.cfg.node_name, rand::random::<u32>());
        let ttl = self.cfg.opportunistic.claim_ttl;
        if let Ok(Some(lease)) =
            Lease::take(self.coord.as_ref(), self.claim_key(), token, ttl).await
        {
            self.claimed = Some(lease);
            return ClaimStep::Claimed(format!(
                "idle {} with {others} other healthy node(s) in pool {}: asking GKE to perform the maintenance now",
                human(idle),
                self.pool
            ));
        }
        ClaimStep::Unchanged
    }
}
