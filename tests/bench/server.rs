//! A private `redis-server` on a free port for the benchmarks, killed on drop. It runs in a temp
//! directory of its own, so nothing it might write (a `dump.rdb`) lands in the checkout.

use std::time::Duration;

pub struct Server {
    child: std::process::Child,
    port: u16,
    /// Its `--dir`, removed on drop.
    _dir: tempfile::TempDir,
}

impl Server {
    /// Started with persistence off and `extra` arguments (e.g. `--maxclients`).
    pub fn start(extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let dir = tempfile::tempdir().expect("a temp dir for redis-server");
        let mut child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--dir", dir.path().to_str().unwrap()])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (scripts/setup.sh installs it)");
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Server { child, port, _dir: dir };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server did not listen on {port}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
