//! Helpers for the real services: a Redis server the test starts on a free port (or the one the
//! test script started, via `VIGIL_TEST_REDIS_URL`), the real Docker daemon with a tiny busybox
//! image built by `docker import` (its root file system is shared with the Podman rig), a local
//! webhook receiver, and the `vigil` binary itself.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const TEST_IMAGE: &str = "vigil-test-busybox:2";

/// A free local port for a server a test starts, in 10000–19999: below the kernel's ephemeral
/// range, and clear of the Redis Cluster bus ports (a node's port + 10000) of the clusters tests
/// start. NB: a port the kernel hands out (`bind` to port 0) is one it may hand out again at once
/// to any outgoing connection of any test (to Redis, Docker, containerd) before the server binds
/// it — CI saw "Address already in use" so. A port of this range is only ever taken by a bind.
/// And a port picked is *reserved* across the test processes (nextest runs each test in its own):
/// checked free is not enough, a parallel test could pick the same free port in the seconds
/// before the first one's server binds it (CI saw that too, twice); see [`reserve`].
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let (first, span) = (10_000u16, low.saturating_sub(10_000).clamp(1_000, 10_000));
    let seed = std::collections::hash_map::RandomState::new();
    for attempt in 0u64..5_000 {
        let mut h = seed.build_hasher();
        h.write_u64(attempt);
        h.write_u32(std::process::id());
        let port = first + (h.finish() % u64::from(span)) as u16;
        if reserve(port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {first}..{}: every one taken or reserved", first + span);
}

/// Reserve `port` for this test process among every test process of this machine: an
/// exclusive `flock` on a file named for the port in a shared directory, held until this process
/// exits (the servers it starts die with it). The kernel drops the lock with the process, so a
/// crashed run leaves nothing to clean up; within one process a second pick of the same port
/// fails too (a lock belongs to an open file, not to the process).
fn reserve(port: u16) -> bool {
    static HELD: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("vigil-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return false;
    };
    if file.try_lock().is_err() {
        return false;
    }
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(file);
    true
}

/// Wait (up to 5 s) until something listens on the local `port`; false if nothing does.
pub fn wait_listening(port: u16) -> bool {
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A unique key prefix, so tests sharing one Redis never see each other's keys.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{:08x}", rand::random::<u32>())
}

/// A redis-server process owned by the test, with its data directory (RDB persistence on
/// `SHUTDOWN SAVE`, so a stop/start keeps the data like a real restart of a persistent Redis).
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = RedisServer { port: free_port(), dir, child: None };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--dir", self.dir.path().to_str().unwrap()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server); scripts/test.sh does it");
        self.child = Some(child);
        if !wait_listening(self.port) {
            panic!("redis-server did not listen on port {}", self.port);
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stop the server, saving its data to disk first.
    pub fn stop(&mut self) {
        let _ = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "shutdown", "save"])
            .output();
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Start it again on the same port, from the saved data.
    pub fn restart(&mut self) {
        self.spawn();
    }

    /// Freeze (`SIGSTOP`) or thaw (`SIGCONT`) the server: it keeps its connections open and
    /// answers nothing, like a Redis stuck in a long fork or on a dead disk.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill").args([&format!("-{sig}"), &pid]).status().expect("kill");
        assert!(ok.success(), "kill -{sig} {pid}");
    }

    /// Kill it hard (`SIGKILL`, nothing saved) and start it again: a Redis that comes back
    /// empty.
    pub fn restart_empty(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(self.dir.path().join("dump.rdb"));
        self.spawn();
    }
}

impl RedisServer {
    /// Stop the server when this test process exits. NB: a server kept in a `static` is never
    /// dropped (nextest runs each test as a process of its own, so every one left a redis-server
    /// behind): a watchdog shell polls this process and kills the server once it is gone.
    // NB: the watchdog is never waited for: it must outlive this process (init reaps it).
    #[allow(clippy::zombie_processes)]
    fn outlive_no_test(&self) {
        let pid = self.child.as_ref().expect("running").id();
        let watch = format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; kill {pid}; rm -rf '{}'",
            std::process::id(),
            self.dir.path().display()
        );
        Command::new("sh")
            .args(["-c", &watch])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh");
    }
}

/// A child process killed (and reaped) when the test ends, passed or failed: a test's own
/// server outlives a failed assertion otherwise.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The shared Redis for this test binary: the script's, or one started here for the process.
pub fn shared_redis_url() -> String {
    static SERVER: Mutex<Option<(String, Option<RedisServer>)>> = Mutex::new(None);
    let mut guard = SERVER.lock().unwrap();
    if guard.is_none() {
        *guard = Some(match std::env::var("VIGIL_TEST_REDIS_URL") {
            Ok(url) if !url.is_empty() => (url, None),
            _ => {
                let s = RedisServer::start();
                s.outlive_no_test();
                (s.url(), Some(s))
            }
        });
    }
    guard.as_ref().unwrap().0.clone()
}

/// `GET key` on the Redis at `url`; None when it is unset or Redis cannot be reached.
pub async fn redis_get(url: &str, key: &str) -> Option<String> {
    let client = redis::Client::open(url).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    redis::cmd("GET").arg(key).query_async(&mut c).await.ok()?
}

/// One field of a hash on the Redis at `url` (None when absent or unreachable).
pub async fn redis_hget(url: &str, key: &str, field: &str) -> Option<String> {
    let client = redis::Client::open(url).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    redis::cmd("HGET").arg(key).arg(field).query_async(&mut c).await.ok()?
}

/// Whether `key` exists on the Redis at `url` (None when Redis cannot be reached).
pub async fn redis_exists(url: &str, key: &str) -> Option<bool> {
    let client = redis::Client::open(url).ok()?;
    let mut c = client.get_multiplexed_async_connection().await.ok()?;
    let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut c).await.ok()?;
    Some(n == 1)
}

/// The remaining TTL of `key` in ms (`PTTL`: -2 when it does not exist).
pub async fn redis_pttl(url: &str, key: &str) -> i64 {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("PTTL").arg(key).query_async(&mut c).await.unwrap()
}

/// Run a CLI (in `dir`, if given) that must succeed; its stdout, trimmed. A failure panics with
/// the command and its stderr.
pub fn run_cli(program: &str, args: &[&str], dir: Option<&Path>) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args);
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("the {program} CLI must be installed: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A finished command's exit code (-1 if a signal ended it) and its stdout and stderr, joined.
pub fn code_and_output(out: &std::process::Output) -> (i32, String) {
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// Panics, naming what to install, when one of `bins` is not on the PATH: the suites that need
/// a real runtime never skip.
pub fn require(bins: &[&str], who: &str) {
    for bin in bins {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {bin}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(found, "{bin} is needed for {who}");
    }
}

pub fn docker(args: &[&str]) -> String {
    run_cli("docker", args, None)
}

/// Build the tiny test image once: a rootfs holding only a static busybox, `docker import`ed
/// (no registry is reachable, so nothing is pulled).
pub fn ensure_image() {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let mut built = BUILT.lock().unwrap();
    if *built {
        return;
    }
    let exists = Command::new("docker")
        .args(["image", "inspect", TEST_IMAGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !exists {
        let root = tempfile::tempdir().unwrap();
        let tar = busybox_rootfs_tar(root.path());
        docker(&["import", tar.to_str().unwrap(), TEST_IMAGE]);
    }
    *built = true;
}

/// The test image's root file system, `dir/rootfs.tar`: a static busybox in `/bin` with the
/// applets the tests' scripts use. Its path.
pub fn busybox_rootfs_tar(dir: &Path) -> PathBuf {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("a static busybox is needed (apt-get install busybox-static)");
    let bin = dir.join("rootfs/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    for applet in ["sh", "sleep", "echo", "cat", "kill", "date", "true", "wget"] {
        let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
    }
    let tar = dir.join("rootfs.tar");
    let rootfs = dir.join("rootfs");
    let args = ["-C", rootfs.to_str().unwrap(), "-cf", tar.to_str().unwrap(), "bin"];
    run_cli("tar", &args, None);
    tar
}

/// A worker's script: a line a second, SIGTERM ignored (a shell as PID 1 has no handler).
pub const IGNORES_TERM: &str = "i=0; while true; do i=$((i+1)); echo step $i; sleep 1; done";

/// A worker's script: a line a second, exits at once on SIGTERM.
pub const EXITS_ON_TERM: &str =
    "trap 'exit 0' TERM; i=0; while true; do i=$((i+1)); echo step $i; sleep 1; done";

/// A running worker container, removed when dropped.
pub struct WorkerContainer {
    pub id: String,
}

impl WorkerContainer {
    /// Start a container opted in with `label=worker`. It logs a line a second and, like a
    /// real hung worker, ignores SIGTERM: its process is a shell as PID 1 with no handler, so
    /// only the SIGKILL at the end of the stop grace ends it.
    pub fn start(label: &str, worker: &str) -> WorkerContainer {
        Self::start_with(&["--label", &format!("{label}={worker}")], IGNORES_TERM)
    }

    /// Start a worker that exits at once on SIGTERM (a trainer with a handler).
    pub fn start_polite(label: &str, worker: &str) -> WorkerContainer {
        Self::start_with(&["--label", &format!("{label}={worker}")], EXITS_ON_TERM)
    }

    /// Freeze the container's main process with SIGSTOP: a SIGTERM then stays pending, its
    /// handler never runs, and only SIGKILL ends it.
    pub fn freeze(&self) {
        docker(&["kill", "--signal", "SIGSTOP", &self.id]);
    }

    /// Start a container with extra `docker run` arguments and a shell script as its process.
    pub fn start_with(args: &[&str], script: &str) -> WorkerContainer {
        ensure_image();
        let name = unique("vigil-test-");
        let mut all = vec!["run", "-d", "--name", &name];
        all.extend_from_slice(args);
        all.extend_from_slice(&[TEST_IMAGE, "/bin/sh", "-c", script]);
        let id = docker(&all);
        WorkerContainer { id }
    }

    pub fn logs(&self) -> String {
        let out = Command::new("docker")
            .args(["logs", &self.id])
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default();
        out
    }

    pub fn started_at(&self) -> String {
        docker(&["inspect", "-f", "{{.State.StartedAt}}", &self.id])
    }

    pub fn restart_count_by_start_times(&self, seen: &mut Vec<String>) {
        let s = self.started_at();
        if seen.last() != Some(&s) {
            seen.push(s);
        }
    }
}

impl Drop for WorkerContainer {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Serve `app` on a free local port for the rest of the test; its address.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// A local HTTP receiver standing in for the Slack webhook: it keeps every JSON body.
pub struct Receiver {
    pub url: String,
    pub bodies: Arc<Mutex<Vec<serde_json::Value>>>,
    /// When each of `bodies` arrived (same index), before it was answered.
    pub arrived: Arc<Mutex<Vec<std::time::SystemTime>>>,
}

/// Something a test does when an alert of one kind arrives, before the receiver answers (so the
/// agent is still waiting on its alert: a person acting in the middle of the restart path).
pub type OnAlert = Arc<dyn Fn() + Send + Sync>;

impl Receiver {
    pub async fn start() -> Receiver {
        Receiver::start_with(None).await
    }

    /// A receiver that runs `on.1` (blocking) when an alert of kind `on.0` arrives.
    pub async fn start_with(on: Option<(&'static str, OnAlert)>) -> Receiver {
        use axum::routing::post;
        let bodies: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let arrived: Arc<Mutex<Vec<std::time::SystemTime>>> = Arc::default();
        let (b, a) = (bodies.clone(), arrived.clone());
        let app = axum::Router::new().route(
            "/hook",
            post(move |body: axum::body::Bytes| {
                let (b, a) = (b.clone(), a.clone());
                let on = on.clone();
                async move {
                    let at = std::time::SystemTime::now();
                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
                        if let Some((kind, action)) = on {
                            if v["vigil"]["kind"] == kind {
                                let _ = tokio::task::spawn_blocking(move || action()).await;
                            }
                        }
                        let mut kept = b.lock().unwrap();
                        kept.push(v);
                        a.lock().unwrap().push(at);
                    }
                    "ok"
                }
            }),
        );
        let addr = serve(app).await;
        Receiver { url: format!("http://{addr}/hook"), bodies, arrived }
    }

    pub fn kinds(&self) -> Vec<String> {
        self.bodies
            .lock()
            .unwrap()
            .iter()
            .map(|b| b["vigil"]["kind"].as_str().unwrap_or("?").to_string())
            .collect()
    }

    pub fn count(&self, kind: &str) -> usize {
        self.kinds().iter().filter(|k| *k == kind).count()
    }
}

/// A `vigil` process, killed when dropped. Its stderr goes to a file for post-mortems.
pub struct VigilProcess {
    pub child: Child,
    pub log: PathBuf,
}

impl VigilProcess {
    pub fn spawn(args: &[&str], config: &Path, envs: &[(&str, &str)]) -> VigilProcess {
        let log = config.with_extension(format!("{}.log", rand::random::<u16>()));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigil"));
        cmd.args(args)
            .arg("--config")
            .arg(config)
            .env_remove("REDIS_URL")
            .env_remove("NODE_NAME")
            .env_remove("DOCKER_HOST")
            .stdout(Stdio::null())
            .stderr(file);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        VigilProcess { child: cmd.spawn().expect("spawn vigil"), log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kill it with SIGKILL, as the OOM killer or a node's crash would: nothing of it runs on.
    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Send a signal (`-TERM`, `-HUP`) with `kill`, as an operator or the kubelet would.
    pub fn signal(&self, sig: &str) {
        Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap();
    }

    /// Its exit status, once it exits; panics with `what` and the log if it is still running
    /// `limit` after `started`.
    pub async fn wait_exit(&mut self, started: Instant, limit: Duration, what: &str) -> ExitStatus {
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(started.elapsed() < limit, "{what}:\n{}", self.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then its exit status; panics if it is still running after `limit`.
    pub async fn sigterm_and_wait(&mut self, limit: Duration) -> ExitStatus {
        let started = Instant::now();
        self.signal("-TERM");
        self.wait_exit(started, limit, "still running after the grace period").await
    }
}

impl Drop for VigilProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `vigil` to completion and return (exit code, stdout, stderr).
pub fn vigil(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigil"));
    cmd.args(args).env_remove("REDIS_URL").env_remove("NODE_NAME").env_remove("VIGIL_CONFIG");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run vigil");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `beat(first)`, then `gap` later every other of ranks `0..n` at once (threads): ranks that
/// stop together, `first` a moment before the rest. NB: at once: sequential `vigil beat`
/// process starts can outlast the margin a test means (inside `confirm_after`, else a rank
/// still progresses beside the stopped one: a straggler) on a loaded machine.
pub async fn beat_first_then_together(
    n: usize,
    first: usize,
    gap: std::time::Duration,
    beat: impl Fn(usize) + Sync,
) {
    beat(first);
    tokio::time::sleep(gap).await;
    std::thread::scope(|scope| {
        for i in (0..n).filter(|i| *i != first) {
            let beat = &beat;
            scope.spawn(move || beat(i));
        }
    });
}

/// `vigil beat --config CONFIG --worker WORKER --state STATE EXTRA...`.
pub fn beat(
    config: &Path,
    worker: &str,
    state: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (i32, String, String) {
    let mut args =
        vec!["beat", "--config", config.to_str().unwrap(), "--worker", worker, "--state", state];
    args.extend_from_slice(extra);
    vigil(&args, envs)
}

/// `vigil explain --config CONFIG NODE EXTRA...`.
pub fn explain(
    config: &Path,
    node: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (i32, String, String) {
    let mut args = vec!["explain", "--config", config.to_str().unwrap(), node];
    args.extend_from_slice(extra);
    vigil(&args, envs)
}

/// Run `probe` every `every` until it yields a value, for at most `limit` (then once more);
/// None on timeout.
pub async fn poll_every<T, F: Future<Output = Option<T>>>(
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut() -> F,
) -> Option<T> {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// [`poll_every`] 100 ms.
pub async fn poll<T, F: Future<Output = Option<T>>>(
    limit: Duration,
    probe: impl FnMut() -> F,
) -> Option<T> {
    poll_every(limit, Duration::from_millis(100), probe).await
}

/// Wait until `cond` holds, checking every `every`; false on timeout (then the caller's
/// assertion prints what it saw).
pub async fn eventually_every(
    limit: Duration,
    every: Duration,
    mut cond: impl FnMut() -> bool,
) -> bool {
    poll_every(limit, every, || std::future::ready(cond().then_some(()))).await.is_some()
}

/// Wait until `cond` holds, polling every 100 ms; false on timeout (then the caller's assertion
/// prints what it saw).
pub async fn eventually(limit: Duration, cond: impl FnMut() -> bool) -> bool {
    eventually_every(limit, Duration::from_millis(100), cond).await
}
