//! `[log]`: the agent's own log lines.

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

use super::{bad, ConfigError, Env};

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    #[educe(Default(expression = LogFormat::Text))]
    pub(crate) format: LogFormat,
    /// A `tracing` filter such as `info` or `vigil=debug`; env `RUST_LOG` wins when it reads as
    /// one (one that does not is reported, and this runs: [`LogConfig::filter`]).
    #[educe(Default(expression = "info".into()))]
    pub(crate) level: String,
}

impl LogConfig {
    /// A `level` the logger can read (`format` is checked as it is parsed). NB: one it could not
    /// read fell back to `info` without a word, so `vigil=dbug` hid the debug lines asked for.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let Err(e) = EnvFilter::try_new(&self.level) else { return Ok(()) };
        let why = format!("is not a tracing filter (such as `info` or `vigil=debug,info`): {e}");
        bad("log.level", why)
    }

    /// The logger's filter: `RUST_LOG` when it is set (empty counts as unset) and reads as a
    /// filter, else `level`; and, for a `RUST_LOG` that does not read, the warning to give. NB:
    /// it fell back to `level` without a word, so `RUST_LOG=vigil=dbug` looked like a quiet agent.
    pub(crate) fn filter(&self, env: &dyn Env) -> (EnvFilter, Option<String>) {
        let level = EnvFilter::try_new(&self.level).unwrap_or_else(|_| EnvFilter::new("info"));
        let Some(text) = env.get("RUST_LOG").filter(|t| !t.trim().is_empty()) else {
            return (level, None);
        };
        match EnvFilter::try_new(&text) {
            Ok(filter) => (filter, None),
            Err(e) => {
                let shown = &self.level;
                let why = format!("RUST_LOG={text:?} is not a tracing filter ({e}): set aside, logging with log.level = {shown:?}");
                (level, Some(why))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_names_keys, env};
    use super::LogConfig;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[log]\nformat = \"xml\"", "log.format"),
            ("[log]\nlevel = \"vigil=dbug\"", "log.level"),
        ]);
    }

    #[test]
    fn rust_log_wins_when_it_reads_and_is_reported_when_it_does_not() {
        let log = LogConfig { level: "vigil=debug,info".into(), ..LogConfig::default() };
        let (filter, said) = log.filter(&env(&[("RUST_LOG", "warn")]));
        assert_eq!((filter.to_string(), said), ("warn".to_string(), None));
        for unset in [env(&[]), env(&[("RUST_LOG", " ")])] {
            let (filter, said) = log.filter(&unset);
            assert_eq!((filter.to_string(), said), ("vigil=debug,info".to_string(), None));
        }
        let (filter, said) = log.filter(&env(&[("RUST_LOG", "vigil=dbug")]));
        assert_eq!(filter.to_string(), "vigil=debug,info", "log.level runs instead");
        let said = said.expect("a RUST_LOG set aside is said");
        let named = [
            "RUST_LOG=\"vigil=dbug\"",
            "not a tracing filter (",
            "log.level = \"vigil=debug,info\"",
        ];
        for what in named {
            assert!(said.contains(what), "{what}: {said}");
        }
    }
}
