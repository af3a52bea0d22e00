//! Every Redis key Vigil reads or writes, in one place (docs/redis-keys.md mirrors this file; tests/docs.rs checks it).
//!
//! Node-scoped keys carry the node name as a hash tag (`{node}`), so in Redis Cluster all of a
//! node's keys live in one slot and its Lua scripts stay single-slot. Fleet keys are separate and
//! are only ever touched one at a time.
//!
//! NB: the one kind of key a worker writes, its status record (`<prefix>:{<node>}:status:<w>`),
//! shares no prefix with any key the agent owns, so a Redis ACL key pattern
//! (`~<prefix>:{<node>}:status:*`) can confine a worker to the records of its node and nothing
//! else (docs/security.md, "Redis ACLs"). Records under the layout before that
//! (`<prefix>:{<node>}:worker:<w>`, which the agent's per-worker marks extend) are still read
//! for one release: [`Keys::status_keys`].

#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
    node: String,
}

impl Keys {
    pub fn new(prefix: &str, node: &str) -> Keys {
        Keys { prefix: prefix.to_string(), node: node.to_string() }
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn n(&self, rest: &str) -> String {
        format!("{}:{{{}}}:{}", self.prefix, self.node, rest)
    }

    /// Worker status record (hash written by the worker). No TTL: the worker owns it.
    pub fn status(&self, worker: &str) -> String {
        self.n(&format!("status:{worker}"))
    }
    /// First stale sighting `"<heartbeat_ms>:<seen_ms>"`.
    pub fn suspect(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:suspect"))
    }
    /// Our restarts in a row that did not help, `"<count>:<since_ms>:<last_ms>:<past>"`
    /// (`crate::hang::model::Fruitless`).
    pub fn fruitless(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:fruitless"))
    }
    /// Its last gang restart's line (ms): its beats up to then may be its old incarnation's, so
    /// they never end its gang's run of fruitless restarts (`crate::hang::policy_fruitless`).
    /// The claim plus the lock's TTL, lowered to the restart's verification, raised to a failure.
    pub fn gang_line(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:gang-line"))
    }
    /// The silences the worker came back from, over its incarnations and agents,
    /// `"<since_ms>|<bucket>:<count>,…"` (`crate::hang::model_rhythm::History`).
    pub fn rhythm(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:rhythm"))
    }
    /// When each step of a restarted incident happened, `"<since>:<verdict>:<command>:<new
    /// incarnation>"` (`crate::hang::policy_lost`), from the verification to the first beat.
    pub fn lost(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:lost"))
    }
    /// Incident timer `"<start_ms>:<incident_id>"`, SET NX.
    pub fn incident(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:incident"))
    }
    /// Start of the current error state (ms).
    pub fn error_since(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:error-since"))
    }
    /// Last progress marker and when it changed: `"<since_ms>:<progress>"`.
    pub fn progress(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:progress"))
    }
    /// Cooldown marker after our restart, and the claim of that restart before it runs:
    /// `"<claim_ms>:<incident_id>:<container id>:<started_at>"`, `":done"` appended once the
    /// restart is verified.
    pub fn cooldown(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:cooldown"))
    }
    /// Failed restarts of the current incident and when the next may run:
    /// `"<incident_id>:<failures>:<not_before_ms>"`.
    pub fn retry(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:retry"))
    }
    /// The container incarnation last seen for the worker: `"<container id>:<started_at>"`.
    pub fn incarnation(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:incarnation"))
    }
    /// Time of our last restart (ms), for escalation.
    pub fn restarted(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:restarted"))
    }
    /// The escalation page for the last restart was sent.
    pub fn escalated(&self, worker: &str) -> String {
        self.n(&format!("worker:{worker}:escalated"))
    }
    /// An alert-only episode (unreachable, stalled, gpu-failed) is open and was alerted.
    pub fn episode(&self, worker: &str, episode: &str) -> String {
        self.n(&format!("worker:{worker}:episode:{episode}"))
    }
    /// Alert de-duplication per incident and alert kind.
    pub fn alert_dedup(&self, incident: &str, kind: &str) -> String {
        self.n(&format!("alert:{incident}:{kind}"))
    }
    /// Since when every worker of the node has been idle (opportunistic maintenance).
    pub fn idle_since(&self) -> String {
        self.n("idle-since")
    }
    /// Per-node execution lock (random token).
    pub fn lock(&self) -> String {
        self.n("lock")
    }
    /// Per-node circuit breaker for one UTC day.
    pub fn breaker(&self, day: &str) -> String {
        self.n(&format!("breaker:{day}"))
    }
    /// Breaker-open alert de-duplication for one UTC day.
    pub fn breaker_alert(&self, day: &str) -> String {
        self.n(&format!("breaker:{day}:alerted"))
    }
    /// The decision trail stream.
    pub fn trail(&self) -> String {
        self.n("trail")
    }
    /// The agent heartbeat record of this node (hash, TTL `fleet.heartbeat_ttl`).
    pub fn agent(&self) -> String {
        self.n("agent")
    }
    /// Index of every node's last heartbeat (sorted set, score = ms).
    pub fn fleet_nodes(&self) -> String {
        format!("{}:fleet:nodes", self.prefix)
    }
    /// Each node's last known slice (hash node → slice), kept when the record expires.
    pub fn fleet_slices(&self) -> String {
        format!("{}:fleet:slices", self.prefix)
    }
    /// Which node exports each drill target's last result (hash: target → node): a later drill
    /// whose first node differs removes the result from the former one.
    pub fn fleet_drills(&self) -> String {
        format!("{}:fleet:drills", self.prefix)
    }
    /// Opportunistic-maintenance claim of a pool (SET NX).
    pub fn maintenance_claim(&self, pool: &str) -> String {
        format!("{}:pool:{pool}:maintenance-claim", self.prefix)
    }
    /// Fleet-wide restart budget for one window.
    pub fn fleet_budget(&self, window: i64) -> String {
        format!("{}:fleet:budget:{window}", self.prefix)
    }
    /// One shard of a gang's fleet view (hash `<node>/<worker>` → the member's entry, JSON;
    /// TTL refreshed by every write). The shard number is in the hash tag, so a large gang's
    /// shards spread over Redis Cluster's slots (`crate::hang::policy_gang::shard_of`).
    pub fn gang_members(&self, gang: &str, shard: u32) -> String {
        format!("{}:gang:{{{gang}#{shard}}}:members", self.prefix)
    }
    /// A gang's incident `"<start_ms>:<incident_id>"`, SET NX: one per collective stop.
    pub fn gang_incident(&self, gang: &str) -> String {
        self.g(gang, "incident")
    }
    /// The gang's restart decision for its incident `"<decided_ms>:<incident_id>"`, SET NX.
    pub fn gang_decision(&self, gang: &str) -> String {
        self.g(gang, "decision")
    }
    /// When the gang was last restarted (ms; written when that incident closes), for the
    /// escalation page of a gang that hangs again.
    pub fn gang_restarted(&self, gang: &str) -> String {
        self.g(gang, "restarted")
    }
    /// The gang's reader for one poll interval (SET NX, the node's name): while a gang is in
    /// trouble, one member's agent reads its whole view; the others read only its state.
    pub fn gang_reader(&self, gang: &str) -> String {
        self.g(gang, "reader")
    }
    /// The gang's restarts in a row that brought no member past where it stopped
    /// (`crate::hang::policy_fruitless`; the shape of a worker's run), counted at each decision.
    pub fn gang_fruitless(&self, gang: &str) -> String {
        self.g(gang, "fruitless")
    }
    /// The gang's open slow episode (fail-slow, `gang.pace`):
    /// `<since_ms>:<rate>:<baseline>|<node>/<worker>` (rates in thousandths of a step per second;
    /// the member paged, or `-`), SET NX by the first member's agent to find the gang slow,
    /// compare-and-deleted by the first back at its pace.
    pub fn gang_slow(&self, gang: &str) -> String {
        self.g(gang, "slow")
    }
    /// The lock of the gang's decision (random token).
    pub fn gang_lock(&self, gang: &str) -> String {
        self.g(gang, "lock")
    }
    /// The gang's breaker for one UTC day (`gang.breaker_per_day`).
    pub fn gang_breaker(&self, gang: &str, day: &str) -> String {
        self.g(gang, &format!("breaker:{day}"))
    }
    /// Alert de-duplication of a gang's pages, per incident (or decision) and kind.
    pub fn gang_alert(&self, gang: &str, about: &str, kind: &str) -> String {
        self.g(gang, &format!("alert:{about}:{kind}"))
    }
    /// The gang's open checkpoint round (JSON `crate::maintenance::model_round::Round`), SET NX
    /// with the round's budget as TTL: a notice on any member's node opens one round for the
    /// whole gang; a notice meanwhile on another member's node joins it.
    pub fn gang_checkpoint(&self, gang: &str) -> String {
        self.g(gang, "checkpoint")
    }
    fn g(&self, gang: &str, rest: &str) -> String {
        format!("{}:gang:{{{gang}}}:{rest}", self.prefix)
    }
    /// The last checkpoint drills run from this node (hash: target → JSON
    /// `crate::maintenance::model_round::DrillResult`), exported by this node's agent as
    /// `vigil_checkpoint_drill_seconds` and `vigil_checkpoint_drill_fits`.
    pub fn drills(&self) -> String {
        self.n("drills")
    }
    /// Fleet budget-exhausted alert de-duplication for one window.
    pub fn fleet_budget_alert(&self, window: i64) -> String {
        format!("{}:fleet:budget:{window}:alerted", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::Keys;

    #[test]
    fn node_keys_share_one_hash_tag() {
        let k = Keys::new("vigil", "gpu-7");
        for key in [k.status("w"), k.incident("w"), k.lock(), k.breaker("2026-11-30"), k.trail()] {
            assert!(key.starts_with("vigil:{gpu-7}:"), "{key}");
        }
        assert_eq!(k.status("trainer-0"), "vigil:{gpu-7}:status:trainer-0");
        assert_eq!(k.fleet_budget(42), "vigil:fleet:budget:42");
        assert_eq!(k.gang_members("ml/llm", 3), "vigil:gang:{ml/llm#3}:members");
        assert_eq!(k.gang_decision("ml/llm"), "vigil:gang:{ml/llm}:decision");
    }

    #[test]
    fn no_agent_key_of_a_node_starts_like_a_status_record() {
        // The worker ACL's key pattern is `<prefix>:{<node>}:status:*`.
        let k = Keys::new("vigil", "gpu-7");
        let pattern = "vigil:{gpu-7}:status:";
        assert!(k.status("w").starts_with(pattern));
        for key in [
            k.suspect("w"),
            k.incident("w"),
            k.error_since("w"),
            k.progress("w"),
            k.cooldown("w"),
            k.retry("w"),
            k.incarnation("w"),
            k.restarted("w"),
            k.escalated("w"),
            k.episode("w", "stalled"),
            k.alert_dedup("status", "hung"),
            k.idle_since(),
            k.lock(),
            k.breaker("2026-11-30"),
            k.breaker_alert("2026-11-30"),
            k.trail(),
            k.agent(),
            k.fleet_nodes(),
            k.fleet_slices(),
            k.maintenance_claim("status"),
            k.fleet_budget(1),
            k.fleet_budget_alert(1),
            k.gang_members("ns/job", 0),
            k.gang_incident("ns/job"),
            k.gang_lock("ns/job"),
        ] {
            assert!(!key.starts_with(pattern), "{key}");
        }
    }
}
