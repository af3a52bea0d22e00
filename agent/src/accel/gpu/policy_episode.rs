//! XID episodes (pure): events of one XID on one GPU less than `gpu.xid_threshold.window` apart
//! are one [`XidEpisode`]. The monitor logs an episode when it begins and when it ends, the node
//! controller turns each begun episode into one Event, and an XID NVIDIA's table does not list
//! degrades its GPU only while an episode of it has reached `gpu.xid_threshold.count` events
//! within the window. A GPU that repeats one error a million times is one line, not a million.

use crate::accel::gpu::model::{label, EpisodeBegun, GpuReport, GpuStatus, XidEpisode};
use crate::accel::gpu::policy_xid::{action_for, builtin, XidOverrides};
use crate::clock::ms;
use crate::config::XidThreshold;

/// Add one event of `xid` at `now` to `g`'s episodes. `Some` with the new episode when the event
/// begins one (its number taken from `seq`); an episode of the same XID whose window has passed
/// is replaced (it ended).
pub(crate) fn add(
    g: &mut GpuStatus,
    xid: u64,
    now: i64,
    th: &XidThreshold,
    seq: &mut u64,
) -> Option<XidEpisode> {
    let window = ms(th.window);
    let keep = th.count.max(1) as usize;
    if let Some(e) = g.episodes.iter_mut().find(|e| e.xid == xid && now - e.last_ms <= window) {
        e.count = e.count.saturating_add(1);
        e.last_ms = e.last_ms.max(now);
        e.recent.push(now);
        e.recent.drain(..e.recent.len().saturating_sub(keep));
        e.counted |= e.recent.len() >= keep && now - e.recent[0] <= window;
        return None;
    }
    g.episodes.retain(|e| e.xid != xid);
    *seq += 1;
    let (first_ms, last_ms, recent, counted) = (now, now, vec![now], keep == 1);
    let e = XidEpisode { seq: *seq, xid, first_ms, last_ms, count: 1, recent, counted };
    g.episodes.push(e.clone());
    Some(e)
}

/// Close `g`'s episodes quiet for longer than the window.
pub(crate) fn expire(g: &mut GpuStatus, now: i64, th: &XidThreshold) {
    g.episodes.retain(|e| now - e.last_ms <= ms(th.window));
}

/// The line of an episode that began on `g`: the XID, what it means, what to do.
pub(crate) fn begun(g: &GpuStatus, e: &XidEpisode, overrides: &XidOverrides) -> EpisodeBegun {
    let gpu = label(g.index, &g.uuid);
    let action = action_for(e.xid, overrides);
    let meaning = builtin(e.xid).map_or(String::new(), |r| format!(" ({})", r.meaning));
    let todo = action.map_or("not in NVIDIA's table", |a| a.advice());
    let detail = format!("XID {}{meaning} on {gpu}: {todo}", e.xid);
    EpisodeBegun { seq: e.seq, gpu, xid: e.xid, action, detail }
}

/// The episodes open in `prev` and no longer in `next`, with their GPU's label: for the
/// monitor's one line per episode that ended.
pub(crate) fn ended(prev: &GpuReport, next: &GpuReport) -> Vec<(String, XidEpisode)> {
    let open = |seq: u64| next.gpus.iter().any(|g| g.episodes.iter().any(|e| e.seq == seq));
    prev.gpus
        .iter()
        .flat_map(|g| g.episodes.iter().map(move |e| (g, e)))
        .filter(|(_, e)| !open(e.seq))
        .map(|(g, e)| (label(g.index, &g.uuid), e.clone()))
        .collect()
}

/// The episodes begun in `report` after the one numbered `seen`, oldest first; `seen` moves to
/// the newest. A reader that misses reports (a `watch` keeps only the latest) still sees each.
pub(crate) fn new_begun(report: &GpuReport, seen: &mut u64) -> Vec<EpisodeBegun> {
    if report.episode_seq < *seen {
        // A new monitor numbers from zero again.
        *seen = 0;
    }
    let new = report.begun.iter().filter(|b| b.seq > *seen).cloned().collect();
    *seen = (*seen).max(report.episode_seq);
    new
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::XidAction;
    use std::time::Duration;

    fn th(count: u32, window_s: u64) -> XidThreshold {
        XidThreshold { count, window: Duration::from_secs(window_s) }
    }

    #[test]
    fn a_storm_is_one_episode_until_the_window_passes_quietly() {
        let t = th(1, 600);
        let mut g = GpuStatus::default();
        let mut seq = 0;
        let mut begun = 0;
        for i in 0..100_000i64 {
            begun += usize::from(add(&mut g, 95, i * 5, &t, &mut seq).is_some());
        }
        assert_eq!((begun, seq), (1, 1));
        assert_eq!(g.episodes[0].count, 100_000);
        assert_eq!(g.episodes[0].recent.len(), 1, "memory bounded by the count");
        let last = g.episodes[0].last_ms;
        expire(&mut g, last + 600_000, &t);
        assert_eq!(g.episodes.len(), 1, "the boundary is still the episode");
        expire(&mut g, last + 600_001, &t);
        assert!(g.episodes.is_empty());
        assert!(add(&mut g, 95, last + 600_002, &t, &mut seq).is_some());
        assert_eq!(seq, 2, "a new episode after a quiet window");
    }

    #[test]
    fn an_episode_counts_once_count_events_fall_within_the_window() {
        // (event times in s, counted after each)
        let t = th(3, 60);
        for (times, want) in [
            (&[0, 10, 20][..], [false, false, true]),
            (&[0, 50, 100], [false, false, false]),
            (&[0, 59, 60], [false, false, true]),
        ] {
            let mut g = GpuStatus::default();
            let mut seq = 0;
            for (at, w) in times.iter().zip(want) {
                add(&mut g, 999, at * 1000, &t, &mut seq);
                assert_eq!(g.episodes[0].counted, w, "{times:?} at {at}");
            }
            assert_eq!(g.episodes.len(), 1, "one episode: gaps within the window");
        }
        // Once counted, the episode stays counted while it lasts.
        let mut g = GpuStatus::default();
        let mut seq = 0;
        for at in [0, 1, 2, 50, 100, 150] {
            add(&mut g, 999, at * 1000, &t, &mut seq);
        }
        assert!(g.episodes[0].counted);
    }

    #[test]
    fn each_xid_and_each_gpu_has_its_own_episode() {
        let t = th(1, 60);
        let mut a = GpuStatus::default();
        let mut seq = 0;
        assert!(add(&mut a, 13, 0, &t, &mut seq).is_some());
        assert!(add(&mut a, 95, 0, &t, &mut seq).is_some());
        assert!(add(&mut a, 13, 1, &t, &mut seq).is_none());
        let mut b = GpuStatus { index: 1, ..GpuStatus::default() };
        assert!(add(&mut b, 13, 1, &t, &mut seq).is_some());
        assert_eq!(seq, 3);
    }

    #[test]
    fn the_begun_line_says_what_the_xid_is_and_what_to_do() {
        let g = GpuStatus { index: 0, uuid: "GPU-a".into(), ..GpuStatus::default() };
        let e = |xid| XidEpisode { seq: 7, xid, ..XidEpisode::default() };
        let none = XidOverrides::new();
        let b = begun(&g, &e(95), &none);
        assert_eq!(
            b.detail,
            "XID 95 (uncontained ECC error) on GPU 0 (GPU-a): reset the GPU (nvidia-smi -r) or reboot the node"
        );
        assert_eq!((b.seq, b.action), (7, Some(XidAction::ResetGpu)));
        assert_eq!(
            begun(&g, &e(999), &none).detail,
            "XID 999 on GPU 0 (GPU-a): not in NVIDIA's table"
        );
    }

    #[test]
    fn readers_see_each_begun_episode_once_and_ended_ones_are_found() {
        let t = th(1, 60);
        let mut g = GpuStatus::default();
        let mut seq = 0;
        let e = add(&mut g, 13, 0, &t, &mut seq).unwrap();
        let none = XidOverrides::new();
        let open = GpuReport {
            begun: vec![begun(&g, &e, &none)],
            episode_seq: seq,
            gpus: vec![g.clone()],
            ..GpuReport::default()
        };
        let mut seen = 0;
        assert_eq!(new_begun(&open, &mut seen).len(), 1);
        assert!(new_begun(&open, &mut seen).is_empty());
        let mut closed = open.clone();
        expire(&mut closed.gpus[0], 60_001, &t);
        let gone = ended(&open, &closed);
        assert_eq!(gone.len(), 1);
        assert_eq!((gone[0].0.as_str(), gone[0].1.xid), ("GPU 0", 13));
        assert!(ended(&open, &open).is_empty());
    }
}
