//! The webhook bodies other than Slack's: PagerDuty Events API v2 (trigger, resolve, and the
//! `dedup_key` that ties them) and generic JSON.

use serde_json::{json, Value};

use super::{tail_chars, Alert};
use crate::vocab::node::truncate;

/// The PagerDuty `dedup_key` of an alert: its incident, else node, worker and kind.
pub(crate) fn dedup_key(alert: &Alert) -> String {
    if let Some(i) = &alert.incident {
        return format!("vigil/{i}");
    }
    let worker = alert.worker.as_deref().unwrap_or("-");
    format!("vigil/{}/{worker}/{}", alert.node, alert.kind.as_str())
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
    let mut details = serde_json::to_value(alert).unwrap_or_default();
    if let Some(logs) = alert.logs.as_deref() {
        details["logs"] = json!(tail_chars(logs, 3000));
    }
    let mut payload = json!({
        "summary": summary,
        "source": alert.node,
        "severity": severity,
        "class": alert.kind.as_str(),
        "custom_details": details,
    });
    if let Some(w) = &alert.worker {
        payload["component"] = json!(w);
    }
    if let Some(j) = &alert.job {
        payload["group"] = json!(j);
    }
    json!({
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key(alert),
        "payload": payload,
    })
}

/// A PagerDuty Events API v2 event that resolves the incident of `dedup_key`.
pub(crate) fn pagerduty_resolve(dedup_key: &str, routing_key: &str) -> Value {
    json!({ "routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key })
}

/// The generic JSON body: the alert's fields, with `summary` and `status` (`firing`).
pub(crate) fn json_body(alert: &Alert) -> Value {
    let mut v = serde_json::to_value(alert).unwrap_or_default();
    v["summary"] = json!(alert.summary());
    v["status"] = json!("firing");
    v["severity"] = json!(alert.kind.severity());
    if let Some(logs) = alert.logs.as_deref() {
        v["logs"] = json!(tail_chars(logs, 3000));
    }
    v
}
