//! Webhook formats against a local HTTP sink: Slack (the default), PagerDuty Events v2 (trigger
//! with the incident's key, a page's own key, then resolve both, and its other page kinds' keys,
//! when the incident ends) and generic JSON, each with the extra headers; and a config's secrets
//! (routing key, header values) never shown.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use vigil::alerts::{Alert, AlertKind, AlertSink, Resolve, WebhookSink};
use vigil::config::{Config, WebhookFormat};

/// One request: its headers (lower-case names) and JSON body.
type Request = (HashMap<String, String>, Value);

/// A sink that keeps each request's headers and JSON body.
struct Sink {
    url: String,
    got: Arc<Mutex<Vec<Request>>>,
}

impl Sink {
    async fn start() -> Sink {
        let got: Arc<Mutex<Vec<Request>>> = Arc::default();
        let kept = got.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let h = headers
                        .iter()
                        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
                        .collect();
                    let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    kept.lock().unwrap().push((h, v));
                    "ok"
                }
            }),
        );
        let addr = common::real::serve(app).await;
        Sink { url: format!("http://{addr}/hook"), got }
    }

    fn got(&self) -> Vec<Request> {
        self.got.lock().unwrap().clone()
    }

    async fn wait_for(&self, n: usize) -> Vec<Request> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.got().len() < n {
            assert!(Instant::now() < deadline, "{} requests of {n}", self.got().len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.got()
    }
}

fn alert(kind: AlertKind) -> Alert {
    let mut a = Alert::new(kind, "gpu-node-1", "heartbeat 6m old");
    a.worker = Some("trainer-0".into());
    a.incident = Some("inc-1".into());
    a.job = Some("job-42".into());
    a.logs = Some("step 41\nstep 42".into());
    a
}

fn sink(url: &str, format: WebhookFormat) -> WebhookSink {
    WebhookSink::new(url, "<!here>", Duration::from_secs(2), 1)
        .with_format(format, "rk-s3cret")
        .with_headers([("Authorization", "Bearer tok-s3cret"), ("X-Team", "ml")])
}

#[tokio::test]
async fn pagerduty_triggers_per_incident_and_resolves_when_it_ends() {
    let rx = Sink::start().await;
    let pd = sink(&rx.url, WebhookFormat::Pagerduty);
    pd.send(&alert(AlertKind::Hung)).await.unwrap();
    pd.send(&alert(AlertKind::RestartFailed)).await.unwrap();
    let got = rx.wait_for(2).await;
    let (headers, hung) = &got[0];
    assert_eq!(headers["authorization"], "Bearer tok-s3cret");
    assert_eq!(headers["x-team"], "ml");
    assert_eq!(hung["routing_key"], "rk-s3cret");
    assert_eq!(hung["event_action"], "trigger");
    assert_eq!(hung["dedup_key"], "vigil/inc-1");
    assert_eq!(hung["payload"]["severity"], "warning");
    assert_eq!(hung["payload"]["source"], "gpu-node-1");
    assert_eq!(hung["payload"]["component"], "trainer-0");
    assert_eq!(hung["payload"]["group"], "job-42");
    assert_eq!(hung["payload"]["class"], "hung");
    assert!(hung["payload"]["summary"]
        .as_str()
        .unwrap()
        .starts_with("[vigil] hung on node gpu-node-1, worker trainer-0"));
    let failed = &got[1].1;
    // A page is its own PagerDuty alert (on the warning's key it would notify nobody).
    assert_eq!(failed["dedup_key"], "vigil/inc-1/restart-failed");
    assert_eq!(failed["payload"]["severity"], "critical");

    // Another worker's end resolves nothing; an episode's end does not resolve the incident.
    pd.resolve("gpu-node-1", "trainer-9", Resolve::Recovered).await;
    pd.resolve("gpu-node-1", "trainer-0", Resolve::Episode(AlertKind::Stalled)).await;
    // The incident ends: a resolve for each of its keys, in key order, and for those of its
    // other page kinds (an agent restarted since a page has not seen it; PagerDuty ignores a key
    // it does not have), the page seen here once.
    pd.resolve("gpu-node-1", "trainer-0", Resolve::Recovered).await;
    let keys = [
        "vigil/inc-1",
        "vigil/inc-1/escalation",
        "vigil/inc-1/fruitless",
        "vigil/inc-1/gang-blocked",
        "vigil/inc-1/not-restartable",
        "vigil/inc-1/restart-failed",
    ];
    let got = rx.wait_for(2 + keys.len()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rx.got().len(), 2 + keys.len(), "six resolves: {:?}", rx.got());
    for (resolve, key) in got[2..].iter().map(|(_, body)| body).zip(keys) {
        let expected = serde_json::json!({
            "routing_key": "rk-s3cret", "event_action": "resolve", "dedup_key": key
        });
        assert_eq!(*resolve, expected);
    }
    // Nothing left to resolve.
    pd.resolve("gpu-node-1", "trainer-0", Resolve::Recovered).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rx.got().len(), 2 + keys.len());
}

#[tokio::test]
async fn json_and_slack_bodies_carry_the_alert_and_the_headers() {
    let rx = Sink::start().await;
    sink(&rx.url, WebhookFormat::Json).send(&alert(AlertKind::Escalation)).await.unwrap();
    sink(&rx.url, WebhookFormat::Slack).send(&alert(AlertKind::Escalation)).await.unwrap();
    let got = rx.wait_for(2).await;
    let (headers, json) = &got[0];
    assert_eq!(headers["authorization"], "Bearer tok-s3cret");
    assert_eq!(json["status"], "firing");
    assert_eq!(json["kind"], "escalation");
    assert_eq!(json["severity"], "page");
    assert_eq!(json["worker"], "trainer-0");
    assert_eq!(json["incident"], "inc-1");
    assert!(json["summary"].as_str().unwrap().contains("escalation on node gpu-node-1"));
    assert_eq!(json["logs"], "step 41\nstep 42");
    let (headers, slack) = &got[1];
    assert_eq!(headers["x-team"], "ml");
    assert!(slack["text"].as_str().unwrap().starts_with("<!here> [vigil] escalation"));
    assert_eq!(slack["vigil"]["kind"], "escalation");
}

#[test]
fn the_routing_key_and_header_values_are_never_shown() {
    let cfg = Config::parse(
        "[alerts]\nwebhook_url = \"https://events.pagerduty.com/v2/enqueue\"\nformat = \"pagerduty\"\nrouting_key = \"rk-s3cret\"\n[alerts.headers]\nAuthorization = \"Bearer tok-s3cret\"\n",
        Path::new("vigil.toml"),
    )
    .unwrap();
    assert_eq!(cfg.alerts.format, WebhookFormat::Pagerduty);
    assert_eq!(cfg.alerts.routing_key.expose(), "rk-s3cret");
    let shown = format!("{cfg:?} {}", toml::to_string(&cfg).unwrap());
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("Authorization"), "the header's name is shown: {shown}");
}
