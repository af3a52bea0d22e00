//! Where `/proc` is: the unix-socket listener reads a peer's cgroup there (`super::listen`), and
//! the worker API proves which container that peer runs in from it (`crate::worker_api::peer`).

use std::path::PathBuf;
use std::sync::Arc;

/// Why a process's cgroup (and so the container a unix-socket peer runs in) is not known.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CgroupUnknown {
    /// The kernel gave no pid (0) or one outside this PID namespace.
    #[error("the peer's pid is {0}: it is not visible from the agent's PID namespace (run the agent with hostPID)")]
    Invisible(i32),
    /// `/proc/<pid>/cgroup` could not be read (the process is gone, or procfs is not the host's).
    #[error("cannot read {path}: {source}")]
    Unreadable { path: String, source: Arc<std::io::Error> },
    /// The socket gave no peer credentials.
    #[error("no peer credentials: {0}")]
    NoCredentials(#[source] Arc<std::io::Error>),
    /// The process that connected exited before its cgroup was read: its pid may be another's.
    #[error("process {0} exited before it could be identified (its pid may be another's now)")]
    Exited(i32),
}

/// Where `/proc` is (the host's, in the agent's PID namespace).
#[derive(Debug, Clone, educe::Educe)]
#[educe(Default)]
pub(crate) struct Procfs {
    #[educe(Default(expression = PathBuf::from("/proc")))]
    root: PathBuf,
}

impl Procfs {
    /// A procfs mounted at `root` (a fake tree in the tests).
    #[cfg(test)]
    pub(crate) fn at(root: &std::path::Path) -> Procfs {
        Procfs { root: root.to_path_buf() }
    }

    /// `/proc/<pid>/cgroup`, as this PID and cgroup namespace see it.
    pub(crate) fn cgroup_of_pid(&self, pid: i32) -> Result<String, CgroupUnknown> {
        if pid <= 0 {
            return Err(CgroupUnknown::Invisible(pid));
        }
        let path = self.root.join(pid.to_string()).join("cgroup");
        std::fs::read_to_string(&path).map_err(|e| CgroupUnknown::Unreadable {
            path: path.display().to_string(),
            source: Arc::new(e),
        })
    }
}
