//! The webhook sink: Slack-compatible JSON by default, PagerDuty Events v2 or generic JSON
//! (`alerts.format`), posted with retry and timeout; PagerDuty's events resolved when the
//! condition ends. The URL, the routing key and the extra headers' values are secrets: shown
//! redacted, never in a delivery's error.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{HeaderName, HeaderValue};

use super::format::{dedup_key, json_body, pagerduty_resolve, pagerduty_trigger};
use super::{Alert, AlertError, AlertKind, AlertSink, Endpoint, Resolve};
use crate::config::WebhookFormat;
use crate::redact::{Hidden, Secret};

/// A webhook: Slack-compatible by default, or PagerDuty Events v2 or generic JSON
/// (`alerts.format`). Its URL carries the token: it is only ever shown redacted, and a failed
/// delivery says why without it; so are the routing key and the extra headers' values.
pub struct WebhookSink {
    to: Endpoint,
    mention: String,
    format: WebhookFormat,
    routing_key: Secret<Hidden>,
    /// PagerDuty: the open events of each worker, (node, worker) → (kind, dedup key), resolved
    /// when the condition ends.
    open: std::sync::Mutex<OpenEvents>,
}

/// PagerDuty's open events: (node, worker) → (kind, dedup key) of each.
type OpenEvents = BTreeMap<(String, String), Vec<(AlertKind, String)>>;

impl WebhookSink {
    pub fn new(url: &str, mention: &str, timeout: Duration, attempts: u32) -> Self {
        WebhookSink {
            to: Endpoint::new("webhook", url, url, timeout, attempts),
            mention: mention.to_string(),
            format: WebhookFormat::Slack,
            routing_key: Secret::default(),
            open: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// The body's format, and PagerDuty's routing key.
    pub fn with_format(mut self, format: WebhookFormat, routing_key: &str) -> Self {
        self.format = format;
        self.routing_key = routing_key.into();
        self
    }

    /// Extra headers on every request (their values are never shown). An invalid one is left
    /// out (the config's validation names it first).
    pub fn with_headers<'a>(mut self, extra: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        for (name, value) in extra {
            let header = HeaderName::from_bytes(name.as_bytes());
            if let (Ok(n), Ok(mut v)) = (header, HeaderValue::from_str(value)) {
                v.set_sensitive(true);
                self.to.headers.insert(n, v);
            }
        }
        self
    }
}

#[async_trait]
impl AlertSink for WebhookSink {
    async fn send(&self, alert: &Alert) -> Result<(), AlertError> {
        if let (WebhookFormat::Pagerduty, Some(w)) = (self.format, &alert.worker) {
            if let Ok(mut open) = self.open.lock() {
                let events = open.entry((alert.node.clone(), w.clone())).or_default();
                let key = dedup_key(alert);
                if !events.iter().any(|(k, d)| *k == alert.kind && *d == key) {
                    events.push((alert.kind, key));
                }
            }
        }
        let body = match self.format {
            WebhookFormat::Slack => alert.webhook_body(&self.mention),
            WebhookFormat::Json => json_body(alert),
            WebhookFormat::Pagerduty => pagerduty_trigger(alert, self.routing_key.expose()),
        };
        self.to.post(&body).await
    }

    fn open_workers(&self, node: &str) -> Vec<String> {
        let Ok(open) = self.open.lock() else { return Vec::new() };
        open.keys().filter(|(n, _)| n == node).map(|(_, w)| w.clone()).collect()
    }

    /// PagerDuty: resolve the events the end covers (one per dedup key: an incident's pages have
    /// a key each, its other alerts share one, `dedup_key`); a dedup key still used by an alert
    /// the end does not cover stays open.
    async fn resolve(&self, node: &str, worker: &str, end: Resolve) {
        if self.format != WebhookFormat::Pagerduty {
            return;
        }
        let keys: BTreeSet<String> = {
            let Ok(mut open) = self.open.lock() else { return };
            let id = (node.to_string(), worker.to_string());
            let Some(events) = open.get_mut(&id) else { return };
            let ended: Vec<_> = events.extract_if(.., |(k, _)| end.covers(*k)).collect();
            let keys = ended.into_iter().map(|(_, d)| d);
            let keys = keys.filter(|d| !events.iter().any(|(_, k)| k == d)).collect();
            if events.is_empty() {
                open.remove(&id);
            }
            keys
        };
        // NB: in the background (`Endpoint::post_later`), as Alertmanager's resolves.
        let bodies = keys.iter().map(|k| pagerduty_resolve(k, self.routing_key.expose())).collect();
        let failed: fn(&AlertError, &str) = |e, worker| {
            tracing::error!(error = %e, worker, "resolving the PagerDuty incident failed");
        };
        self.to.post_later(bodies, worker, failed).await;
    }
}
