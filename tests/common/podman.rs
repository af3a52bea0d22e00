//! A private Podman owned by the test: `podman system service` serving the Docker-compatible API
//! on a socket in a temp dir, with its own `containers.conf` and `storage.conf` (pointed to by
//! `CONTAINERS_CONF` and `CONTAINERS_STORAGE_CONF`) so that its storage, run state, events log
//! and network configuration all live in that dir and the machine's own Podman is untouched.
//! The only thing written outside it is containers/image's blob-info cache
//! (`/var/lib/containers/cache`), which `podman import` keeps for root.
//!
//! Settings found by trying on Debian's Podman 4.3 (there is no systemd and the sandbox refuses
//! to raise RLIMIT_NOFILE):
//! - `default_ulimits = []`: without it no container starts (`--ulimit host` does not help);
//! - `cgroup_manager = "cgroupfs"` and `events_logger = "file"`: no systemd, no journald;
//! - the `vfs` storage driver and containers with `--network none --ipc none`: no mounts, no
//!   CNI bridge or iptables rules are left behind on the machine.
//!
//! The image is the Docker tests' busybox root file system, `podman import`ed (no registry is
//! reachable). Everything on Vigil's side of the socket is the production adapter.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::real::{busybox_rootfs_tar, require, unique};

/// The image every worker runs (`localhost/` is how Podman names an imported image).
pub const PODMAN_IMAGE: &str = "localhost/vigil-test/busybox:1";

/// A `podman system service` private to the test, stopped (its containers removed) when dropped.
pub struct Podman {
    dir: tempfile::TempDir,
    service: Option<Child>,
}

impl Podman {
    /// Write its configuration, import the image and start the service. Panics with what to
    /// install when a binary is missing: these tests never skip.
    pub fn start() -> Podman {
        require(
            &["podman", "conmon", "runc"],
            "the Podman tests (apt-get install podman; scripts/setup.sh does it)",
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path().display();
        std::fs::write(
            dir.path().join("containers.conf"),
            format!(
                r#"[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{d}/events.log"
tmp_dir = "{d}/tmp"
[network]
network_config_dir = "{d}/net"
"#
            ),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("storage.conf"),
            format!(
                r#"[storage]
driver = "vfs"
graphroot = "{d}/root"
runroot = "{d}/runroot"
"#
            ),
        )
        .unwrap();
        let mut p = Podman { dir, service: None };
        let tar = busybox_rootfs_tar(p.dir.path());
        p.cli(&["import", tar.to_str().unwrap(), PODMAN_IMAGE]);
        p.spawn();
        p
    }

    /// The socket of its Docker-compatible API (a path).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("podman.sock")
    }

    /// Where its service writes what it logs.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("service.log")).unwrap_or_default()
    }

    fn command(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.dir.path().join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.path().join("storage.conf"));
        c
    }

    /// Run the `podman` CLI on this instance's storage; its stdout, trimmed. A failure panics
    /// with the command and its stderr.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.command().args(args).output().expect("podman runs");
        assert!(
            out.status.success(),
            "podman {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("service.log")).unwrap();
        let address = format!("unix://{}", self.socket().display());
        let child = self
            .command()
            .args(["system", "service", "--time=0", &address])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("podman system service starts");
        self.service = Some(child);
        // NB: ready once it answers, not once its socket exists: a loaded machine (the suites
        // run side by side) can keep the service's first answer past a test's 2 s call timeout.
        for _ in 0..600 {
            if self.socket().exists() && self.pings() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("podman did not answer on its socket; its log:\n{}", self.log());
    }

    /// Whether the service answers `GET /_ping` on its socket within 5 s.
    fn pings(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(self.socket()) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        if s.write_all(b"GET /_ping HTTP/1.1\r\nHost: podman\r\nConnection: close\r\n\r\n").is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.starts_with("HTTP/1.1 200")
    }

    /// Start a container running `script` under `sh -c`, with more `podman run` arguments
    /// (`--label vigil.worker=w0` opts it in); its id.
    pub fn run(&self, args: &[&str], script: &str) -> String {
        let name = unique("vigil-podman-");
        let mut all = vec!["run", "-d", "--name", &name, "--network", "none", "--ipc", "none"];
        all.extend_from_slice(args);
        all.extend_from_slice(&[PODMAN_IMAGE, "/bin/sh", "-c", script]);
        self.cli(&all)
    }

    /// The container's start time, written as the API writes it (RFC 3339, nanoseconds).
    pub fn started_at(&self, id: &str) -> String {
        let format = r#"{{.State.StartedAt.Format "2006-01-02T15:04:05.999999999Z07:00"}}"#;
        self.cli(&["inspect", "--format", format, id])
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self
            .command()
            .args(["rm", "--all", "--force", "--time", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(mut c) = self.service.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // NB: each container's conmon runs `podman container cleanup` once it exits; one still
        // running would write its state again into the removed dir.
        for _ in 0..100 {
            if processes_naming(self.dir.path()) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        unmount_under(self.dir.path());
    }
}

/// How many processes have `dir` in their command line (conmon, `podman container cleanup`).
fn processes_naming(dir: &Path) -> usize {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(&needle))
        .count()
}

/// Best effort: lazily unmount whatever is still mounted under `dir` (nothing, normally: the
/// containers run without /dev/shm on vfs), so that the temp dir can be removed.
fn unmount_under(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").args(["-l", p]).status();
    }
}
