//! A private `redis-server` on a free port for the benchmarks, killed on drop.

use std::time::Duration;

pub struct Server(std::process::Child, u16);

impl Server {
    /// Started with persistence off and `extra` arguments (e.g. `--maxclients`).
    pub fn start(extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (scripts/setup.sh installs it)");
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Server(child, port);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server did not listen on {port}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.1)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
