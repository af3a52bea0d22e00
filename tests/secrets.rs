//! No secret in any output (issue 18, item 5), through the `vigil` binary: a distinct secret is
//! planted in every secret-bearing value — the Redis password (right and wrong), the webhook's
//! path token, query token and userinfo password, the HTTP checkpoint endpoint's token, the
//! Kubernetes ServiceAccount token the API client reads, and the tokens callers of the worker API
//! present (unknown, for another audience, another pod's) — every failure path is forced (Redis
//! refused, Redis AUTH refused, Redis over TLS to a plain server, Sentinels and cluster seeds
//! refused, the webhook answering 500, TLS to a plain-HTTP port, a checkpoint POST failing,
//! refused worker API writes), an alert-producing incident runs (a hung worker restarted, with
//! its alerts), and every output is searched for each secret: the agent's log at debug level,
//! `vigil config check`, `doctor`, `status`, `explain`, `beat`, `/metrics` `/healthz` `/readyz`
//! `/v1/status` `/v1/trail`,
//! every key in Redis (the trail included), the Events and the Node stored by the fake API
//! server, the webhook bodies and the worker API's answers.
//!
//! Each output is also checked to hold what proves the path ran (the failure it reports, the
//! redacted form of the value), so that a secret missing from an empty output proves nothing.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::e2e::{decisions, ConfigParts, Setup};
use common::fake_kube::FakeKube;
use common::real::{
    beat, eventually, explain, free_port, serve, vigil, wait_listening, VigilProcess,
    WorkerContainer,
};

const REDIS_PASSWORD: &str = "s3cret-redis-7f1";
const WRONG_PASSWORD: &str = "s3cret-wrongpw-3a7";
const HOOK_PATH_TOKEN: &str = "s3cret-hook-9a2";
const HOOK_QUERY_TOKEN: &str = "s3cret-query-5c3";
const HOOK_PASSWORD: &str = "s3cret-hookpw-4d8";
const CHECKPOINT_TOKEN: &str = "s3cret-ckpt-6e4";
const SA_TOKEN: &str = "s3cret-satoken-8b5";
/// A token a caller of the worker API presents that the API server does not know.
const BOGUS_WORKER_TOKEN: &str = "s3cret-workertoken-1d9";

/// Every planted secret, and a part of each long enough to be telling (a secret cut in two by a
/// line break or an escape is still a leak).
const SECRETS: [&str; 8] = [
    REDIS_PASSWORD,
    WRONG_PASSWORD,
    HOOK_PATH_TOKEN,
    HOOK_QUERY_TOKEN,
    HOOK_PASSWORD,
    CHECKPOINT_TOKEN,
    SA_TOKEN,
    BOGUS_WORKER_TOKEN,
];

/// Fails naming the output and the secret found in it; also that the output is not empty.
fn assert_clean(what: &str, text: &str) {
    assert_clean_of(&SECRETS, what, text);
}

/// [`assert_clean`] for `secrets`.
fn assert_clean_of(secrets: &[&str], what: &str, text: &str) {
    assert!(!text.trim().is_empty(), "{what}: empty, so it proves nothing");
    for secret in secrets {
        let tail = &secret[secret.len() - 7..];
        assert!(
            !text.contains(secret) && !text.contains(tail),
            "{what} shows the secret {secret}:\n{text}"
        );
    }
}

/// A webhook (or checkpoint endpoint) standing in for Slack: any path, any method; it keeps what
/// it was sent and answers `status`. Plain HTTP, so an `https://` URL to it is a TLS error.
struct Sink {
    port: u16,
    /// (path and query, body) of every request.
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Sink {
    async fn start(status: u16) -> Sink {
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let kept = seen.clone();
        let app =
            axum::Router::new().fallback(move |uri: axum::http::Uri, body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let target = uri.path_and_query().map(|p| p.to_string());
                    let body = String::from_utf8_lossy(&body).to_string();
                    kept.lock().unwrap().push((target.unwrap_or_default(), body));
                    (axum::http::StatusCode::from_u16(status).unwrap(), "sink says no")
                }
            });
        let addr = serve(app).await;
        Sink { port: addr.port(), seen }
    }

    /// The webhook URL to it, with every webhook secret planted: userinfo password, path token,
    /// query token.
    fn webhook(&self, scheme: &str) -> String {
        format!(
            "{scheme}://vigil:{HOOK_PASSWORD}@127.0.0.1:{}/services/T000/B000/{HOOK_PATH_TOKEN}?token={HOOK_QUERY_TOKEN}",
            self.port
        )
    }

    fn bodies(&self) -> Vec<String> {
        self.seen.lock().unwrap().iter().map(|(_, b)| b.clone()).collect()
    }

    /// Whether a request came with the secret path (the webhook was really used).
    fn used_the_secret_url(&self) -> bool {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .any(|(t, _)| t.contains(HOOK_PATH_TOKEN) && t.contains(HOOK_QUERY_TOKEN))
    }
}

/// A redis-server of the test's own, password-protected (`--requirepass`).
struct AuthRedis {
    port: u16,
    _dir: tempfile::TempDir,
    child: Child,
}

impl AuthRedis {
    fn start() -> AuthRedis {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--requirepass", REDIS_PASSWORD])
            .args(["--dir", dir.path().to_str().unwrap()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        assert!(wait_listening(port), "redis-server did not listen on {port}");
        AuthRedis { port, _dir: dir, child }
    }

    fn url(&self, password: &str) -> String {
        format!("redis://:{password}@127.0.0.1:{}/0", self.port)
    }

    /// Every key and everything in it (strings, hashes, streams — the trail —, lists, sets,
    /// sorted sets), as text.
    async fn dump(&self) -> String {
        let client = redis::Client::open(self.url(REDIS_PASSWORD)).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut c).await.unwrap();
        let mut out = String::new();
        for key in keys {
            let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut c).await.unwrap();
            let cmd = match kind.as_str() {
                "string" => redis::cmd("GET").arg(&key).clone(),
                "hash" => redis::cmd("HGETALL").arg(&key).clone(),
                "stream" => redis::cmd("XRANGE").arg(&key).arg("-").arg("+").clone(),
                "list" => redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).clone(),
                "set" => redis::cmd("SMEMBERS").arg(&key).clone(),
                "zset" => redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).arg("WITHSCORES").clone(),
                other => panic!("key {key} of type {other}: dump it too"),
            };
            let value: redis::Value = cmd.query_async(&mut c).await.unwrap();
            out.push_str(&format!("{key} ({kind}): {value:?}\n"));
        }
        out
    }
}

impl Drop for AuthRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A kubeconfig for the fake API server whose user authenticates with `tokenFile`, as the
/// in-cluster ServiceAccount token is read; its path.
fn kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let token = dir.join("token");
    std::fs::write(&token, SA_TOKEN).unwrap();
    let text = format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {server}
contexts:
- name: fake
  context:
    cluster: fake
    user: vigil
    namespace: default
current-context: fake
users:
- name: vigil
  user:
    tokenFile: {token}
"#,
        token = token.display()
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

/// The agent's config: the webhook with its secrets, the checkpoint endpoint with its token,
/// debug logs, `tables` more, and `worker_api` (empty: the rig's loopback one).
fn config(s: &Setup, webhook: &str, checkpoint: &str, tables: &str, worker_api: &str) -> PathBuf {
    s.write_config(ConfigParts {
        worker_api,
        tables: &format!(
            r#"[safety]
lock_ttl = "30s"
[alerts]
webhook_url = "{webhook}"
attempts = 2
timeout = "2s"
[checkpoint]
method = "{checkpoint}"
label = "{label}.checkpoint"
grace = "8s"
# The SIGTERM's round is where a checkpoint endpoint's token could leak: always one here.
on_sigterm = "always"
sigterm_budget = "3s"
preemption_budget = "3s"
[metadata]
enabled = "off"
[log]
level = "debug"
{tables}"#,
            label = s.label,
        ),
        ..ConfigParts::default()
    })
}

/// `vigil ARGS --config CFG` with `envs`: (exit code, stdout and stderr together).
fn cli(args: &[&str], cfg: &Path, envs: &[(&str, &str)]) -> (i32, String) {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--config", cfg.to_str().unwrap()]);
    let (code, out, err) = vigil(&all, envs);
    (code, format!("{out}{err}"))
}

/// The agent's `/metrics`, `/healthz`, `/readyz`, `/v1/status` and `/v1/trail`, as text.
async fn served(s: &Setup) -> String {
    let mut out = String::new();
    for path in
        ["/metrics", "/healthz", "/readyz", "/v1/status", "/v1/status?format=json", "/v1/trail"]
    {
        let text = s.get(path).await.text().await.unwrap();
        out.push_str(&format!("{path}:\n{text}\n"));
    }
    out
}

/// The agent log at debug level, RUST_LOG winning over the file.
const DEBUG: (&str, &str) = ("RUST_LOG", "debug");

/// Redis refused and AUTH refused, the webhook over TLS to a plain port and answering 500, Redis
/// over TLS to a plain server, Sentinels refused: every failure is reported, no secret with it.
#[tokio::test(flavor = "multi_thread")]
async fn failures_are_reported_without_a_secret() {
    let plain = Sink::start(500).await;
    let auth = AuthRedis::start();

    // Redis refused (a password to a closed port); the coordinator-down alert posted over TLS
    // to a plain-HTTP port.
    let s = Setup::new("sec");
    let cfg = config(&s, &plain.webhook("https"), "record", "", "");
    let refused = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{}/0", free_port());
    let env = [("REDIS_URL", refused.as_str()), DEBUG];
    let agent = VigilProcess::spawn(&["run"], &cfg, &env);
    let said =
        eventually(Duration::from_secs(20), || agent.log_text().contains("alert delivery failed"))
            .await;
    let log = agent.log_text();
    assert!(said, "the alert delivery failed and says so:\n{log}");
    assert!(log.contains("coordinator unavailable"), "{log}");
    assert!(
        log.contains(&format!("https://***@127.0.0.1:{}/***", plain.port)),
        "the webhook, redacted:\n{log}"
    );
    assert!(log.contains("redis://:***@127.0.0.1:"), "{log}");
    assert_clean("agent log, Redis refused, webhook TLS error", &log);
    let ready = served(&s).await;
    assert!(ready.contains("vigil_"), "{ready}");
    assert_clean("/metrics /healthz /readyz, Redis refused", &ready);
    drop(agent);
    let (code, out) = cli(&["config", "check"], &cfg, &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("https://***@127.0.0.1:"), "{out}");
    assert_clean("config check", &out);
    let (code, out) = cli(&["doctor"], &cfg, &env);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  redis"), "{out}");
    assert_clean("doctor, Redis refused", &out);
    let (code, out) = cli(&["status"], &cfg, &env);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("unreachable"), "{out}");
    assert_clean("status, Redis refused", &out);
    let (code, out) = cli(&["explain", &s.node], &cfg, &env);
    assert_eq!(code, 1, "{out}");
    assert_clean("explain, Redis refused", &out);

    // Redis AUTH refused (the wrong password); the webhook answers 500.
    let s = Setup::new("sec");
    let cfg = config(&s, &plain.webhook("http"), "record", "", "");
    let wrong = auth.url(WRONG_PASSWORD);
    let env = [("REDIS_URL", wrong.as_str()), DEBUG];
    let agent = VigilProcess::spawn(&["run"], &cfg, &env);
    let said =
        eventually(Duration::from_secs(20), || agent.log_text().contains("alert delivery failed"))
            .await;
    let log = agent.log_text();
    assert!(said, "{log}");
    assert!(log.contains("HTTP 500"), "{log}");
    assert!(log.contains("authentication failed"), "the AUTH failure is said:\n{log}");
    assert_clean("agent log, Redis AUTH refused, webhook 500", &log);
    drop(agent);
    assert!(plain.used_the_secret_url(), "the webhook was really called");
    let bodies = plain.bodies().join("\n");
    assert!(bodies.contains("coordinator-down"), "{bodies}");
    assert!(bodies.contains("authentication failed"), "{bodies}");
    assert_clean("webhook bodies, Redis AUTH refused", &bodies);
    let beat = ["beat", "--worker", &s.worker, "--state", "idle"];
    for cmd in [&["doctor"][..], &["status"], &["explain", &s.node], &beat] {
        let (code, out) = cli(cmd, &cfg, &env);
        assert_eq!(code, 1, "{cmd:?}: {out}");
        assert!(out.contains("authentication failed"), "{cmd:?}: {out}");
        assert_clean(&format!("{cmd:?}, Redis AUTH refused"), &out);
    }

    // Redis over TLS to a plain server, Sentinels and cluster seeds that refuse: the commands
    // say so.
    let tls = format!("rediss://:{REDIS_PASSWORD}@127.0.0.1:{}/0", auth.port);
    let two = format!(
        "redis://vigil:{REDIS_PASSWORD}@127.0.0.1:{},redis://vigil:{REDIS_PASSWORD}@127.0.0.1:{}",
        free_port(),
        free_port()
    );
    let dir = tempfile::tempdir().unwrap();
    let mode = |mode: &str| {
        let path = dir.path().join(format!("{mode}.toml"));
        let text = format!(
            "node_name = \"n1\"\n[redis]\nmode = \"{mode}\"\nsentinel_service = \"vigil\"\n\
             [metadata]\nenabled = \"off\"\n"
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let (sentinel_cfg, cluster_cfg) = (mode("sentinel"), mode("cluster"));
    for (what, url, cfg) in [
        ("TLS to a plain Redis", &tls, &cfg),
        ("Sentinels refused", &two, &sentinel_cfg),
        ("cluster seeds refused", &two, &cluster_cfg),
    ] {
        let env = [("REDIS_URL", url.as_str())];
        let (code, out) = cli(&["config", "check"], cfg, &env);
        assert_eq!(code, 0, "{what}: {out}");
        assert!(out.contains(":***@127.0.0.1:"), "{what}: {out}");
        assert_clean(&format!("config check, {what}"), &out);
        for cmd in [&["doctor"][..], &["status"]] {
            let (code, out) = cli(cmd, cfg, &env);
            assert_eq!(code, 1, "{what}, {cmd:?}: {out}");
            assert_clean(&format!("{cmd:?}, {what}"), &out);
        }
    }
}

/// The right password: the agent runs, a hung worker is restarted with its alerts (the webhook
/// answering 500), the Events go to the API server through a ServiceAccount token, and SIGTERM's
/// checkpoint POST fails on TLS. The trail and every key in Redis, the Events, the Node, the
/// webhook bodies, the log and every command's output are free of every secret.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_agent_writes_no_secret_anywhere() {
    let hook = Sink::start(500).await;
    let auth = AuthRedis::start();
    let s = Setup::new("sec");
    let kube = FakeKube::start(&s.node).await;
    let kubeconfig = kubeconfig(s.dir.path(), &kube.url);
    let checkpoint = format!("https://127.0.0.1:{}/ckpt?token={CHECKPOINT_TOKEN}", hook.port);
    let worker_api = format!(
        "[worker_api]\nlisten = \"{}\"\nauth = \"kubernetes\"\naudience = \"vigil\"\n",
        s.worker_listen
    );
    let cfg = config(
        &s,
        &hook.webhook("http"),
        &checkpoint,
        "[kubernetes]\nenabled = \"on\"\n",
        &worker_api,
    );
    // Worker tokens the API server knows but that may not write this worker: one for another
    // audience, one bound to a pod that is not the worker's.
    let wrong_audience =
        kube.mint("default", Some(("trainer", "uid-1")), Some(&s.node), &["other"]);
    let other_pod = kube.mint("default", Some(("someone", "uid-2")), Some(&s.node), &["vigil"]);
    let mut secrets = SECRETS.to_vec();
    secrets.extend([wrong_audience.as_str(), other_pod.as_str()]);
    let clean = |what: &str, text: &str| assert_clean_of(&secrets, what, text);
    let right = auth.url(REDIS_PASSWORD);
    let env = [("REDIS_URL", right.as_str()), ("KUBECONFIG", kubeconfig.to_str().unwrap()), DEBUG];
    let container = WorkerContainer::start(&s.label, &s.worker);
    let before = container.started_at();
    let (code, out, err) =
        beat(&cfg, &s.worker, "processing", &["--job", "job-42"], &[("REDIS_URL", &right)]);
    assert_eq!(code, 0, "{out}{err}");
    let mut agent = VigilProcess::spawn(&["run"], &cfg, &env);
    let restarted = eventually(Duration::from_secs(40), || container.started_at() != before).await;
    assert!(restarted, "no restart:\n{}", agent.log_text());
    let ready = served(&s).await;
    assert!(ready.contains("vigil_restarts_total"), "{ready}");
    clean("/metrics /healthz /readyz", &ready);
    // Writes with a token that may not write this worker are refused; the refusal names no
    // token.
    let put = s.worker_url(&format!("/v1/workers/{}/status", s.worker));
    for (token, code) in
        [(BOGUS_WORKER_TOKEN, 401), (wrong_audience.as_str(), 401), (other_pod.as_str(), 403)]
    {
        let r = reqwest::Client::new()
            .put(&put)
            .bearer_auth(token)
            .body("{\"state\":\"idle\"}")
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let answer = r.text().await.unwrap();
        assert_eq!(status, code, "{answer}");
        clean("a refused worker API write's answer", &answer);
    }
    let (code, out) = cli(&["status"], &cfg, &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&s.node), "{out}");
    clean("status", &out);
    let (code, out) = cli(&["status", "--json"], &cfg, &env);
    assert_eq!(code, 0, "{out}");
    clean("status --json", &out);

    let status = agent.sigterm_and_wait(Duration::from_secs(12)).await;
    assert!(status.success(), "{status:?}\n{}", agent.log_text());
    let log = agent.log_text();
    assert!(log.contains("alert delivery failed"), "{log}");
    assert!(log.contains("worker API: refused"), "{log}");
    assert!(log.contains("DEBUG"), "debug lines were written:\n{log}");
    clean("agent log", &log);

    let (code, trail, err) = explain(&cfg, &s.node, &[], &env);
    assert_eq!(code, 0, "{err}");
    assert_eq!(decisions(&trail, "restarted"), 1, "{trail}");
    let ckpt = format!("POST https://127.0.0.1:{}/ckpt?token=***", hook.port);
    assert!(trail.contains(&ckpt), "the failed checkpoint, redacted:\n{trail}");
    clean("explain", &trail);
    let stored = auth.dump().await;
    assert!(stored.contains(&ckpt), "{stored}");
    clean("every key in Redis", &stored);

    let events = serde_json::to_string_pretty(&kube.events()).unwrap();
    assert!(events.contains("VigilCheckpoint"), "{events}");
    clean("Events", &events);
    clean("Node", &kube.node().to_string());

    assert!(hook.used_the_secret_url(), "the webhook was really called");
    let bodies = hook.bodies().join("\n");
    assert!(bodies.contains("\"hung\"") && bodies.contains("\"restarting\""), "{bodies}");
    clean("webhook bodies", &bodies);

    for cmd in [&["config", "check"][..], &["doctor"]] {
        let (_, out) = cli(cmd, &cfg, &env);
        clean(&format!("{cmd:?}"), &out);
    }
    let (code, out) = cli(&["config", "check"], &cfg, &env);
    assert_eq!(code, 0, "{out}");
    for shown in [
        format!("http://***@127.0.0.1:{}/***", hook.port),
        format!("https://127.0.0.1:{}/ckpt?token=***", hook.port),
    ] {
        assert!(out.contains(&shown), "{shown}:\n{out}");
    }
    let (_, out) = cli(&["doctor"], &cfg, &env);
    assert!(out.contains("ok    redis"), "{out}");
    assert!(out.contains("ok    kubernetes"), "through the token: {out}");
}
