//! `[log]`: the agent's own log lines.

use serde::{Deserialize, Serialize};

use super::{bad, ConfigError};

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
    /// A `tracing` filter such as `info` or `vigil=debug`; env `RUST_LOG` wins.
    #[educe(Default(expression = "info".into()))]
    pub(crate) level: String,
}

impl LogConfig {
    /// A `level` the logger can read (`format` is checked as it is parsed). NB: one it could not
    /// read fell back to `info` without a word, so `vigil=dbug` hid the debug lines asked for.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.level) else { return Ok(()) };
        let why = format!("is not a tracing filter (such as `info` or `vigil=debug,info`): {e}");
        bad("log.level", why)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_names_keys;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[log]\nformat = \"xml\"", "log.format"),
            ("[log]\nlevel = \"vigil=dbug\"", "log.level"),
        ]);
    }
}
