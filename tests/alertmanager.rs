//! Alertmanager as a sink, against a real Alertmanager (Debian's `prometheus-alertmanager`,
//! installed by scripts/setup.sh) on free ports: the alert appears with its labels, a second
//! post of it is the same alert, the open alert is re-posted, and the resolve ends it (a gang's
//! incident alert placed at no worker too); and through the `vigil` binary (real Redis and
//! Docker), a hung worker's alert arrives and resolves.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vigil::alerts::alertmanager::AlertmanagerSink;
use vigil::alerts::{no_worker, Alert, AlertKind, AlertSink, Resolve};

use common::real::{free_port, require};

const BIN: &str = "prometheus-alertmanager";

/// An Alertmanager owned by the test, with a receiver that drops everything.
struct Alertmanager {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Alertmanager {
    fn start() -> Alertmanager {
        require(&[BIN], "the Alertmanager tests (scripts/setup.sh installs it)");
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("alertmanager.yml");
        std::fs::write(&config, "route:\n  receiver: 'null'\nreceivers:\n  - name: 'null'\n")
            .unwrap();
        let port = free_port();
        let child = Command::new(BIN)
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .arg(format!("--storage.path={}", dir.path().join("data").display()))
            .arg(format!("--config.file={}", config.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-alertmanager starts");
        let am = Alertmanager { child, port, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if ready(am.port) {
                break;
            }
            assert!(Instant::now() < deadline, "Alertmanager did not become ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        am
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The active alerts with `worker` (GET /api/v2/alerts?active=true).
    async fn active(&self, worker: &str) -> Vec<Value> {
        self.active_where("worker", worker).await
    }

    /// The active alerts whose label `label` is `value`.
    async fn active_where(&self, label: &str, value: &str) -> Vec<Value> {
        let all: Vec<Value> = reqwest::get(format!(
            "{}/api/v2/alerts?active=true&silenced=false&inhibited=false",
            self.url()
        ))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        all.into_iter()
            .filter(|a| a["labels"][label] == value && a["status"]["state"] == "active")
            .collect()
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Is Alertmanager ready (GET /-/ready is 200)? A raw HTTP/1.0 request: blocking, no client.
fn ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    if s.write_all(b"GET /-/ready HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200")
}

fn alert(kind: AlertKind, worker: &str, incident: &str) -> Alert {
    let mut a = Alert::new(kind, "gpu-node-1", "heartbeat 6m old");
    a.worker = Some(worker.into());
    a.incident = Some(incident.into());
    a.logs = Some("step 41\nstep 42\n".into());
    a
}

async fn eventually(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok().await {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_appear_deduplicate_are_reposted_and_resolve() {
    let am = Alertmanager::start();
    let sink = AlertmanagerSink::new(&am.url(), Duration::from_secs(5), 2, Duration::from_secs(1));

    // The alert appears, with its labels and annotations.
    let hung = alert(AlertKind::Hung, "trainer-0", "inc-1");
    sink.send(&hung).await.unwrap();
    eventually("the alert is active", async || am.active("trainer-0").await.len() == 1).await;
    let got = am.active("trainer-0").await.remove(0);
    assert_eq!(got["labels"]["alertname"], "vigil_hung");
    assert_eq!(got["labels"]["node"], "gpu-node-1");
    assert_eq!(got["labels"]["severity"], "warning");
    assert_eq!(got["labels"]["incident"], "inc-1");
    let summary = got["annotations"]["summary"].as_str().unwrap();
    assert!(summary.contains("hung on node gpu-node-1, worker trainer-0"), "{summary}");
    assert!(got["annotations"]["description"].as_str().unwrap().contains("step 42"));
    let starts = got["startsAt"].clone();

    // The same alert again (an update) and a page for the same incident: one alert of each.
    sink.send(&hung).await.unwrap();
    let mut failed = alert(AlertKind::RestartFailed, "trainer-0", "inc-1");
    failed.attempt = Some(1);
    sink.send(&failed).await.unwrap();
    failed.update = true;
    failed.attempt = Some(2);
    sink.send(&failed).await.unwrap();
    eventually("two alerts, de-duplicated", async || am.active("trainer-0").await.len() == 2).await;
    let now = am.active("trainer-0").await;
    let hung_now = now.iter().find(|a| a["labels"]["alertname"] == "vigil_hung").unwrap();
    assert_eq!(hung_now["startsAt"], starts, "the start is kept");
    let page = now.iter().find(|a| a["labels"]["alertname"] == "vigil_restart_failed").unwrap();
    assert_eq!(page["labels"]["severity"], "page");
    assert_eq!(page["annotations"]["attempt"], "2", "the update's annotations");

    // Another worker's alert, which stays open.
    sink.send(&alert(AlertKind::Stalled, "trainer-1", "inc-2")).await.unwrap();

    // Open alerts are re-posted (updatedAt moves) while nothing ends them.
    let updated = hung_now["updatedAt"].clone();
    eventually("the open alert is re-posted", async || {
        let a = am.active("trainer-0").await;
        a.iter().any(|a| a["labels"]["alertname"] == "vigil_hung" && a["updatedAt"] != updated)
    })
    .await;

    // An episode's end is not the incident's: nothing of trainer-0 resolves.
    sink.resolve("gpu-node-1", "trainer-0", Resolve::Episode(AlertKind::Stalled)).await;
    assert_eq!(am.active("trainer-0").await.len(), 2);

    // The incident ends: both of its alerts resolve, and stay resolved (no re-post).
    sink.resolve("gpu-node-1", "trainer-0", Resolve::Recovered).await;
    eventually("the incident's alerts resolve", async || am.active("trainer-0").await.is_empty())
        .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(am.active("trainer-0").await.is_empty(), "not re-opened");
    assert_eq!(am.active("trainer-1").await.len(), 1, "the other worker's alert is still open");
    assert_eq!(sink.open(), 1);
}

/// An incident's alert placed at no worker (a gang's with no member to place it at) was posted
/// once and never re-posted: Alertmanager ended it after its `resolve_timeout` while the gang was
/// still blocked, and the gang's end resolved nothing. It is kept open (re-posted) like a
/// worker's until its end resolves it, under its incident's `no_worker` (`@<incident>`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incident_s_alert_at_no_worker_is_reposted_and_resolves() {
    let am = Alertmanager::start();
    let sink = AlertmanagerSink::new(&am.url(), Duration::from_secs(5), 2, Duration::from_secs(1));
    let mut blocked = Alert::new(AlertKind::GangBlocked, "gpu-node-1", "a member's node is down");
    (blocked.incident, blocked.gang) = (Some("g-1".into()), Some("ml/run-1/0".into()));
    sink.send(&blocked).await.unwrap();
    eventually("the gang's alert is active", async || {
        am.active_where("incident", "g-1").await.len() == 1
    })
    .await;
    let got = am.active_where("incident", "g-1").await.remove(0);
    assert!(got["labels"].get("worker").is_none(), "{got}");
    assert_eq!(got["labels"]["gang"], "ml/run-1/0");
    let updated = got["updatedAt"].clone();
    eventually("it is re-posted", async || {
        am.active_where("incident", "g-1").await.iter().any(|a| a["updatedAt"] != updated)
    })
    .await;
    sink.resolve("gpu-node-1", &no_worker("g-1"), Resolve::Recovered).await;
    eventually("its end resolves it", async || am.active_where("incident", "g-1").await.is_empty())
        .await;
}

/// Through the `vigil` binary (real Redis and Docker): a hung worker's alerts reach Alertmanager
/// with its labels, and resolve once our restart closed the incident.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_workers_alert_reaches_alertmanager_and_resolves_after_the_restart() {
    use common::e2e::{ConfigParts, Setup};
    use common::real::{beat, eventually, shared_redis_url, VigilProcess, WorkerContainer};

    let am = Alertmanager::start();
    let redis = shared_redis_url();
    let s = Setup::new("am");
    let tables = format!(
        "[safety]\nlock_ttl = \"30s\"\n[alerts]\nalertmanager_url = \"{}\"\nalertmanager_repost = \"1s\"\nattempts = 2\ntimeout = \"2s\"\n",
        am.url()
    );
    let cfg = s.write_config(ConfigParts {
        policy: "cooldown = \"30s\"\nescalate_after = \"60s\"",
        tables: &tables,
        ..ConfigParts::default()
    });
    let container = WorkerContainer::start(&s.label, &s.worker);
    let before = container.started_at();
    let (code, out, err) = beat(
        &cfg,
        &s.worker,
        "processing",
        &["--job", "job-42", "--progress", "step-1"],
        &[("REDIS_URL", &redis)],
    );
    assert_eq!(code, 0, "vigil beat failed: {out} {err}");
    let agent = VigilProcess::spawn(&["run"], &cfg, &[("REDIS_URL", &redis)]);

    // The hung alert is in Alertmanager while the incident runs, with its labels.
    let mut seen: Option<Value> = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.is_none() && Instant::now() < deadline {
        seen = am
            .active(&s.worker)
            .await
            .into_iter()
            .find(|a| a["labels"]["alertname"] == "vigil_hung");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hung = seen.unwrap_or_else(|| {
        panic!("no vigil_hung in Alertmanager; agent log:\n{}", agent.log_text())
    });
    assert_eq!(hung["labels"]["node"], s.node.as_str());
    assert_eq!(hung["labels"]["severity"], "warning");
    assert!(hung["labels"]["incident"].as_str().is_some_and(|i| !i.is_empty()), "{hung}");

    let restarted = eventually(Duration::from_secs(30), || container.started_at() != before).await;
    assert!(restarted, "no restart; agent log:\n{}", agent.log_text());
    // Our restart closed the incident: its alerts (hung, restarting) are resolved.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let open = am.active(&s.worker).await;
        if open.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still active after the restart: {open:?}\nagent log:\n{}",
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
