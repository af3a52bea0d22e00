//! The alert sinks' unit tests: summaries, bodies, retries and what a worker's text can and cannot do.

use super::*;
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
