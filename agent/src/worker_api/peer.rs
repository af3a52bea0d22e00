//! Who is on the other end of the worker API's unix socket: the peer's process (the kernel's
//! `SO_PEERCRED` and, where the kernel has it, `SO_PEERPIDFD`, which a client cannot forge) and
//! the container that process runs in, read from its cgroup. Every runtime names a container's
//! cgroup after its id: Docker (`/docker/<id>`, `docker-<id>.scope`), Podman
//! (`libpod-<id>.scope`), containerd (`cri-containerd-<id>.scope`, `/kubepods/…/pod<uid>/<id>`)
//! and CRI-O (`crio-<id>.scope`).
//!
//! NB: a name is only a claim. A node user can start a scope called `docker-<victim>.scope` under
//! their own slice, and a container with a writable cgroupfs can make a child cgroup named after
//! another container: the id in the path is then the victim's. The proof is [`within`]: the peer's
//! cgroup must be the cgroup of the runtime's own init process for that container, or below it,
//! in every hierarchy — and only root on the node can move a process there.
//!
//! The agent must see the peer's pid: on a plain host it does; in a container it needs the host's
//! PID namespace (`hostPID`), or the kernel reports pid 0 and every write is refused.

/// The container id in a `/proc/<pid>/cgroup` text, or `None` for a process in no container.
/// A claim, to be proven by [`within`].
pub(crate) fn container_of(cgroup: &str) -> Option<String> {
    hierarchies(cgroup).find_map(|(_, path)| path.rsplit('/').find_map(container_id_in))
}

/// The hierarchies of a `/proc/<pid>/cgroup` text: (`id:controllers`, path). Each line is
/// `hierarchy-id:controllers:path`; the path may itself hold `:` in odd setups.
fn hierarchies(cgroup: &str) -> impl Iterator<Item = (&str, &str)> {
    cgroup.lines().filter_map(|line| {
        let (id, rest) = line.split_once(':')?;
        let (controllers, path) = rest.split_once(':')?;
        Some((&line[..id.len() + 1 + controllers.len()], path))
    })
}

/// Is a process whose cgroups are `peer` inside the container `id`, whose runtime-started init
/// process has the cgroups `init`? Yes when, in every hierarchy `init` lists, the peer sits at
/// the init's path or below it, and the init's cgroups name that container at all (an init in
/// no container's cgroup proves nothing).
pub(crate) fn within(peer: &str, init: &str, id: &str) -> bool {
    let mut named = false;
    for (hierarchy, path) in hierarchies(init) {
        named |= path.rsplit('/').any(|c| container_id_in(c).is_some_and(|c| c == id));
        let Some((_, theirs)) = hierarchies(peer).find(|(h, _)| *h == hierarchy) else {
            return false;
        };
        let below = theirs == path
            || path == "/"
            || theirs.strip_prefix(path).is_some_and(|rest| rest.starts_with('/'));
        if !below {
            return false;
        }
    }
    named
}

/// A 64-hex run in one path component, not that of a runtime's helper (`libpod-conmon-<id>`).
fn container_id_in(component: &str) -> Option<String> {
    if component.contains("conmon") {
        return None;
    }
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    component.split(|c: char| !hex(c)).find(|run| run.len() == 64).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::{container_of, within};
    use crate::http::procfs::Procfs;

    /// The container `pid` runs in, by the name of its cgroup: `Ok(None)` when it runs in
    /// none, `Err` when its cgroup cannot be read (the process is gone, or not visible from
    /// this PID namespace).
    fn container_of_pid(
        proc: &Procfs,
        pid: i32,
    ) -> Result<Option<String>, crate::http::procfs::CgroupUnknown> {
        Ok(container_of(&proc.cgroup_of_pid(pid)?))
    }

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

    /// Issue 26: the name is a claim; the init process's cgroups are the proof.
    #[test]
    fn only_the_container_s_own_cgroup_or_below_it_is_the_container() {
        let other = "7".repeat(64);
        let v2 = |path: &str| format!("0::{path}\n");
        let v1 =
            |path: &str| format!("9:name=systemd:{path}\n8:pids:{path}\n4:memory:{path}\n0::/\n");
        let init_v2 = v2(&format!("/system.slice/docker-{ID}.scope"));
        let init_v1 = v1(&format!("/docker/{ID}"));
        let cases: &[(String, &String, bool, &str)] = &[
            (init_v2.clone(), &init_v2, true, "the container's own cgroup"),
            (v2(&format!("/system.slice/docker-{ID}.scope/sub")), &init_v2, true, "a child of it"),
            (
                v2(&format!("/user.slice/user-1000.slice/docker-{ID}.scope")),
                &init_v2,
                false,
                "a user's scope named like it",
            ),
            (
                v2(&format!("/system.slice/docker-{other}.scope/{ID}")),
                &init_v2,
                false,
                "a child cgroup of another container named after it",
            ),
            (
                v2(&format!("/system.slice/docker-{ID}.scopex")),
                &init_v2,
                false,
                "a sibling whose name starts the same",
            ),
            (v2("/"), &init_v2, false, "the root"),
            (init_v1.clone(), &init_v1, true, "v1: every hierarchy the container's"),
            (
                format!(
                    "9:name=systemd:/user.slice/docker-{ID}.scope\n8:pids:/\n4:memory:/\n0::/\n"
                ),
                &init_v1,
                false,
                "v1: one hierarchy named like it",
            ),
            (
                format!("9:name=systemd:/docker/{ID}\n8:pids:/docker/{ID}\n0::/\n"),
                &init_v1,
                false,
                "v1: a hierarchy missing",
            ),
        ];
        for (peer, init, expected, what) in cases {
            assert_eq!(within(peer, init, ID), *expected, "{what}: {peer}");
        }
        // An init whose cgroups name no container (a wrong pid, the host's init) proves nothing.
        assert!(!within(&v2("/"), &v2("/"), ID));
        assert!(!within(&init_v2, &init_v2, &other));
    }

    #[test]
    fn a_pid_is_read_from_proc_and_an_invisible_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("42")).unwrap();
        std::fs::write(dir.path().join("42/cgroup"), format!("0::/docker/{ID}\n")).unwrap();
        let proc = Procfs::at(dir.path());
        assert_eq!(container_of_pid(&proc, 42).unwrap().as_deref(), Some(ID));
        assert!(container_of_pid(&proc, 43).is_err());
        let invisible = container_of_pid(&proc, 0).unwrap_err();
        assert!(invisible.to_string().contains("hostPID"), "{invisible}");
        // This test process is in whatever cgroup the machine gives it; reading works.
        assert!(container_of_pid(&Procfs::default(), std::process::id() as i32).is_ok());
    }
}
