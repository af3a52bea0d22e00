//! Every Redis key Vigil reads or writes, in one place (docs/redis-keys.md mirrors this file; tests/docs.rs checks it).
//!
//! Node-scoped keys carry the node name as a hash tag (`{node}`), so in Redis Cluster all of a
//! node's keys live in one slot and its Lua scripts stay single-slot. Fleet keys are separate and
//! are only ever touched one at a time.
//!
//! NB: the one kind of key a worker writes, its status record (`<prefix>:{<node>}:status:<w>`),
//! shares no prefix with any key the agent owns, so a Redis ACL key pattern
//! (`~<prefix>:{<node>}:status:*`) can confine a worker to the records of its node and nothing
//! else (docs/security.md, "Redis ACLs").

use std::fmt::Arguments;

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

    /// A key of the node: under its hash tag.
    fn n(&self, rest: Arguments) -> String {
        format!("{}:{{{}}}:{}", self.prefix, self.node, rest)
    }

    /// A key outside the node's hash tag (the fleet's, a pool's, a gang's): the prefix alone.
    fn f(&self, rest: Arguments) -> String {
        format!("{}:{rest}", self.prefix)
    }
}

/// One `pub fn` per key, each key's text written once: `name(args) => helper "text"`, the
/// text formatted with the arguments under `n` (the node's hash tag) or `f` (the prefix alone).
macro_rules! keys {
    ($($(#[$doc:meta])* $vis:vis $name:ident($($arg:ident: $ty:ty),*)
        => $at:ident $text:literal;)*) => {
        impl Keys {
            $($(#[$doc])* $vis fn $name(&self, $($arg: $ty),*) -> String {
                self.$at(format_args!($text))
            })*
        }
    };
}

keys! {
    /// Worker status record (hash written by the worker). No TTL: the worker owns it.
    pub status(worker: &str) => n "status:{worker}";
    /// First stale sighting `"<heartbeat_ms>:<seen_ms>"`.
    pub suspect(worker: &str) => n "worker:{worker}:suspect";
    /// Our restarts in a row that did not help, `"<count>:<since_ms>:<last_ms>:<past>"`
    /// (`crate::hang::model::Fruitless`).
    pub fruitless(worker: &str) => n "worker:{worker}:fruitless";
    /// Its last gang restart's line (ms): its beats up to then may be its old incarnation's, so
    /// they never end its gang's run of fruitless restarts (`crate::hang::policy_fruitless`).
    /// The claim plus the lock's TTL, lowered to the restart's verification, raised to a failure.
    pub gang_line(worker: &str) => n "worker:{worker}:gang-line";
    /// The silences the worker came back from, over its incarnations and agents,
    /// `"<since_ms>|<longest_ms>|<bucket>:<count>,…"` (`crate::hang::model_rhythm::History`).
    pub rhythm(worker: &str) => n "worker:{worker}:rhythm";
    /// When each step of a restarted incident happened, `"<since>:<verdict>:<command>:<new
    /// incarnation>"` (`crate::hang::policy_lost`), from the verification to the first beat.
    pub lost(worker: &str) => n "worker:{worker}:lost";
    /// Incident timer `"<start_ms>:<incident_id>"`, SET NX.
    pub incident(worker: &str) => n "worker:{worker}:incident";
    /// Start of the current error state (ms).
    pub error_since(worker: &str) => n "worker:{worker}:error-since";
    /// Last progress marker and when it changed: `"<since_ms>:<progress>"`.
    pub progress(worker: &str) => n "worker:{worker}:progress";
    /// Cooldown marker after our restart, and the claim of that restart before it runs:
    /// `"<claim_ms>:<incident_id>:<container id>:<started_at>"`, `":done"` appended once the
    /// restart is verified; `"<ms>:external"` for someone else's restart.
    pub cooldown(worker: &str) => n "worker:{worker}:cooldown";
    /// Failed restarts of the current incident and when the next may run:
    /// `"<incident_id>:<failures>:<not_before_ms>"`.
    pub retry(worker: &str) => n "worker:{worker}:retry";
    /// The container incarnation last seen for the worker: `"<container id>:<started_at>"`.
    pub incarnation(worker: &str) => n "worker:{worker}:incarnation";
    /// Time of our last restart (ms), for escalation.
    pub restarted(worker: &str) => n "worker:{worker}:restarted";
    /// The escalation page for the last restart was sent.
    pub escalated(worker: &str) => n "worker:{worker}:escalated";
    /// An alert-only episode (unreachable, stalled, gpu-failed) is open and was alerted.
    pub episode(worker: &str, episode: &str) => n "worker:{worker}:episode:{episode}";
    /// Alert de-duplication per incident and alert kind.
    pub alert_dedup(incident: &str, kind: &str) => n "alert:{incident}:{kind}";
    /// Since when every worker of the node has been idle (opportunistic maintenance).
    pub idle_since() => n "idle-since";
    /// Per-node execution lock (random token).
    pub lock() => n "lock";
    /// Per-node circuit breaker for one UTC day.
    pub breaker(day: &str) => n "breaker:{day}";
    /// Breaker-open alert de-duplication for one UTC day.
    pub breaker_alert(day: &str) => n "breaker:{day}:alerted";
    /// The decision trail stream.
    pub trail() => n "trail";
    /// The agent heartbeat record of this node (hash, TTL `fleet.heartbeat_ttl`).
    pub agent() => n "agent";
    /// Index of every node's last heartbeat (sorted set, score = ms).
    pub fleet_nodes() => f "fleet:nodes";
    /// Each node's last known slice (hash node → slice), kept when the record expires.
    pub fleet_slices() => f "fleet:slices";
    /// Which node exports each drill target's last result (hash: target → node): a later drill
    /// whose first node differs removes the result from the former one.
    pub fleet_drills() => f "fleet:drills";
    /// Opportunistic-maintenance claim of a pool (SET NX).
    pub maintenance_claim(pool: &str) => f "pool:{pool}:maintenance-claim";
    /// Fleet-wide restart budget for one window.
    pub fleet_budget(window: i64) => f "fleet:budget:{window}";
    /// One shard of a gang's fleet view (hash `<node>/<worker>` → the member's entry, JSON;
    /// TTL refreshed by every write; a departed member's entry removed by the gang's reader,
    /// `crate::hang::restart::gang_reads`). The shard number is in the hash tag, so a large
    /// gang's shards spread over Redis Cluster's slots (`crate::hang::policy_gang::shard_of`).
    pub gang_members(gang: &str, shard: u32) => f "gang:{{{gang}#{shard}}}:members";
    /// A gang's incident `"<start_ms>:<incident_id>"`, SET NX: one per collective stop.
    pub gang_incident(gang: &str) => f "gang:{{{gang}}}:incident";
    /// The gang's restart decision for its incident `"<decided_ms>:<incident_id>"`, SET NX;
    /// `"<decided_ms>:<incident_id>|<node>/<worker>"` when only that member is restarted (its
    /// controller restarts every member: `crate::hang::model_gang::Decision`).
    pub gang_decision(gang: &str) => f "gang:{{{gang}}}:decision";
    /// When the gang was last restarted (ms; written when that incident closes), for the
    /// escalation page of a gang that hangs again.
    pub gang_restarted(gang: &str) => f "gang:{{{gang}}}:restarted";
    /// The gang's reader for one poll interval (SET NX, the node's name): while a gang is in
    /// trouble, one member's agent reads its whole view; the others read only its state.
    pub gang_reader(gang: &str) => f "gang:{{{gang}}}:reader";
    /// The gang's restarts in a row that brought no member past where it stopped
    /// (`crate::hang::policy_fruitless`; the shape of a worker's run), counted at each decision.
    pub gang_fruitless(gang: &str) => f "gang:{{{gang}}}:fruitless";
    /// The gang's open slow episode (fail-slow, `gang.pace`):
    /// `<since_ms>:<rate>:<baseline>:<opener>@<opened_ms>|<named>|<points>|<why>` (rates in
    /// thousandths of a step per second; `<opener>` and `<named>` members as `<node>/<worker>`;
    /// `|-` when none is named, `|?` while naming: `crate::hang::model_slow`), SET NX by the
    /// first member's agent to find the gang slow, compare-and-deleted by that agent once its
    /// member is back at its pace.
    pub gang_slow(gang: &str) => f "gang:{{{gang}}}:slow";
    /// The lock of the gang's decision (random token).
    pub gang_lock(gang: &str) => f "gang:{{{gang}}}:lock";
    /// The gang's breaker for one UTC day (`gang.breaker_per_day`).
    pub gang_breaker(gang: &str, day: &str) => f "gang:{{{gang}}}:breaker:{day}";
    /// Alert de-duplication of a gang's pages, per incident (or decision) and kind.
    pub gang_alert(gang: &str, about: &str, kind: &str) => f "gang:{{{gang}}}:alert:{about}:{kind}";
    /// The gang's open checkpoint round (JSON `crate::maintenance::model_round::Round`), SET NX
    /// with the round's budget as TTL: a notice on any member's node opens one round for the
    /// whole gang; a notice meanwhile on another member's node joins it.
    pub gang_checkpoint(gang: &str) => f "gang:{{{gang}}}:checkpoint";
    /// The last checkpoint drills run from this node (hash: target → JSON
    /// `crate::vocab::maintenance::DrillResult`), exported by this node's agent as
    /// `vigil_checkpoint_drill_seconds` and `vigil_checkpoint_drill_fits`.
    pub drills() => n "drills";
    /// Fleet budget-exhausted alert de-duplication for one window.
    pub fleet_budget_alert(window: i64) => f "fleet:budget:{window}:alerted";
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
