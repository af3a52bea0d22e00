//! `[gang]`: what Vigil does when a distributed job's collective (a gang: every rank of one job,
//! across nodes) stops as a whole — one decision, every rank restarted together — and when one
//! member stops while the others go on (a straggler).

use serde::{Deserialize, Serialize};

use super::{bad, ConfigError};

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

impl GangAction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            GangAction::RestartAll => "restart-all",
            GangAction::AlertOnly => "alert-only",
        }
    }
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GangConfig {
    /// Who restarts a hung gang: `restart-all` (default) or `alert-only`.
    pub action: GangAction,
    /// Gang restarts allowed per gang per UTC day (each member's restart also counts one unit
    /// on its own node's breaker).
    pub breaker_per_day: u32,
    /// A member that stopped while its peers progress: `alert-only` (default) or `restart`.
    pub straggler: StragglerAction,
}

impl Default for GangConfig {
    fn default() -> Self {
        GangConfig {
            action: GangAction::RestartAll,
            breaker_per_day: 2,
            straggler: StragglerAction::AlertOnly,
        }
    }
}

impl GangConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.breaker_per_day == 0 {
            return bad(
                "gang.breaker_per_day",
                "0 is ambiguous: use gang.action = \"alert-only\" to never restart a gang",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{key_of, parse};
    use super::*;

    #[test]
    fn defaults_and_words() {
        let c = parse("").unwrap();
        assert_eq!(c.gang.action, GangAction::RestartAll);
        assert_eq!(c.gang.straggler, StragglerAction::AlertOnly);
        let c = parse("[gang]\naction = \"alert-only\"\nstraggler = \"restart\"\n").unwrap();
        assert_eq!(c.gang.action.as_str(), "alert-only");
        assert_eq!(c.gang.straggler, StragglerAction::Restart);
        assert_eq!(
            key_of(parse("[gang]\naction = \"sometimes\"\n")),
            "gang.action"
        );
        assert_eq!(
            key_of(parse("[gang]\nbreaker_per_day = 0\n")),
            "gang.breaker_per_day"
        );
    }
}
