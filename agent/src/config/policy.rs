//! `[policy]`: when a worker counts as hung, stalled or failed, and what follows a restart.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{at_least_a_second, bad_if, ConfigError};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// A working worker (any state but `idle` and `error`) whose heartbeat is older than this
    /// (or than the grace it announced) is stale.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(120)))]
    pub stale_after: Duration,
    /// Minimum gap between the two observations that confirm a hang.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(10)))]
    pub confirm_after: Duration,
    /// A confirmed hang must persist this long before a restart.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(180)))]
    pub restart_delay: Duration,
    /// A worker in state `error` this long is restarted.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30 * 60)))]
    pub error_for: Duration,
    /// Fresh heartbeat with an unchanged progress marker this long: alert (no restart).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30 * 60)))]
    pub(crate) stalled_after: Duration,
    /// After a restart, the worker is "booting" for this long (or until its first beat): no new
    /// incident.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(10 * 60)))]
    pub cooldown: Duration,
    /// A container that started this recently and has not written a record of its own yet (no
    /// record, or one older than the container) is "booting", not "unreachable": a trainer
    /// imports its framework and loads its data before its first beat.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(120)))]
    pub(crate) start_grace: Duration,
    /// Still hung this long after a restart: page a person, once.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(10 * 60)))]
    pub escalate_after: Duration,
    /// The longest silence a worker may announce for a long operation (its record's `grace`:
    /// a compile, a checkpoint save); a longer grace is cut to this.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(60 * 60)))]
    pub(crate) max_grace: Duration,
    /// Restarts in a row that brought no progress past where the worker stopped (its numeric
    /// `progress`, or its `checkpoint_step`), after which Vigil stops restarting it and pages
    /// once; the next progress past that point resets the count. 0: no limit.
    #[educe(Default(expression = 2))]
    pub max_fruitless_restarts: u32,
    /// Each worker's own rhythm: a silence learned from its beats, shorter than `stale_after`.
    pub learned: LearnedConfig,
}

/// `[policy.learned]`: call a `processing` worker stale after `multiplier` × a high quantile of
/// the silences it has come back from, within `[floor, stale_after]`, once `min_samples` of them
/// are known (`crate::hang::policy_rhythm`). Off by default: a worker with long phases it does not
/// announce (an evaluation in `processing`, without `busy(...)`) is called hung once before its
/// rhythm includes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct LearnedConfig {
    pub enabled: bool,
    /// k: the learned silence is k × the quantile.
    #[educe(Default(expression = 4.0))]
    pub multiplier: f64,
    /// The quantile of the silences the worker came back from (0.5 to 1).
    #[educe(Default(expression = 0.99))]
    pub quantile: f64,
    /// The shortest learned silence.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(5)))]
    pub floor: Duration,
    /// Silences observed before the learned one is used (5 to 256): in the worker's history,
    /// and by this agent in its current incarnation.
    #[educe(Default(expression = 30))]
    pub min_samples: u32,
    /// A hang found by the learned silence is restarted once it persisted for that silence
    /// again (at least `floor`), not after `restart_delay` and the fixed `stale_after`: only
    /// when the history the coordinator holds spans `history`.
    pub restarts: bool,
    /// How long a worker's rhythm must have been learned before it restarts anything.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(6 * 3600)))]
    pub history: Duration,
}

impl PolicyConfig {
    /// The confirming observation comes before staleness ends, and a learned rhythm in bounds
    /// (every threshold above zero: `Config::validate`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let why = "must be shorter than policy.stale_after";
        bad_if(self.confirm_after >= self.stale_after, "policy.confirm_after", why)?;
        let l = &self.learned;
        let unusable = !(l.multiplier.is_finite() && l.multiplier >= 1.5);
        bad_if(unusable, "policy.learned.multiplier", "must be at least 1.5")?;
        let why = "must be above 0.5 and at most 1";
        bad_if(!(l.quantile > 0.5 && l.quantile <= 1.0), "policy.learned.quantile", why)?;
        at_least_a_second("policy.learned.floor", l.floor)?;
        let why = "must be from 5 to 256";
        bad_if(!(5..=256).contains(&l.min_samples), "policy.learned.min_samples", why)?;
        let why = "needs policy.learned.enabled = true (a restart from a rhythm never learned)";
        bad_if(l.restarts && !l.enabled, "policy.learned.restarts", why)?;
        let why = "must be at least 1m (how long a rhythm is learned before it restarts anything)";
        bad_if(l.history < Duration::from_secs(60), "policy.learned.history", why)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::{assert_names_keys, key_of, parse};

    #[test]
    fn durations_accept_human_units() {
        let c = parse("[policy]\nstale_after = \"2m\"\nrestart_delay = \"90s\"\n").unwrap();
        assert_eq!(c.policy.stale_after, Duration::from_secs(120));
        assert_eq!(c.policy.restart_delay, Duration::from_secs(90));
    }

    #[test]
    fn zero_stale_threshold_is_rejected() {
        assert_eq!(key_of(parse("[policy]\nstale_after = \"0s\"\n")), "policy.stale_after");
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[policy]\nconfirm_after = \"5m\"", "policy.confirm_after"),
            ("[policy]\ncooldown = \"0s\"", "policy.cooldown"),
            ("[policy]\nrestart_delay = \"0s\"", "policy.restart_delay"),
            ("[policy]\nconfirm_after = \"0s\"", "policy.confirm_after"),
            ("[policy.learned]\nmultiplier = 1.0", "policy.learned.multiplier"),
            ("[policy.learned]\nquantile = 0.5", "policy.learned.quantile"),
            ("[policy.learned]\nquantile = 1.5", "policy.learned.quantile"),
            ("[policy.learned]\nfloor = \"500ms\"", "policy.learned.floor"),
            ("[policy.learned]\nrestarts = true", "policy.learned.restarts"),
            ("[policy.learned]\nenabled = true\nhistory = \"10s\"", "policy.learned.history"),
            ("[policy.learned]\nmin_samples = 1000", "policy.learned.min_samples"),
        ]);
    }
}
