//! The webhook sink: Slack-compatible JSON by default, PagerDuty Events v2 or generic JSON
//! (`alerts.format`), posted with retry and timeout; PagerDuty's events resolved when the
//! condition ends. The URL, the routing key and the extra headers' values are secrets: shown
//! redacted, never in a delivery's error.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;

use super::format::{dedup_key, json_body, pagerduty_resolve, pagerduty_trigger};
use super::{Alert, AlertError, AlertKind, AlertSink, Resolve};
use crate::config::WebhookFormat;
use crate::redact::{Hidden, Secret, Webhook};

/// A webhook: Slack-compatible by default, or PagerDuty Events v2 or generic JSON
/// (`alerts.format`). Its URL carries the token: it is only ever shown redacted, and a failed
/// delivery says why without it; so are the routing key and the extra headers' values.
pub struct WebhookSink {
    url: Secret<Webhook>,
    mention: String,
    attempts: u32,
    http: reqwest::Client,
    format: WebhookFormat,
    routing_key: Secret<Hidden>,
    headers: reqwest::header::HeaderMap,
    /// PagerDuty: the open events of each worker, (node, worker) → (kind, dedup key), resolved
    /// when the condition ends.
    open: std::sync::Mutex<OpenEvents>,
}

/// PagerDuty's open events: (node, worker) → (kind, dedup key) of each.
type OpenEvents = BTreeMap<(String, String), Vec<(AlertKind, String)>>;

impl WebhookSink {
    pub fn new(url: &str, mention: &str, timeout: Duration, attempts: u32) -> Self {
        WebhookSink {
            url: url.into(),
            mention: mention.to_string(),
            attempts,
            http: super::http_client(timeout),
            format: WebhookFormat::Slack,
            routing_key: Secret::default(),
            headers: reqwest::header::HeaderMap::new(),
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
    pub fn with_headers<'a>(
        mut self,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        for (name, value) in headers {
            if let (Ok(n), Ok(mut v)) = (
                reqwest::header::HeaderName::from_bytes(name.as_bytes()),
                reqwest::header::HeaderValue::from_str(value),
            ) {
                v.set_sensitive(true);
                self.headers.insert(n, v);
            }
        }
        self
    }

    fn body(&self, alert: &Alert) -> serde_json::Value {
        match self.format {
            WebhookFormat::Slack => alert.webhook_body(&self.mention),
            WebhookFormat::Json => json_body(alert),
            WebhookFormat::Pagerduty => pagerduty_trigger(alert, self.routing_key.expose()),
        }
    }

    async fn post(&self, body: &serde_json::Value) -> Result<(), AlertError> {
        let to = (self.http.clone(), self.url.clone(), self.headers.clone());
        post_json(to, self.attempts, body).await
    }
}

/// POST `body` to a webhook (client, URL, headers), with retries.
async fn post_json(
    (http, url, headers): (reqwest::Client, Secret<Webhook>, reqwest::header::HeaderMap),
    attempts: u32,
    body: &serde_json::Value,
) -> Result<(), AlertError> {
    let request = || http.post(url.expose()).headers(headers.clone()).json(body);
    AlertError::post("webhook", &url, attempts, request).await
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
        self.post(&self.body(alert)).await
    }

    fn open_workers(&self, node: &str) -> Vec<String> {
        match self.open.lock() {
            Ok(open) => open.keys().filter(|(n, _)| n == node).map(|(_, w)| w.clone()).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// PagerDuty: resolve the events the end covers (one per dedup key); a dedup key still used
    /// by an alert the end does not cover (an escalation of the same incident) stays open.
    async fn resolve(&self, node: &str, worker: &str, end: Resolve) {
        if self.format != WebhookFormat::Pagerduty {
            return;
        }
        let keys: BTreeSet<String> = match self.open.lock() {
            Ok(mut open) => {
                let id = (node.to_string(), worker.to_string());
                let Some(events) = open.get_mut(&id) else {
                    return;
                };
                let (ended, kept): (Vec<_>, Vec<_>) =
                    events.drain(..).partition(|(k, _)| end.covers(*k));
                *events = kept;
                let keys = ended.into_iter().map(|(_, d)| d);
                let keys = keys.filter(|d| !events.iter().any(|(_, k)| k == d)).collect();
                if events.is_empty() {
                    open.remove(&id);
                }
                keys
            }
            Err(_) => return,
        };
        // NB: in the background, as Alertmanager's resolves: the engine resolves under the
        // node lock, whose TTL is sized for one alert's delivery.
        let to = (self.http.clone(), self.url.clone(), self.headers.clone());
        let (attempts, worker) = (self.attempts, worker.to_string());
        let bodies: Vec<_> =
            keys.iter().map(|k| pagerduty_resolve(k, self.routing_key.expose())).collect();
        super::in_background(async move {
            for body in bodies {
                if let Err(e) = post_json(to.clone(), attempts, &body).await {
                    tracing::error!(error = %e, worker, "resolving the PagerDuty incident failed");
                }
            }
        })
        .await;
    }
}
