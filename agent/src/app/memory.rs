//! The agent's resident memory after start-up: the binary's start-up code let go once it has
//! run (see `docs/development.md`, "Memory").

use std::time::Duration;

/// How long after start the start-up code's pages are let go: the adapters are connected and the
/// first cycles have run by then.
const START_UP: Duration = Duration::from_secs(20);

/// NB: the binary is about 20 MiB of code, and the kernel brings it in in large pieces (read-ahead,
/// large page-cache folios, mapping around each page run), so after start-up most of the agent's
/// resident memory was code it ran once (config parsing, the clients' set-up) or never.
/// `MADV_RANDOM` then `MADV_PAGEOUT` on the binary's own mappings, once start-up is over: those
/// pages go, and from then on a page comes in when it runs, one at a time. Best-effort: where
/// /proc cannot be read or the kernel refuses the advice, nothing changes.
pub(super) async fn release_start_up_code(stop: tokio_util::sync::CancellationToken) {
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(START_UP) => code_pages_on_demand(),
    }
}

#[cfg(target_os = "linux")]
fn code_pages_on_demand() {
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else { return };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return };
    let hex = |s: &str| usize::from_str_radix(s, 16).ok();
    for line in maps.lines() {
        // `start-end perms offset dev inode path`
        let mut fields = line.splitn(6, ' ');
        let Some(range) = fields.next() else { continue };
        let Some(perms) = fields.next() else { continue };
        let Some(path) = fields.nth(3) else { continue };
        // Only the read-only mappings: a written page (relocated data) would be swapped, not let go.
        if perms.contains('w') || std::path::Path::new(path.trim_start()) != exe {
            continue;
        }
        let parsed = range.split_once('-').and_then(|(a, b)| hex(a).zip(hex(b)));
        let Some((start, end)) = parsed else { continue };
        let addr = start as *mut libc::c_void;
        // SAFETY: advice on the process's own page-aligned, read-only file mapping as /proc lists
        // it: it changes which pages are resident and how they are read in, never their contents.
        unsafe {
            libc::madvise(addr, end - start, libc::MADV_RANDOM);
            libc::madvise(addr, end - start, libc::MADV_PAGEOUT);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn code_pages_on_demand() {}
