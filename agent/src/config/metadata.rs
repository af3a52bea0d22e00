//! `[metadata]`: the GCE metadata server's maintenance and preemption notices.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad_if, ConfigError, Switch};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    /// `auto` (watch; unreachable is said once and probed again with backoff), `on`, or `off`.
    #[educe(Default(expression = Switch::Auto))]
    pub(crate) enabled: Switch,
    /// Metadata server `host[:port]`; env `GCE_METADATA_HOST`; empty = `metadata.google.internal`.
    pub(crate) host: String,
    /// Long-poll `timeout_sec` for each watch request.
    #[educe(Default(expression = 60))]
    pub(crate) timeout_sec: u32,
    /// A PENDING notice stands restarts down only once its window starts within this long
    /// (GCE posts them days ahead).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(3600)))]
    pub(crate) pending_horizon: Duration,
    /// After a maintenance event ends, restarts stay suppressed this long.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(300)))]
    pub settle: Duration,
    /// At start-up, restarts wait for the metadata server's first answer and the Node's first
    /// read at most this long (`node::controller::first_reads`).
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(30)))]
    pub first_read_wait: Duration,
}

impl MetadataConfig {
    /// A long-poll timeout the metadata server accepts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let why = "must be between 1 and 3600";
        bad_if(self.timeout_sec == 0 || self.timeout_sec > 3600, "metadata.timeout_sec", why)?;
        // NB: a hung worker waits this long at every start of the agent when a source never
        // answers; longer than ten minutes is a mistake, not a policy.
        let too_long = self.first_read_wait > Duration::from_secs(600);
        bad_if(too_long, "metadata.first_read_wait", "must be at most 10m")
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_names_keys;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[metadata]\nenabled = \"yes\"", "metadata.enabled"),
            ("[metadata]\ntimeout_sec = 0", "metadata.timeout_sec"),
            ("[metadata]\ntimeout_sec = 3601", "metadata.timeout_sec"),
            ("[metadata]\nfirst_read_wait = \"11m\"", "metadata.first_read_wait"),
            ("[metadata]\nfirst_read_wait = \"soon\"", "metadata.first_read_wait"),
        ]);
    }
}
