//! Real highly-available Redis set-ups for the coordination suite, all on loopback: a Redis
//! Cluster of three masters (`redis-server --cluster-enabled yes`, joined by
//! `redis-cli --cluster create`), and a master with one replica watched by one Sentinel.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::real::{free_port, wait_listening};

fn spawn(args: &[&str], dir: &Path) -> Child {
    let child = Command::new("redis-server")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (scripts/setup.sh installs it)");
    child
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Processes killed (and waited for) on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Three masters, all slots assigned.
pub struct Cluster {
    pub ports: Vec<u16>,
    _procs: Procs,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut procs = Procs(Vec::new());
        for p in &ports {
            let sub = dir.path().join(p.to_string());
            std::fs::create_dir_all(&sub).unwrap();
            let port = p.to_string();
            procs.0.push(spawn(
                &[
                    "--port",
                    &port,
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                &sub,
            ));
            assert!(wait_listening(*p), "cluster node {p} did not listen");
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new("redis-cli").args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for p in &ports {
            until(Duration::from_secs(20), "cluster_state:ok", || {
                cli(*p, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
            });
        }
        Cluster { ports, _procs: procs, _dir: dir }
    }

    /// The seed nodes, comma-separated (`redis.url` with `redis.mode = "cluster"`).
    pub fn url(&self) -> String {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// How many `TIME` commands each master has run so far (`INFO commandstats`, a script's own
    /// calls included), in the order of `ports`.
    pub fn time_calls(&self) -> Vec<u64> {
        let calls = |stats: String| -> Option<u64> {
            let line = stats.lines().find_map(|l| l.strip_prefix("cmdstat_time:calls="))?;
            line.split(',').next()?.parse().ok()
        };
        self.ports.iter().map(|p| calls(cli(*p, &["INFO", "commandstats"])).unwrap_or(0)).collect()
    }
}

/// A master, one replica, and one Sentinel (quorum 1) that monitors them as `vigil`.
pub struct Sentinel {
    pub master: u16,
    pub replica: u16,
    pub sentinel: u16,
    _procs: Procs,
    _dir: tempfile::TempDir,
}

pub const SERVICE: &str = "vigil";

impl Sentinel {
    pub fn start() -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        let (master, replica, sentinel) = (free_port(), free_port(), free_port());
        let mut procs = Procs(Vec::new());
        let base = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
        let m = master.to_string();
        let mut args = vec!["--port", &m];
        args.extend(base);
        procs.0.push(spawn(&args, dir.path()));
        assert!(wait_listening(master));
        let r = replica.to_string();
        let mut args = vec!["--port", &r, "--replicaof", "127.0.0.1", &m];
        args.extend(base);
        procs.0.push(spawn(&args, dir.path()));
        assert!(wait_listening(replica));
        until(Duration::from_secs(20), "the replica in sync", || {
            cli(replica, &["INFO", "replication"]).contains("master_link_status:up")
        });
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel}\nbind 127.0.0.1\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {master} 1\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 5000\n"
            ),
        )
        .unwrap();
        procs.0.push(spawn(&[conf.to_str().unwrap(), "--sentinel"], dir.path()));
        assert!(wait_listening(sentinel), "sentinel did not listen");
        let s = Sentinel { master, replica, sentinel, _procs: procs, _dir: dir };
        until(Duration::from_secs(20), "the sentinel sees the replica", || {
            cli(sentinel, &["SENTINEL", "REPLICAS", SERVICE]).contains(&replica.to_string())
        });
        s
    }

    /// `redis.url` with `redis.mode = "sentinel"`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.sentinel)
    }

    /// The port Sentinel names as the master now.
    pub fn master_port(&self) -> u16 {
        let out = cli(self.sentinel, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE]);
        out.lines().nth(1).and_then(|p| p.trim().parse().ok()).unwrap_or(0)
    }

    /// Wait until the replica has every write the master acknowledged so far.
    pub fn sync(&self) {
        let n = cli(self.master, &["WAIT", "1", "2000"]);
        assert_eq!(n.trim(), "1", "WAIT: {n}");
    }

    /// Force a failover to the replica and wait until Sentinel names it.
    pub fn failover(&self) {
        let out = cli(self.sentinel, &["SENTINEL", "FAILOVER", SERVICE]);
        assert!(out.contains("OK"), "SENTINEL FAILOVER: {out}");
        until(Duration::from_secs(30), "the replica promoted", || {
            self.master_port() == self.replica && cli(self.replica, &["ROLE"]).starts_with("master")
        });
        // Until Sentinel reconfigures it, the old master still takes writes (and loses them):
        // the window a failover can forget in (docs/safety.md).
        until(Duration::from_secs(30), "the old master demoted", || {
            cli(self.master, &["ROLE"]).starts_with("slave")
        });
    }

    /// `GET key` on the server at `port`.
    pub fn get(&self, port: u16, key: &str) -> String {
        cli(port, &["GET", key]).trim().to_string()
    }
}
