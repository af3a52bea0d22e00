//! Where `/proc` is: the unix-socket listener reads a peer's cgroup there (`super::listen`), and
//! the worker API proves which container that peer runs in from it (`crate::worker_api::peer`).

use std::path::PathBuf;

/// Where `/proc` is (the host's, in the agent's PID namespace).
#[derive(Debug, Clone)]
pub(crate) struct Procfs {
    root: PathBuf,
}

impl Default for Procfs {
    fn default() -> Self {
        Procfs {
            root: PathBuf::from("/proc"),
        }
    }
}

impl Procfs {
    /// A procfs mounted at `root` (a fake tree in the tests).
    #[cfg(test)]
    pub(crate) fn at(root: &std::path::Path) -> Procfs {
        Procfs {
            root: root.to_path_buf(),
        }
    }

    /// `/proc/<pid>/cgroup`, as this PID and cgroup namespace see it.
    pub(crate) fn cgroup_of_pid(&self, pid: i32) -> Result<String, String> {
        if pid <= 0 {
            return Err(format!(
                "the peer's pid is {pid}: it is not visible from the agent's PID namespace (run the agent with hostPID)"
            ));
        }
        let path = self.root.join(pid.to_string()).join("cgroup");
        std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    }
}
