//! Who is on the other end of the worker API's unix socket: the peer's process (the kernel's
//! `SO_PEERCRED`, which a client cannot forge) and the container that process runs in, read from
//! its cgroup. Every runtime names a container's cgroup after its id: Docker (`/docker/<id>`,
//! `docker-<id>.scope`), Podman (`libpod-<id>.scope`), containerd (`cri-containerd-<id>.scope`,
//! `/kubepods/…/pod<uid>/<id>`) and CRI-O (`crio-<id>.scope`).
//!
//! The agent must see the peer's pid: on a plain host it does; in a container it needs the host's
//! PID namespace (`hostPID`), or the kernel reports pid 0 and every write is refused.

use std::path::{Path, PathBuf};

/// The container id in a `/proc/<pid>/cgroup` text, or `None` for a process in no container.
pub fn container_of(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        // `hierarchy-id:controllers:path`; the path may itself hold `:` in odd setups.
        let path = line.splitn(3, ':').nth(2)?;
        path.rsplit('/').find_map(container_id_in)
    })
}

/// A 64-hex run in one path component, not that of a runtime's helper (`libpod-conmon-<id>`).
fn container_id_in(component: &str) -> Option<String> {
    if component.contains("conmon") {
        return None;
    }
    let bytes = component.as_bytes();
    let mut start = None;
    for (i, b) in bytes
        .iter()
        .enumerate()
        .chain(std::iter::once((bytes.len(), &b'/')))
    {
        let hex = b.is_ascii_digit() || (b'a'..=b'f').contains(b);
        match (hex, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                if i - s == 64 {
                    return Some(component[s..i].to_string());
                }
                start = None;
            }
            _ => {}
        }
    }
    None
}

/// Where `/proc` is (the host's, in the agent's PID namespace).
#[derive(Debug, Clone)]
pub struct Procfs {
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
    pub fn at(root: &Path) -> Procfs {
        Procfs {
            root: root.to_path_buf(),
        }
    }

    /// The container `pid` runs in: `Ok(None)` when it runs in none, `Err` when its cgroup
    /// cannot be read (the process is gone, or not visible from this PID namespace).
    pub fn container_of_pid(&self, pid: i32) -> Result<Option<String>, String> {
        if pid <= 0 {
            return Err(format!(
                "the peer's pid is {pid}: it is not visible from the agent's PID namespace (run the agent with hostPID)"
            ));
        }
        let path = self.root.join(pid.to_string()).join("cgroup");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(container_of(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::{container_of, Procfs};

    const ID: &str = "6ed37ba8ec9fec0ce7670fc23a565b1560810e0ca46f53ce7af946197185cf5f";

    #[test]
    fn every_runtime_s_cgroup_names_the_container() {
        let cases = [
            format!("9:name=systemd:/docker/{ID}\n8:pids:/docker/{ID}\n"),
            format!("0::/system.slice/docker-{ID}.scope\n"),
            format!("0::/machine.slice/libpod-{ID}.scope/container\n"),
            format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice/cri-containerd-{ID}.scope\n"),
            format!("0::/kubepods/besteffort/pod9f1c2d3e-0000-4000-8000-000000000001/{ID}\n"),
            format!("0::/kubepods.slice/crio-{ID}.scope\n"),
        ];
        for text in cases {
            assert_eq!(container_of(&text).as_deref(), Some(ID), "{text}");
        }
    }

    #[test]
    fn host_processes_and_runtime_helpers_are_in_no_container() {
        for text in [
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/\n",
            "12:memory:/system.slice/sshd.service\n",
            &format!("0::/machine.slice/libpod-conmon-{ID}.scope\n"),
            // 63 and 65 hex digits are not an id.
            &format!("0::/docker/{}\n", &ID[..63]),
            &format!("0::/docker/{ID}a\n"),
            "",
        ] {
            assert_eq!(container_of(text), None, "{text}");
        }
    }

    #[test]
    fn a_pid_is_read_from_proc_and_an_invisible_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("42")).unwrap();
        std::fs::write(dir.path().join("42/cgroup"), format!("0::/docker/{ID}\n")).unwrap();
        let proc = Procfs::at(dir.path());
        assert_eq!(proc.container_of_pid(42).unwrap().as_deref(), Some(ID));
        assert!(proc.container_of_pid(43).is_err());
        assert!(proc.container_of_pid(0).unwrap_err().contains("hostPID"));
        // This test process is in whatever cgroup the machine gives it; reading works.
        assert!(Procfs::default()
            .container_of_pid(std::process::id() as i32)
            .is_ok());
    }
}
