//! Alertmanager as a sink (`alerts.alertmanager_url`): alerts are POSTed to `/api/v2/alerts`
//! with labels `alertname` (`vigil_<kind>`), `node`, `worker`, `severity` and `incident`, so
//! routing, silences, inhibition and grouping are Alertmanager's.
//!
//! A worker's alert is kept open: re-posted every `alerts.alertmanager_repost` (below
//! Alertmanager's `resolve_timeout`, 5m by default) until the engine says its condition ended,
//! then posted once more with `endsAt` = now (resolved); so is an incident's alert placed at no
//! worker (a gang's with no member to place it at), kept under its incident's
//! [`no_worker`](crate::alerts::no_worker) (`@<incident>`). An alert of neither a worker nor an
//! incident (breaker, budget, coordinator, runtime) is posted once and left to Alertmanager's
//! `resolve_timeout`.
//!
//! The URL may carry credentials (`https://user:token@am/`): it is a
//! [`Secret`](crate::redact::Secret), shown as `https://***@am/***`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::alerts::{tail_chars, Alert, AlertError, AlertKind, AlertSink, Endpoint, Resolve};

/// The Alertmanager API v2 path alerts are posted to.
pub(crate) const ALERTS_PATH: &str = "/api/v2/alerts";

/// How much of the logs goes into the `description` annotation (the end is kept).
const LOG_TAIL: usize = 2000;

/// `vigil_<kind>` with `-` as `_`: `vigil_restart_failed`. Distinct from the names of the
/// Prometheus rules (`VigilRestartFailed`), which alert from metrics, not from the agent.
pub(crate) fn alertname(kind: AlertKind) -> String {
    format!("vigil_{}", kind.as_str().replace('-', "_"))
}

/// The labels of an alert: its identity in Alertmanager (two posts with the same labels are one
/// alert).
pub(crate) fn labels(alert: &Alert) -> BTreeMap<&'static str, String> {
    let (kind, node) = (alertname(alert.kind), alert.node.clone());
    let set = [("alertname", kind), ("node", node), ("severity", alert.kind.severity().into())];
    // A route or an inhibition by job (`gang`): every alert of a gang member, and the gang's own.
    let opt = [("worker", &alert.worker), ("incident", &alert.incident), ("gang", &alert.gang)];
    set.into_iter().chain(opt.into_iter().filter_map(|(k, v)| Some((k, v.clone()?)))).collect()
}

/// One element of the body posted to `/api/v2/alerts` (pure: times are given).
pub(crate) fn payload(alert: &Alert, starts_at: SystemTime, ends_at: Option<SystemTime>) -> Value {
    let (summary, attempt) = (alert.summary(), alert.attempt.map(|n| n.to_string()));
    let mut description = summary.clone();
    if let Some(logs) = alert.logs.as_ref().filter(|l| !l.trim().is_empty()) {
        description.push_str("\n\n");
        description.push_str(tail_chars(logs, LOG_TAIL));
    }
    let annotations: serde_json::Map<String, Value> = [
        ("summary", Some(summary.as_str())),
        ("description", Some(description.as_str())),
        ("kind", Some(alert.kind.as_str())),
        ("container", alert.container.as_deref()),
        ("job", alert.job.as_deref()),
        ("gang", alert.gang.as_deref()),
        ("verdict", alert.verdict),
        ("for", alert.duration.as_deref()),
        ("attempt", attempt.as_deref()),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k.to_string(), Value::from(v?))))
    .collect();
    let mut body = json!({
        "labels": labels(alert),
        "annotations": annotations,
        "startsAt": humantime::format_rfc3339_millis(starts_at).to_string(),
    });
    if let Some(end) = ends_at {
        body["endsAt"] = json!(humantime::format_rfc3339_millis(end).to_string());
    }
    body
}

/// An alert kept open: re-posted until its condition ends.
struct Open {
    alert: Alert,
    starts_at: SystemTime,
}

/// Open alerts by their labels (as JSON: the identity Alertmanager uses).
type OpenAlerts = Mutex<BTreeMap<String, Open>>;

/// Posts alerts to an Alertmanager and keeps workers' alerts open until they are resolved.
pub struct AlertmanagerSink {
    to: Endpoint,
    /// Shared with the re-posting task, which ends once the sink is gone.
    open: Arc<OpenAlerts>,
}

impl AlertmanagerSink {
    /// `url` is Alertmanager's base URL (`http://alertmanager:9093`); alerts go to
    /// `/api/v2/alerts` under it. Open alerts are re-posted every `repost` by a task that ends
    /// with the sink (it needs a Tokio runtime; without one nothing is re-posted); that task
    /// posts through a copy of the endpoint made here.
    pub fn new(url: &str, timeout: Duration, attempts: u32, repost: Duration) -> Self {
        let target = format!("{}{ALERTS_PATH}", url.trim_end_matches('/'));
        let to = Endpoint::new("alertmanager", url, &target, timeout, attempts.max(1));
        let open = Arc::new(OpenAlerts::default());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(repost_loop(to.clone(), Arc::downgrade(&open), repost));
        }
        AlertmanagerSink { to, open }
    }
}

#[cfg(any(test, feature = "bench"))]
impl AlertmanagerSink {
    /// How many alerts are open (re-posted).
    pub fn open(&self) -> usize {
        self.open.lock().map(|o| o.len()).unwrap_or(0)
    }
}

async fn repost_loop(to: Endpoint, open: Weak<OpenAlerts>, every: Duration) {
    let every = every.max(Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        let Some(alerts) = open.upgrade() else { return };
        let body: Vec<Value> = match alerts.lock() {
            Ok(map) => map.values().map(|o| payload(&o.alert, o.starts_at, None)).collect(),
            Err(_) => return,
        };
        if body.is_empty() {
            continue;
        }
        if let Err(e) = to.post(&body).await {
            tracing::error!(error = %e, alerts = body.len(), "re-posting open alerts to Alertmanager failed");
        }
    }
}

#[async_trait]
impl AlertSink for AlertmanagerSink {
    async fn send(&self, alert: &Alert) -> Result<(), AlertError> {
        let now = SystemTime::now();
        let starts_at = if alert.kept_under().is_some() {
            // Kept open (re-posted) until resolved; the same labels again is the same alert,
            // its annotations updated and its start kept.
            let poisoned = |_| self.to.error(0, "alert state poisoned by a panic".into());
            let mut open = self.open.lock().map_err(poisoned)?;
            let entry = open
                .entry(serde_json::to_string(&labels(alert)).unwrap_or_default())
                .or_insert_with(|| Open { alert: alert.clone(), starts_at: now });
            entry.alert = alert.clone();
            entry.starts_at
        } else {
            now
        };
        self.to.post(&[payload(alert, starts_at, None)]).await
    }

    fn open_workers(&self, node: &str) -> Vec<String> {
        let Ok(open) = self.open.lock() else { return Vec::new() };
        let all =
            open.values().filter(|o| o.alert.node == node).filter_map(|o| o.alert.worker.clone());
        all.collect::<BTreeSet<_>>().into_iter().collect()
    }

    async fn resolve(&self, node: &str, worker: &str, end: Resolve) {
        let ended: BTreeMap<String, Open> = {
            let Ok(mut open) = self.open.lock() else { return };
            let (ended, kept) = std::mem::take(&mut *open).into_iter().partition(|(_, o)| {
                o.alert.node == node
                    && o.alert.kept_under().as_deref() == Some(worker)
                    && end.covers(o.alert.kind)
            });
            *open = kept;
            ended
        };
        if ended.is_empty() {
            return;
        }
        let now = SystemTime::now();
        let body = ended.values().map(|o| payload(&o.alert, o.starts_at, Some(now))).collect();
        // NB: in the background: the engine resolves from inside the restart path, under the
        // node lock, whose TTL is sized for one alert's delivery, not for this one too. One
        // post: the body is the array of the ended alerts.
        let failed: fn(&AlertError, &str) = |e, worker| {
            tracing::error!(error = %e, worker, "resolving alerts in Alertmanager failed; they expire after its resolve_timeout");
        };
        self.to.post_later(vec![Value::Array(body)], worker, failed).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hung() -> Alert {
        let mut a = Alert::new(AlertKind::RestartFailed, "gpu-7", "restart failed: exit 1");
        a.worker = Some("trainer-0".into());
        a.incident = Some("inc-1".into());
        a.container = Some("trainer".into());
        a.attempt = Some(2);
        a.logs = Some(format!("{}THE END", "x".repeat(5000)));
        a
    }

    #[test]
    fn the_payload_carries_labels_annotations_and_times() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let p = payload(&hung(), t0, None);
        assert_eq!(
            p["labels"],
            json!({"alertname": "vigil_restart_failed", "node": "gpu-7", "worker": "trainer-0",
                   "severity": "page", "incident": "inc-1"})
        );
        assert_eq!(p["startsAt"], "2023-11-14T22:13:20.000Z");
        assert!(p.get("endsAt").is_none());
        let summary = p["annotations"]["summary"].as_str().unwrap();
        assert!(summary.starts_with("[vigil] restart-failed on node gpu-7, worker trainer-0"));
        let d = p["annotations"]["description"].as_str().unwrap();
        assert!(d.ends_with("THE END") && d.len() < 2300, "logs truncated: {}", d.len());
        assert_eq!(p["annotations"]["attempt"], "2");
        assert_eq!(p["annotations"]["container"], "trainer");
        let r = payload(&hung(), t0, Some(t0 + Duration::from_secs(90)));
        assert_eq!(r["endsAt"], "2023-11-14T22:14:50.000Z");
    }

    #[test]
    fn labels_leave_out_what_is_unknown_and_severity_follows_the_kind() {
        let a = Alert::new(AlertKind::BreakerOpen, "n", "x");
        let l = labels(&a);
        assert_eq!(l.keys().copied().collect::<Vec<_>>(), ["alertname", "node", "severity"]);
        assert_eq!(l["severity"], "warning");
        assert_eq!(AlertKind::Escalation.severity(), "page");
        assert_eq!(AlertKind::Restarting.severity(), "info");
        assert_eq!(alertname(AlertKind::WouldRestart), "vigil_would_restart");
        let mut g = Alert::new(AlertKind::Hung, "n", "x");
        g.gang = Some("ml/llama".into());
        assert_eq!(labels(&g)["gang"], "ml/llama");
    }

    #[test]
    fn an_end_resolves_only_what_it_covers() {
        assert!(Resolve::Recovered.covers(AlertKind::Escalation));
        assert!(!Resolve::IncidentCleared.covers(AlertKind::Escalation));
        assert!(Resolve::IncidentCleared.covers(AlertKind::Hung));
        assert!(!Resolve::Recovered.covers(AlertKind::Stalled));
        assert!(Resolve::Episode(AlertKind::Stalled).covers(AlertKind::Stalled));
        assert!(!Resolve::Episode(AlertKind::Stalled).covers(AlertKind::Hung));
        assert!(
            Resolve::Gone.covers(AlertKind::Escalation) && Resolve::Gone.covers(AlertKind::Exited)
        );
    }

    #[tokio::test]
    async fn a_failed_post_says_why_without_the_credentials() {
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap().port();
        let url = format!("http://am:pw-s3cret@127.0.0.1:{port}/p-s3cret?t=q-s3cret");
        let sink = AlertmanagerSink::new(&url, Duration::from_secs(2), 1, Duration::from_secs(60));
        let err = sink.send(&hung()).await.unwrap_err().to_string();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.starts_with("alertmanager http://***@127.0.0.1:"), "{err}");
        assert_eq!(sink.open(), 1, "kept open: re-posted once it is reachable");
        assert_eq!(sink.open_workers("gpu-7"), ["trainer-0"]);
        assert!(sink.open_workers("gpu-8").is_empty());
        sink.resolve("gpu-7", "trainer-0", Resolve::Recovered).await;
        assert_eq!(sink.open(), 0);
    }

    /// An incident's alert placed at no worker (a gang's with no member to place it at) was
    /// posted once, never re-posted: Alertmanager ended it after its `resolve_timeout` while the
    /// gang was still blocked, and the gang's end resolved nothing. It is kept open under its
    /// incident's `no_worker`, out of the roster's workers; a node-wide alert is still posted once.
    #[tokio::test]
    async fn an_incident_s_alert_at_no_worker_is_kept_open_until_its_end() {
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap().port();
        let url = format!("http://127.0.0.1:{port}");
        let sink = AlertmanagerSink::new(&url, Duration::from_secs(2), 1, Duration::from_secs(60));
        let mut blocked = Alert::new(AlertKind::GangBlocked, "gpu-7", "a member's node is down");
        (blocked.incident, blocked.gang) = (Some("g-1".into()), Some("ml/run-1/0".into()));
        assert!(sink.send(&blocked).await.is_err(), "nothing listens");
        let breaker = Alert::new(AlertKind::BreakerOpen, "gpu-7", "3 restarts today");
        assert!(sink.send(&breaker).await.is_err(), "nothing listens");
        assert_eq!(sink.open(), 1, "the gang's alert kept open, the node's not");
        assert!(sink.open_workers("gpu-7").is_empty(), "{:?}", sink.open_workers("gpu-7"));
        sink.resolve("gpu-7", "trainer-0", Resolve::Recovered).await;
        assert_eq!(sink.open(), 1, "a worker's end is not its");
        // Another gang blocked on the node (another tenant's): its end is not this one's.
        let mut other = blocked.clone();
        (other.incident, other.gang) = (Some("g-2".into()), Some("dev/run-9/0".into()));
        assert!(sink.send(&other).await.is_err(), "nothing listens");
        assert_eq!(sink.open(), 2);
        sink.resolve("gpu-7", &crate::alerts::no_worker("g-2"), Resolve::Recovered).await;
        assert_eq!(sink.open(), 1, "the other gang's end resolves only its own");
        sink.resolve("gpu-7", &crate::alerts::no_worker("g-1"), Resolve::Recovered).await;
        assert_eq!(sink.open(), 0);
    }
}
