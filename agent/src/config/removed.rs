//! Keys of the pre-release versions, removed before 1.0 (docs/upgrading.md): a file that still
//! sets one is refused, and the error says where it went.

/// Keys of the pre-release versions, removed before 1.0, and where each went: a file that still
/// sets one is refused with this pointer rather than serde's bare "unknown field".
const REMOVED: &[(&str, &str)] = &[
    ("docker.worker_label", "runtime.worker_label"),
    ("docker.log_lines", "runtime.log_lines"),
    ("docker.log_timeout", "runtime.log_timeout"),
    ("docker.stop_grace", "runtime.stop_grace"),
    ("docker.restart_timeout", "runtime.restart_timeout"),
    ("gpu.hardware_xids", "gpu.xid_actions, each XID as \"<xid>\" = \"reset-gpu\" (or drop it to follow NVIDIA's table: vigil policy gpu)"),
    ("gpu.application_xids", "gpu.xid_actions, each XID as \"<xid>\" = \"restart-app\" (or drop it to follow NVIDIA's table: vigil policy gpu)"),
];

/// `problem` (a parse error) with the pointer of [`REMOVED`] when it is about one of those keys.
pub(super) fn hint(problem: String) -> String {
    for (key, now) in REMOVED {
        let (section, field) = key.split_once('.').unwrap_or(("", key));
        if problem.contains(&format!("`{section}"))
            && problem.contains(&format!("unknown field `{field}`"))
        {
            return format!("{problem} ({key} was removed: use {now}; docs/upgrading.md)");
        }
    }
    problem
}
