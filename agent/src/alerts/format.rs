//! The webhook bodies other than Slack's: PagerDuty Events API v2 (trigger, resolve, and the
//! `dedup_key` that ties them) and generic JSON.

use serde_json::{json, Value};

use super::{Alert, AlertKind};
use crate::vocab::node::truncate;

/// The PagerDuty `dedup_key` of an alert: its incident (with its kind for a page), else node,
/// worker (`-` for none) and kind. Only an alert with a worker or an incident is sent with one
/// (`pagerduty_trigger`).
pub(crate) fn dedup_key(alert: &Alert) -> String {
    let kind = alert.kind.as_str();
    match &alert.incident {
        // NB: PagerDuty adds a trigger whose key is open to that open alert: no new incident, no
        // notification. A page on its incident's key (that of the `hung` or `errored` warning
        // before it) would wake nobody; so each page kind is an alert of its own, and its
        // updates (a further failed restart) join it, paging no one again, as `update` says.
        Some(i) if alert.kind.is_page() => page_key(i, alert.kind),
        Some(i) => incident_key(i),
        None => format!("vigil/{}/{}/{kind}", alert.node, alert.worker.as_deref().unwrap_or("-")),
    }
}

/// The `dedup_key` of `incident`'s alerts that are not pages (`dedup_key`).
pub(crate) fn incident_key(incident: &str) -> String {
    format!("vigil/{incident}")
}

/// The `dedup_key` of `incident`'s page of `kind` (`dedup_key`): the sink resolves it with the
/// incident's own key even when it never saw the page (`WebhookSink::resolve`).
pub(crate) fn page_key(incident: &str, kind: AlertKind) -> String {
    format!("vigil/{incident}/{}", kind.as_str())
}

/// A PagerDuty Events API v2 event that triggers (or updates) the alert's incident.
pub(crate) fn pagerduty_trigger(alert: &Alert, routing_key: &str) -> Value {
    let severity = match alert.kind.severity() {
        "page" => "critical",
        "info" => "info",
        _ => "warning",
    };
    let mut summary = alert.summary();
    if summary.len() > 1024 {
        summary = format!("{}...", truncate(&summary, 1021));
    }
    let mut payload = json!({
        "summary": summary,
        "source": alert.node,
        "severity": severity,
        "class": alert.kind.as_str(),
        "custom_details": alert.fields(),
    });
    if let Some(w) = &alert.worker {
        payload["component"] = json!(w);
    }
    if let Some(j) = &alert.job {
        payload["group"] = json!(j);
    }
    let mut event = json!({ "routing_key": routing_key, "event_action": "trigger" });
    // NB: only an alert an end resolves, one the sink keeps (of a worker or of an incident:
    // `Alert::kept_under`), has a key of ours (a gang's alert with no member to place it at is
    // on its incident's keys, kept under no worker: it ends with its incident). No end resolves
    // a node-wide one (coordinator-down, breaker-open…): on a fixed key its alert stayed open
    // for ever, and the next outage joined it without notifying anyone. Without a `dedup_key`
    // PagerDuty makes one per event: each occurrence pages.
    if alert.kept_under().is_some() {
        event["dedup_key"] = json!(dedup_key(alert));
    }
    event["payload"] = payload;
    event
}

/// A PagerDuty Events API v2 event that resolves the incident of `dedup_key`.
pub(crate) fn pagerduty_resolve(dedup_key: &str, routing_key: &str) -> Value {
    json!({ "routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key })
}

/// The generic JSON body: the alert's fields, with `summary` and `status` (`firing`).
pub(crate) fn json_body(alert: &Alert) -> Value {
    let mut v = alert.fields();
    v["summary"] = json!(alert.summary());
    v["status"] = json!("firing");
    v["severity"] = json!(alert.kind.severity());
    v
}
