//! The GPU state file on disk (`gpu.state_file`): read once when the monitor starts, written
//! atomically (a temporary file in the same directory, synced, then renamed over it) when the
//! failed GPUs change. What the content means is decided by `crate::accel::gpu::policy_state`.
//!
//! The node's boot id comes from `/proc/sys/kernel/random/boot_id`, which the kernel does not
//! namespace: a container reads the host's. Both paths are injectable for tests.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::accel::gpu::policy_state::{restore, Restored, StateFile};

/// Where the kernel tells the boot id (a fresh random UUID at every boot).
pub(crate) const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The state file and the boot it belongs to.
#[derive(Debug, Clone)]
pub struct StateStore {
    path: PathBuf,
    /// The node's boot id now (empty when it could not be read).
    pub(crate) boot_id: String,
}

impl StateStore {
    /// `path` for the state, the boot id read from `boot_id_path`. A boot id that cannot be read
    /// is empty: every file then reads as "another boot", so nothing is kept (and a warning says
    /// why); failures of this process are still written.
    pub fn new(path: impl Into<PathBuf>, boot_id_path: &Path) -> StateStore {
        let read = std::fs::read_to_string(boot_id_path).inspect_err(|e| {
            tracing::warn!(path = %boot_id_path.display(), error = %e,
                "cannot read the node's boot id: failed GPUs from before this start are not kept")
        });
        let boot_id = read.map_or(String::new(), |s| s.trim().to_string());
        StateStore { path: path.into(), boot_id }
    }

    /// The store of `gpu.state_file` (`None` when it is empty), the boot id read from
    /// `boot_id_path` ([`BOOT_ID_PATH`] in production).
    pub(crate) fn from_config(state_file: &str, boot_id_path: &Path) -> Option<StateStore> {
        (!state_file.is_empty()).then(|| StateStore::new(state_file, boot_id_path))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// What the file holds for this boot; a problem with it is a warning in the result, never
    /// an error.
    pub(crate) fn load(&self) -> Restored {
        let read = std::fs::read_to_string(&self.path);
        restore(read, &self.boot_id, &self.path.display().to_string())
    }

    /// Replace the file with `state`, atomically: a reader (or a crash) sees the old content or
    /// the new, never half of it. Creates the directory when it is missing.
    pub(crate) fn write(&self, state: &StateFile) -> std::io::Result<()> {
        let dir =
            self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let name = self.path.file_name().map_or("gpu-state.json".into(), |n| n.to_string_lossy());
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let text = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accel::gpu::policy_state::VERSION;

    #[test]
    fn writes_atomically_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("boot_id");
        std::fs::write(&boot, "abc-123\n").unwrap();
        let store = StateStore::new(dir.path().join("sub/gpu-state.json"), &boot);
        assert_eq!(store.boot_id, "abc-123");
        assert!(store.load().warning.is_none(), "no file yet: a clean start");
        let (boot_id, gpus, announced) = ("abc-123".into(), vec![], Some("failed".into()));
        let state = StateFile { version: VERSION, boot_id, gpus, announced };
        store.write(&state).unwrap();
        let text = std::fs::read_to_string(store.path()).unwrap();
        assert_eq!(serde_json::from_str::<StateFile>(&text).unwrap(), state);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn an_unreadable_boot_id_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("s.json"), &dir.path().join("nope"));
        assert_eq!(store.boot_id, "");
    }
}
