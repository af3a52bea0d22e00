//! The alert sinks' unit tests: summaries, bodies, retries and what a worker's text can and cannot do.

use super::*;
use serde_json::Value;
use std::time::Duration;

#[test]
fn pages_carry_the_mention_and_logs_are_fenced() {
    let mut a = Alert::new(AlertKind::Escalation, "gpu-7", "restart did not help");
    a.worker = Some("trainer-0".into());
    a.verdict = Some("hung");
    a.duration = Some("12m".into());
    a.logs = Some("line1\nline2".into());
    let body = a.webhook_body("<!here>");
    let text = body["text"].as_str().unwrap();
    assert!(
        text.starts_with(
            "<!here> [vigil] escalation on node gpu-7, worker trainer-0 (hung for 12m)"
        ),
        "{text}"
    );
    assert!(text.contains("```\nline1\nline2\n```"));
    assert_eq!(body["vigil"]["kind"], "escalation");
    assert_eq!(body["vigil"]["for"], "12m");
    let plain = Alert::new(AlertKind::Hung, "n", "x").webhook_body("<!here>");
    assert!(!plain["text"].as_str().unwrap().contains("<!here>"));
}

/// Issue 26: what a worker writes (its job, its logs) is text in Slack, never markup.
#[test]
fn a_worker_s_text_cannot_mention_link_or_close_the_log_block() {
    let mut a = Alert::new(AlertKind::Hung, "gpu-7", "no heartbeat");
    a.page = true;
    a.job = Some("<!channel> see <https://evil.example|the fix> & more".into());
    a.logs = Some("ok\n```\n<!here> free GPUs at <https://evil.example>\n````".into());
    let body = a.webhook_body("<!subteam^S123>");
    let text = body["text"].as_str().unwrap();
    assert!(text.starts_with("<!subteam^S123> "), "the configured mention stays: {text}");
    for markup in ["<!channel>", "<!here>", "<https://", "&amp more"] {
        assert!(!text.contains(markup), "{markup} in {text}");
    }
    assert!(text.contains("&lt;!channel&gt;") && text.contains("&amp; more"), "{text}");
    // One block: the fence that opens it and the one that closes it, nothing between.
    assert_eq!(text.matches("```").count(), 2, "{text}");
    assert!(text.ends_with("\n```"), "{text}");
    // The structured copy keeps the worker's text as it was.
    assert_eq!(body["vigil"]["job"], a.job.clone().unwrap());
}

#[tokio::test]
async fn a_failed_delivery_says_why_without_the_token() {
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap().port();
    let url =
        format!("http://u:pw-s3cret@127.0.0.1:{port}/services/T/B/path-s3cret?token=q-s3cret");
    let sink = WebhookSink::new(&url, "", Duration::from_secs(2), 1);
    let err = sink.send(&Alert::new(AlertKind::Hung, "n", "x")).await.unwrap_err();
    let text = err.to_string();
    assert!(!text.contains("s3cret"), "{text}");
    assert!(text.starts_with(&format!("webhook http://***@127.0.0.1:{port}/*** failed")), "{text}");
    assert!(text.contains("onnect"), "the cause is said: {text}");
}

#[test]
fn long_logs_keep_their_end() {
    let s = "é".repeat(4000);
    let t = tail_chars(&s, 3001);
    assert!(t.len() <= 3001 && t.chars().all(|c| c == 'é'));
}

#[test]
fn the_summary_names_the_gang_and_its_size() {
    let mut a = Alert::new(AlertKind::Hung, "gpu-7", "no heartbeat");
    a.gang = Some("ml/run-1/0".into());
    a.gang_size = Some(64);
    assert!(a.summary().contains(", gang ml/run-1/0 (64 members): "), "{}", a.summary());
    let body = a.webhook_body("<!here>");
    assert_eq!(body["vigil"]["gang"], "ml/run-1/0");
    assert_eq!(body["vigil"]["gang_size"], 64);
    // Issue 41: an unknown size says so, never "(0 members)".
    a.gang_size = None;
    a.gang_members = Some(0);
    assert!(a.summary().contains(", gang ml/run-1/0 (size unknown): "), "{}", a.summary());
    a.gang_members = Some(3);
    assert!(a.summary().contains(" (size unknown; 3 reporting): "), "{}", a.summary());
    assert!(a.webhook_body("").get("vigil").unwrap()["gang_size"].is_null());
}

/// An alert of worker `trainer-0`'s incident `inc-1` on node `gpu-7`.
fn of_incident(kind: AlertKind) -> Alert {
    let mut a = Alert::new(kind, "gpu-7", "heartbeat 6m old");
    a.worker = Some("trainer-0".into());
    a.incident = Some("inc-1".into());
    a
}

/// PagerDuty adds a trigger whose dedup key is open to that alert without notifying anyone: a
/// page on its incident's key, after the `hung` warning, woke nobody.
#[test]
fn a_page_is_its_own_pagerduty_alert_within_its_incident() {
    use super::format::dedup_key;
    let (hung, failed) = (of_incident(AlertKind::Hung), of_incident(AlertKind::RestartFailed));
    assert_ne!(dedup_key(&failed), dedup_key(&hung));
    assert_eq!(dedup_key(&hung), "vigil/inc-1");
    assert_eq!(dedup_key(&failed), "vigil/inc-1/restart-failed");
    for kind in AlertKind::ALL.iter().filter(|k| k.is_page()) {
        assert_ne!(dedup_key(&of_incident(*kind)), dedup_key(&hung), "{kind:?}");
    }
    // A further failed restart is an update, not a page: it joins its page, notifying no one.
    let mut update = failed.clone();
    (update.page, update.update) = (false, true);
    assert_eq!(dedup_key(&update), dedup_key(&failed));
    // The incident's other alerts stay on its key.
    assert_eq!(dedup_key(&of_incident(AlertKind::Restarting)), "vigil/inc-1");
}

/// A node-wide alert no end resolves carries no `dedup_key` (PagerDuty makes one per event): on
/// a fixed one, the next coordinator outage joined the last one's alert, open for ever, unpaged.
#[test]
fn a_node_wide_alert_is_a_pagerduty_alert_of_its_own_each_time() {
    use super::format::pagerduty_trigger;
    let down = Alert::new(AlertKind::CoordinatorDown, "gpu-7", "redis at r:6379 is unreachable");
    let event = pagerduty_trigger(&down, "rk");
    assert_eq!(event["event_action"], "trigger");
    assert!(event.get("dedup_key").is_none(), "{event}");
    assert_eq!(event["payload"]["class"], "coordinator-down");
    let hung = pagerduty_trigger(&of_incident(AlertKind::Hung), "rk");
    assert_eq!(hung["dedup_key"], "vigil/inc-1");
}

/// Every JSON body posted to a local receiver, kept; the URL it listens on.
async fn receiver() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    let got: std::sync::Arc<std::sync::Mutex<Vec<Value>>> = Default::default();
    let kept = got.clone();
    let app: axum::Router = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                kept.lock().unwrap().push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, got)
}

/// The `dedup_key`s of the PagerDuty events with `event_action` `action` among `bodies`.
fn pagerduty_keys(bodies: &[Value], action: &str) -> Vec<String> {
    let events = bodies.iter().filter(|b| b["event_action"] == action);
    events.filter_map(|b| b["dedup_key"].as_str().map(String::from)).collect()
}

/// The keys an end of incident `inc-1` resolves when it covers every page (`Recovered`,
/// `Gone`): the incident's own, and each page kind's, in key order.
const INC_1_KEYS: [&str; 6] = [
    "vigil/inc-1",
    "vigil/inc-1/escalation",
    "vigil/inc-1/fruitless",
    "vigil/inc-1/gang-blocked",
    "vigil/inc-1/not-restartable",
    "vigil/inc-1/restart-failed",
];

/// PagerDuty: the `hung` warning and the `restart-failed` page are two alerts (two dedup keys);
/// the incident's end resolves both, once (with the keys of its other page kinds).
#[tokio::test]
async fn the_end_of_an_incident_resolves_its_warning_and_its_page() {
    let (url, got) = receiver().await;
    let pd = WebhookSink::new(&url, "", Duration::from_secs(2), 1)
        .with_format(crate::config::WebhookFormat::Pagerduty, "rk");
    pd.send(&of_incident(AlertKind::Hung)).await.unwrap();
    pd.send(&of_incident(AlertKind::RestartFailed)).await.unwrap();
    let triggers = got.lock().unwrap().clone();
    assert_eq!(pagerduty_keys(&triggers, "trigger"), ["vigil/inc-1", "vigil/inc-1/restart-failed"]);
    assert_eq!(triggers[1]["payload"]["severity"], "critical");
    // An episode's end is not the incident's: nothing is resolved.
    pd.resolve("gpu-7", "trainer-0", Resolve::Episode(AlertKind::Stalled)).await;
    pd.resolve("gpu-7", "trainer-0", Resolve::Recovered).await;
    // NB: resolves are posted in the background (`Endpoint::post_later`).
    let want = 2 + INC_1_KEYS.len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while got.lock().unwrap().len() < want && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing left open: a second end resolves nothing.
    pd.resolve("gpu-7", "trainer-0", Resolve::Recovered).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bodies = got.lock().unwrap().clone();
    assert_eq!(bodies.len(), want, "{bodies:?}");
    // The page it saw is resolved once, in key order with the others.
    assert_eq!(pagerduty_keys(&bodies, "resolve"), INC_1_KEYS);
}

/// The `dedup_key`s a fresh PagerDuty sink (an agent just restarted) resolves, in the order
/// posted, for `end` of worker `trainer-0` after it sent an alert of incident `inc-1` of each of
/// `kinds`; at least one.
async fn resolves_after(kinds: &[AlertKind], end: Resolve) -> Vec<String> {
    let alerts: Vec<Alert> = kinds.iter().map(|k| of_incident(*k)).collect();
    resolves_of(&alerts, "trainer-0", end).await
}

/// The `dedup_key`s a fresh PagerDuty sink resolves, in the order posted, for `end` of `worker`
/// on `gpu-7` after it sent `alerts`; at least one.
async fn resolves_of(alerts: &[Alert], worker: &str, end: Resolve) -> Vec<String> {
    let (url, got) = receiver().await;
    let pd = WebhookSink::new(&url, "", Duration::from_secs(2), 1)
        .with_format(crate::config::WebhookFormat::Pagerduty, "rk");
    for alert in alerts {
        pd.send(alert).await.unwrap();
    }
    pd.resolve("gpu-7", worker, end).await;
    // NB: resolves are posted in the background (`Endpoint::post_later`), one after another.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while got.lock().unwrap().len() <= alerts.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bodies = got.lock().unwrap().clone();
    pagerduty_keys(&bodies, "resolve")
}

/// The open keys are in memory: a restart failed (a page on `vigil/inc-1/restart-failed`), the
/// agent restarted (a rollout), its retry sent `restarting` (on `vigil/inc-1`) and the worker
/// recovered: only `vigil/inc-1` was resolved, and the page stayed open for ever. The incident's
/// key goes with the key of each page kind its end covers (PagerDuty ignores the others).
#[tokio::test]
async fn an_incident_s_end_resolves_the_pages_a_restarted_agent_never_saw() {
    let restarting = [AlertKind::Restarting];
    assert_eq!(resolves_after(&restarting, Resolve::Recovered).await, INC_1_KEYS);
    assert_eq!(resolves_after(&restarting, Resolve::Gone).await, INC_1_KEYS);
    // Cleared while our restart boots: an escalation stays open.
    let cleared: Vec<_> = INC_1_KEYS.into_iter().filter(|k| !k.ends_with("/escalation")).collect();
    assert_eq!(resolves_after(&restarting, Resolve::IncidentCleared).await, cleared);
    // An episode's end resolves its own alert's key, never a page's.
    let stalled = [AlertKind::Stalled];
    let episode = resolves_after(&stalled, Resolve::Episode(AlertKind::Stalled)).await;
    assert_eq!(episode, ["vigil/inc-1"]);
}

/// The reverse: the agent restarted after its `hung` went out (on `vigil/inc-1`), and its first
/// alert of the incident was a page (a failed restart, on `vigil/inc-1/restart-failed`): the end
/// resolved that page alone, and the incident's own key stayed open for ever. The end resolves
/// every key of the incident it covers, whichever this agent sent.
#[tokio::test]
async fn an_incident_s_end_resolves_its_own_key_after_a_page_alone() {
    let failed = [AlertKind::RestartFailed];
    assert_eq!(resolves_after(&failed, Resolve::Recovered).await, INC_1_KEYS);
    let cleared: Vec<_> = INC_1_KEYS.into_iter().filter(|k| !k.ends_with("/escalation")).collect();
    assert_eq!(resolves_after(&failed, Resolve::IncidentCleared).await, cleared);
}

/// An incident's alert placed at no worker (a gang's with no member to place it at) was on its
/// incident's keys but never kept: its end resolved nothing, and it stayed open for ever. It is
/// kept under `NO_WORKER` (not a worker of the roster, which would end it as gone), and its
/// incident's end resolves it, with the incident's other keys.
#[tokio::test]
async fn an_incident_s_alert_at_no_worker_is_resolved_with_its_incident() {
    let mut blocked = of_incident(AlertKind::GangBlocked);
    (blocked.worker, blocked.gang) = (None, Some("ml/run-1/0".into()));
    let (url, _got) = receiver().await;
    let pd = WebhookSink::new(&url, "", Duration::from_secs(2), 1)
        .with_format(crate::config::WebhookFormat::Pagerduty, "rk");
    pd.send(&blocked).await.unwrap();
    assert!(pd.open_workers("gpu-7").is_empty(), "{:?}", pd.open_workers("gpu-7"));
    let alone = std::slice::from_ref(&blocked);
    assert_eq!(resolves_of(alone, &no_worker("inc-1"), Resolve::Recovered).await, INC_1_KEYS);
}

/// A gang's alert with an incident but no member to place it at (no member records) had no
/// `dedup_key`: an alert of its own, never resolved. It is on its incident's keys.
#[test]
fn an_incident_s_alert_at_no_worker_is_on_its_incident_s_keys() {
    use super::format::pagerduty_trigger;
    let cases =
        [(AlertKind::Hung, "vigil/inc-1"), (AlertKind::GangBlocked, "vigil/inc-1/gang-blocked")];
    for (kind, key) in cases {
        let mut a = of_incident(kind);
        (a.worker, a.gang) = (None, Some("ml/run-1/0".into()));
        assert_eq!(super::format::dedup_key(&a), key);
        assert_eq!(pagerduty_trigger(&a, "rk")["dedup_key"], key, "{kind:?}");
    }
}

/// A CRI log runs to 1 MiB: in full in the `vigil` copy, the body drew a 413, which is final (no
/// retry), and the `restarting` alert was lost. Every body carries the logs' end, capped.
#[test]
fn a_mebibyte_of_logs_is_cut_to_its_end_in_every_body() {
    let mut a = of_incident(AlertKind::Restarting);
    a.logs = Some(format!("{}THE END", "é".repeat(1 << 19)));
    let tail = tail_chars(a.logs.as_deref().unwrap(), LOGS_TAIL);
    let slack = a.webhook_body("<!here>");
    let bodies = [
        slack["vigil"].clone(),
        super::format::json_body(&a),
        super::format::pagerduty_trigger(&a, "rk")["payload"]["custom_details"].clone(),
    ];
    for body in bodies {
        let logs = body["logs"].as_str().unwrap();
        assert!(logs.len() <= LOGS_TAIL && logs.ends_with("THE END"), "{} bytes", logs.len());
        assert_eq!(logs, tail);
    }
    let text = slack["text"].as_str().unwrap();
    assert!(text.len() < 2 * LOGS_TAIL && text.ends_with("THE END\n```"), "{} bytes", text.len());
    assert!(slack.to_string().len() < 4 * LOGS_TAIL, "{} bytes", slack.to_string().len());
}
