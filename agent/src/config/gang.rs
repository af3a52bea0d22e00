//! `[gang]`: what Vigil does when a distributed job's collective (a gang: every rank of one job,
//! across nodes) stops as a whole — one decision, every rank restarted together — and when one
//! member stops while the others go on (a straggler), or the whole gang slows down (its pace).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{at_least_a_second, bad_if, ConfigError};

/// What the node a slow gang names gets besides its `VigilSlow` condition (`gang.pace.taint`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr,
)]
pub enum SlowTaint {
    /// No taint.
    #[default]
    #[serde(rename = "off")]
    Off,
    /// `<label_prefix>slow=true:NoSchedule`: the next placement avoids the node; what runs there
    /// stays.
    NoSchedule,
    /// `<label_prefix>slow=true:NoExecute`: every pod on the node that does not tolerate it is
    /// evicted — for jobs whose controller replaces a member on another node (a JobSet, an
    /// elastic job). Never a restart by Vigil: the eviction is the cluster's, the replacement
    /// the job's controller's.
    NoExecute,
}

impl SlowTaint {
    /// The taint's effect, as Kubernetes spells it (`None`: no taint).
    pub fn effect(self) -> Option<&'static str> {
        (self != SlowTaint::Off).then_some(self.into())
    }
}

/// Who restarts a hung gang.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GangAction {
    /// One decision for the gang, then every member restarted once by its own node's agent.
    RestartAll,
    /// Page once per gang incident and never restart (a JobSet failure policy, Pathways or an
    /// operator owns the job's restarts).
    AlertOnly,
}

/// What happens to a member that stopped while its peers still progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StragglerAction {
    /// One alert naming it; no restart (a rank restarted alone rejoins a collective whose peers
    /// are about to block on it, and breaks the job's rendezvous).
    AlertOnly,
    /// Restarted alone through the single-worker pipeline (a job that tolerates a member's
    /// restart: elastic training, independent replicas that only share an id).
    Restart,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct GangConfig {
    /// Who restarts a hung gang: `restart-all` (default) or `alert-only`.
    #[educe(Default(expression = GangAction::RestartAll))]
    pub action: GangAction,
    /// Gang restarts allowed per gang per UTC day (each member's restart also counts one unit
    /// on its own node's breaker).
    #[educe(Default(expression = 2))]
    pub breaker_per_day: u32,
    /// A member that stopped while its peers progress: `alert-only` (default) or `restart`.
    #[educe(Default(expression = StragglerAction::AlertOnly))]
    pub straggler: StragglerAction,
    /// `[gang.pace]`: a gang that slows down (fail-slow): found, paged, never restarted.
    pub pace: PaceConfig,
}

/// `[gang.pace]`: each gang member's steps per second against the baseline it has shown
/// (`crate::hang::policy_pace`); a `slow` page when its gang runs below `slow_fraction` of it for
/// `slow_for`, naming the member its evidence points to. Never a restart. Opt-in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct PaceConfig {
    pub enabled: bool,
    /// A window closes after this long (and `min_steps` steps): its rate is one sample.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30)))]
    pub window: Duration,
    #[educe(Default(expression = 20))]
    pub min_steps: u32,
    /// Windows that teach the baseline before any verdict.
    #[educe(Default(expression = 10))]
    pub learn_windows: u32,
    /// Below this fraction of the baseline a window is slow.
    #[educe(Default(expression = 0.85))]
    pub slow_fraction: f64,
    /// Slow windows in a row for this long: the gang is slow.
    #[serde(with = "super::duration")]
    // NB: scripts/bench-pace.sh: 30 s windows and 2 min find a 20 % slowdown at p50
    // 147 s, p95 282 s, with no episode in 100 simulated healthy days; 60 s windows and
    // 2 min drew 3 in 50 days of silent evaluations, 60 s and 3 min took p95 342 s.
    #[educe(Default(expression = Duration::from_secs(2 * 60)))]
    pub slow_for: Duration,
    /// A container younger than this (compile, warm-up after a restart) teaches nothing.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(5 * 60)))]
    pub warmup: Duration,
    /// While a slow gang names this node's member, and `taint_for` after, a
    /// `<label_prefix>slow=true` taint beside the `VigilSlow` condition (opt-in): `NoSchedule`,
    /// or `NoExecute` for jobs that can replace a node; `off` by default.
    pub taint: SlowTaint,
    /// How long the taint stays after the node was last named (its member gone, or back at its
    /// pace): a replacement is not placed straight back on it.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(3600)))]
    pub taint_for: Duration,
}

impl GangConfig {
    /// `breaker_per_day` above 0, and `[gang.pace]`'s fraction, windows and counts in bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let why = "0 is ambiguous: use gang.action = \"alert-only\" to never restart a gang";
        bad_if(self.breaker_per_day == 0, "gang.breaker_per_day", why)?;
        let pace = &self.pace;
        let fraction = pace.slow_fraction;
        let why = "must be above 0 and below 1 (0.85: slower than 85 % of the baseline)";
        bad_if(!(fraction > 0.0 && fraction < 1.0), "gang.pace.slow_fraction", why)?;
        at_least_a_second("gang.pace.window", pace.window)?;
        bad_if(pace.min_steps == 0, "gang.pace.min_steps", "must be at least 1")?;
        let why = "must be at least 1 (the baseline is learnt from these windows)";
        bad_if(pace.learn_windows == 0, "gang.pace.learn_windows", why)?;
        let why = "must be at least gang.pace.window";
        bad_if(pace.slow_for < pace.window, "gang.pace.slow_for", why)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, key_of, parse};
    use super::*;

    #[test]
    fn defaults_and_words() {
        let c = parse("").unwrap();
        assert_eq!(c.gang.action, GangAction::RestartAll);
        assert_eq!(c.gang.straggler, StragglerAction::AlertOnly);
        let c = parse("[gang]\naction = \"alert-only\"\nstraggler = \"restart\"\n").unwrap();
        assert_eq!(c.gang.action, GangAction::AlertOnly);
        assert_eq!(c.gang.straggler, StragglerAction::Restart);
        assert_eq!(key_of(parse("[gang]\naction = \"sometimes\"\n")), "gang.action");
        assert_eq!(key_of(parse("[gang]\nbreaker_per_day = 0\n")), "gang.breaker_per_day");
    }

    #[test]
    fn every_invalid_pace_value_names_its_key() {
        assert_names_keys(&[
            ("[gang.pace]\nmin_steps = 0", "gang.pace.min_steps"),
            ("[gang.pace]\nlearn_windows = 0", "gang.pace.learn_windows"),
            ("[gang.pace]\nslow_fraction = 1.0", "gang.pace.slow_fraction"),
            ("[gang.pace]\nwindow = \"500ms\"", "gang.pace.window"),
            ("[gang.pace]\nwindow = \"1m\"\nslow_for = \"30s\"", "gang.pace.slow_for"),
        ]);
    }
}
