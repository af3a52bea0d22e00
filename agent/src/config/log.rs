//! `[log]`: the agent's own log lines.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub(crate) format: LogFormat,
    /// A `tracing` filter such as `info` or `vigil=debug`; env `RUST_LOG` wins.
    pub(crate) level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

impl LogConfig {
    /// No rule of its own: `format` is checked as it is parsed; a `level` the logger cannot read
    /// falls back to `info` there.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_names_keys;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[("[log]\nformat = \"xml\"", "log.format")]);
    }
}
