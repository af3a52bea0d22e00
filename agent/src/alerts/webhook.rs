//! The webhook sink: Slack-compatible JSON by default, PagerDuty Events v2 or generic JSON
//! (`alerts.format`), posted with retry and timeout; PagerDuty's events resolved when the
//! condition ends. The URL, the routing key and the extra headers' values are secrets: shown
//! redacted, never in a delivery's error.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{HeaderName, HeaderValue};
use strum::VariantArray;

use super::format::{dedup_key, incident_key, json_body, page_key};
use super::format::{pagerduty_resolve, pagerduty_trigger};
use super::{Alert, AlertError, AlertKind, AlertSink, Endpoint, Resolve, NO_WORKER};
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
    /// PagerDuty: the open events of each worker, (node, worker) → its events, resolved when
    /// the condition ends; an incident's events placed at no worker under its
    /// [`no_worker`](super::no_worker) (`@<incident>`). In memory only: an agent restarted since
    /// an alert of an incident resolves it with any other alert of that incident it sent
    /// (`ended_keys`).
    open: std::sync::Mutex<OpenEvents>,
}

/// A PagerDuty event this sink triggered and has not resolved yet.
#[derive(Debug, PartialEq, Eq)]
struct Open {
    kind: AlertKind,
    /// The alert's incident, if it has one.
    incident: Option<String>,
    /// Its `dedup_key`.
    key: String,
}

/// PagerDuty's open events: (node, worker) → the events of each.
type OpenEvents = BTreeMap<(String, String), Vec<Open>>;

/// The dedup keys `end` resolves of `node`'s `worker`, sorted, its events taken out of `open`:
/// those of the events it covers and, for the incident of each, every key of that incident of a
/// kind `end` covers (`incident_key`, `page_key`), triggered here or not; less the keys an
/// event it does not cover still uses.
fn ended_keys(open: &mut OpenEvents, node: &str, worker: &str, end: Resolve) -> BTreeSet<String> {
    let id = (node.to_string(), worker.to_string());
    let Some(events) = open.get_mut(&id) else { return BTreeSet::new() };
    let ended: Vec<Open> = events.extract_if(.., |e| end.covers(e.kind)).collect();
    let mut keys: BTreeSet<String> = ended.iter().map(|e| e.key.clone()).collect();
    let incidents: BTreeSet<&str> = ended.iter().filter_map(|e| e.incident.as_deref()).collect();
    for inc in incidents {
        // NB: the map is in memory: after an agent restart (a rollout) it holds only what this
        // process sent of the incident. A `restarting` alone (on `vigil/<incident>`) left the
        // page before it (`vigil/<incident>/restart-failed`) open for ever; a page alone, the
        // `hung` before it. PagerDuty ignores a resolve of a key it does not have: each goes.
        let covered = AlertKind::VARIANTS.iter().filter(|k| end.covers(**k));
        keys.extend(covered.map(|k| match k.is_page() {
            true => page_key(inc, *k),
            false => incident_key(inc),
        }));
    }
    keys.retain(|d| !events.iter().any(|e| e.key == *d));
    if events.is_empty() {
        open.remove(&id);
    }
    keys
}

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
        if let (WebhookFormat::Pagerduty, Some(w)) = (self.format, alert.kept_under()) {
            if let Ok(mut open) = self.open.lock() {
                let events = open.entry((alert.node.clone(), w)).or_default();
                let key = dedup_key(alert);
                let event = Open { kind: alert.kind, incident: alert.incident.clone(), key };
                if !events.contains(&event) {
                    events.push(event);
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
        let workers = open.keys().filter(|(n, w)| n == node && !w.starts_with(NO_WORKER));
        workers.map(|(_, w)| w.clone()).collect()
    }

    /// PagerDuty: resolve the events the end covers (one per dedup key, in key order: an
    /// incident's pages have a key each, its other alerts share one, `dedup_key`); a dedup key
    /// still used by an alert the end does not cover stays open. With an incident's alert go
    /// the keys of every kind of that incident the end covers, seen here or not (`ended_keys`).
    async fn resolve(&self, node: &str, worker: &str, end: Resolve) {
        if self.format != WebhookFormat::Pagerduty {
            return;
        }
        let keys = {
            let Ok(mut open) = self.open.lock() else { return };
            ended_keys(&mut open, node, worker, end)
        };
        if keys.is_empty() {
            return;
        }
        // NB: in the background (`Endpoint::post_later`), as Alertmanager's resolves.
        let bodies = keys.iter().map(|k| pagerduty_resolve(k, self.routing_key.expose())).collect();
        let failed: fn(&AlertError, &str) = |e, worker| {
            tracing::error!(error = %e, worker, "resolving the PagerDuty incident failed");
        };
        self.to.post_later(bodies, worker, failed).await;
    }
}
