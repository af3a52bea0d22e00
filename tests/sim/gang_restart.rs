//! A member's restart in the gang simulation may be slow (`super::gang`): the runtime takes a
//! second or more, and meanwhile the member's old incarnation, not stopped yet, gets through one
//! more step and beats. That beat is past where the gang stopped, yet no restart helped: the
//! gang's run of fruitless restarts must not end on it (the member's line, `Keys::gang_line`; the
//! mutant `LineUnseen` hides it). NB: the shared clock moves 1–3 s (not the tens of seconds a
//! slow runtime may take): the world pauses meanwhile, and a long pause would blur the harness's
//! own timing checks (a gang's restart persists; learned rhythms and paces see the pause).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use vigil::clock::{Clock, FakeClock};
use vigil::coord::{heartbeat_value, Coordinator};
use vigil::runtime::sim::FakeRuntime;

use super::rng::Rng;

/// One restart in this many (per mille) of a gang member is slow, with a late beat.
const SLOW_PER_MILLE: u64 = 250;

/// Make `container`'s restarts on `runtime` slow now and then, from a random `stream` of their own
/// (the world's other draws stay as they were): 1–3 s pass, and `record` (the member's status)
/// beats one step past its last. `late` counts those beats.
pub(super) fn slow_now_and_then(
    stream: u64,
    runtime: &FakeRuntime,
    container: String,
    record: String,
    store: Arc<dyn Coordinator>,
    clock: FakeClock,
    late: Arc<AtomicU64>,
) {
    let rng = Mutex::new(Rng::new(stream ^ 0x510e_7e57));
    runtime.on_restart(move |id| {
        if id != container {
            return;
        }
        let d = {
            let mut r = rng.lock().unwrap();
            if !r.chance(SLOW_PER_MILLE) {
                return;
            }
            r.range(1_000, 3_000)
        };
        clock.advance(Duration::from_millis(d));
        let Some(Ok(fields)) = store.hgetall(&record).now_or_never() else {
            return;
        };
        let Some(step) = fields
            .get("progress")
            .and_then(|p| p.strip_prefix("step-"))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return;
        };
        let mut beat: Vec<(String, String)> = fields.into_iter().collect();
        beat.sort();
        for (k, v) in beat.iter_mut() {
            match k.as_str() {
                "state" => *v = "processing".into(),
                "heartbeat" => *v = heartbeat_value(clock.now()),
                "progress" => *v = format!("step-{}", step + 1),
                _ => {}
            }
        }
        let wrote = store.hset(&record, &beat, None).now_or_never();
        assert!(matches!(wrote, Some(Ok(_))), "the in-process store writes");
        late.fetch_add(1, Ordering::Relaxed);
    });
}
