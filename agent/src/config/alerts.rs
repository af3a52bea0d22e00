//! `[alerts]`: where alerts go and how hard delivery tries.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use super::{bad_if, http_or_empty, ConfigError};
use crate::redact::{Hidden, Secret, Webhook};

/// The body a webhook gets (`alerts.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    #[default]
    Slack,
    Pagerduty,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, educe::Educe)]
#[educe(Default)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    /// Slack-compatible incoming webhook; empty: alerts go to the log only. A secret (the token
    /// is in its path or query): shown as `https://hooks.slack.com/***`.
    pub(crate) webhook_url: Secret<Webhook>,
    /// Alertmanager's base URL (`http://alertmanager:9093`); empty: none. Alerts are posted to
    /// its `/api/v2/alerts`, next to the webhook when both are set. A secret (it may carry
    /// credentials): shown as `http://***@alertmanager:9093/***`.
    pub(crate) alertmanager_url: Secret<Webhook>,
    /// How often a worker's open alert is re-posted to Alertmanager; keep it below
    /// Alertmanager's `resolve_timeout` (5m by default), or the alert resolves itself.
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(60)))]
    pub(crate) alertmanager_repost: Duration,
    /// The webhook's body: `slack` (the default: Slack-compatible `text`, and `vigil`),
    /// `pagerduty` (an Events API v2 event: trigger, then resolve when the incident ends) or `json`
    /// (the alert's fields, with `summary` and `status`).
    pub format: WebhookFormat,
    /// The PagerDuty integration's routing key (`format = "pagerduty"`). A secret: shown as
    /// `***`; env `VIGIL_PAGERDUTY_ROUTING_KEY` (from the Secret `vigil`).
    pub routing_key: Secret<Hidden>,
    /// Extra HTTP headers on every webhook request (`Authorization = "Bearer …"`). Secrets: the
    /// values are shown as `***`; env `VIGIL_WEBHOOK_HEADERS` (`Name: value` lines, from the
    /// Secret `vigil`) adds to them.
    pub(crate) headers: BTreeMap<String, Secret<Hidden>>,
    /// Prepended to every page (the kinds `crate::alerts::AlertKind::is_page` names), e.g.
    /// `<!here>` or `<@U123>`.
    #[educe(Default(expression = "<!here>".into()))]
    pub(crate) page_mention: String,
    #[serde(with = "super::duration")]
    #[educe(Default(expression = Duration::from_secs(10)))]
    pub timeout: Duration,
    /// Attempts per alert, with exponential backoff between them.
    #[educe(Default(expression = 3))]
    pub attempts: u32,
}

/// Pause before alert delivery attempt `attempt` (0 = first, no pause).
pub(crate) fn alert_backoff(attempt: u32) -> Duration {
    // No jitter: `lock_needed` adds these up in advance.
    crate::backoff::nth_delay(Duration::from_millis(500), Duration::from_secs(8), attempt)
}

/// The most attempts per alert and sink. NB: unbounded, `attempts = 1000000` hung `config
/// check` adding up the backoffs (`Config::lock_needed`).
const MAX_ATTEMPTS: u32 = 10;

impl AlertsConfig {
    /// At least one attempt, and a webhook that is an HTTP URL (or none).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let why = format!("must be 1 to {MAX_ATTEMPTS}: every attempt and its backoff are held inside the node lock (safety.lock_ttl)");
        bad_if(!(1..=MAX_ATTEMPTS).contains(&self.attempts), "alerts.attempts", why)?;
        http_or_empty("alerts.webhook_url", self.webhook_url.expose(), "")?;
        let why = "is needed with format = \"pagerduty\" (the integration's routing key, or env VIGIL_PAGERDUTY_ROUTING_KEY)";
        let pagerduty = self.format == WebhookFormat::Pagerduty && !self.webhook_url.is_empty();
        bad_if(pagerduty && self.routing_key.is_empty(), "alerts.routing_key", why)?;
        for (name, value) in &self.headers {
            let why = "a header name is not a valid HTTP header name";
            bad_if(HeaderName::from_bytes(name.as_bytes()).is_err(), "alerts.headers", why)?;
            let why = format!("the value of {name} is not a valid HTTP header value");
            bad_if(HeaderValue::from_str(value.expose()).is_err(), "alerts.headers", why)?;
        }
        let note = "(Alertmanager's base, e.g. http://alertmanager:9093)";
        http_or_empty("alerts.alertmanager_url", self.alertmanager_url.expose(), note)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_names_keys;

    #[test]
    fn every_invalid_value_names_its_key() {
        assert_names_keys(&[
            ("[alerts]\nattempts = 0", "alerts.attempts"),
            ("[alerts]\nattempts = 1000000", "alerts.attempts"),
            ("[alerts]\nwebhook_url = \"slack\"", "alerts.webhook_url"),
            ("[alerts]\ntimeout = \"0s\"", "alerts.timeout"),
            (
                "[alerts]\nalertmanager_url = \"alertmanager:9093\"",
                "alerts.alertmanager_url",
            ),
            (
                "[alerts]\nalertmanager_repost = \"0s\"",
                "alerts.alertmanager_repost",
            ),
            (
                "[alerts]\nwebhook_url = \"https://events.pagerduty.com/v2/enqueue\"\nformat = \"pagerduty\"",
                "alerts.routing_key",
            ),
            ("[alerts.headers]\n\"X Bad\" = \"v\"", "alerts.headers"),
            ("[alerts]\nformat = \"teams\"", "alerts.format"),
        ]);
    }
}
