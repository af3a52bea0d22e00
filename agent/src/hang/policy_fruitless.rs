//! Restarts that do not help are not repeated (pure). After a restart Vigil watches whether the
//! worker gets past where it stopped: its `progress`, when it is a number (a step), or its
//! `checkpoint_step`. `policy.max_fruitless_restarts` restarts in a row without that stop
//! restarting it (one page says so); the next progress past that point resets the count. A
//! worker that publishes no step gets past by any beat of its new incarnation (a restarted
//! worker that never beats again is still caught).

use crate::clock::{rfc3339, Millis};
use crate::hang::model::{Fruitless, Marks, WorkerState, WorkerStatus};

/// How far a worker has got: the larger of its numeric progress and its checkpoint step.
pub(crate) fn position(status: Option<&WorkerStatus>) -> Option<u64> {
    let s = status?;
    let progress = s.progress.as_deref().and_then(step_of);
    progress.max(s.checkpoint_step)
}

/// A progress marker as a step: a whole number (`41200`), or `step` and one (`step-41200`,
/// `step 41200`, `Step=41200`). Nothing else is read as a step: `epoch3-batch10`, `v2` or a
/// counter of beats (`beat-7`, the Python client's default) say nothing of where a restart
/// resumes.
fn step_of(marker: &str) -> Option<u64> {
    let m = marker.trim();
    let digits = match m.get(..4) {
        Some(word) if word.eq_ignore_ascii_case("step") => {
            m[4..].trim_start_matches([' ', '-', '_', ':', '='])
        }
        _ => m,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether the worker got past where it stopped since the run of fruitless restarts began: in
/// a beat of the new incarnation (newer than `last`, not in error), further than `past` — or,
/// without a step to compare (`past` unknown), any such beat: a restart that brought it back
/// helped, and only restarts after which it never beat again count.
pub(crate) fn progressed(f: &Fruitless, status: Option<&WorkerStatus>) -> bool {
    let Some(s) = status else {
        return false;
    };
    let fresh = s.heartbeat.is_some_and(|hb| hb > f.last) && s.state != WorkerState::Error;
    match f.past {
        Some(past) => fresh && position(status).is_some_and(|p| p > past),
        None => fresh,
    }
}

/// Whether the run of fruitless restarts forbids another (`max` 0: never).
pub(crate) fn blocks(marks: &Marks, status: Option<&WorkerStatus>, max: u32) -> bool {
    max > 0
        && marks
            .fruitless
            .as_ref()
            .is_some_and(|f| f.count >= max && !progressed(f, status))
}

/// The run after one more restart at `now` of a worker whose record says `status` (a run that
/// progressed starts over).
pub(crate) fn after_restart(
    marks: &Marks,
    status: Option<&WorkerStatus>,
    now: Millis,
) -> Fruitless {
    let here = position(status);
    match marks.fruitless.as_ref().filter(|f| !progressed(f, status)) {
        Some(f) => Fruitless {
            count: f.count + 1,
            since: f.since,
            last: now,
            past: f.past.max(here),
        },
        None => Fruitless {
            count: 1,
            since: now,
            last: now,
            past: here,
        },
    }
}

/// `restarts are not helping: 2 restarts, no progress past step 41200 since 2026-…`.
pub(crate) fn describe(f: &Fruitless) -> String {
    let past = match f.past {
        Some(p) => format!("no progress past step {p}"),
        None => "no progress".to_string(),
    };
    format!(
        "restarts are not helping: {} restart(s), {past} since {}; not restarting it until it gets past that (or its fruitless mark is removed)",
        f.count,
        rfc3339(f.since)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hang::model::WorkerState;

    fn status(progress: &str, checkpoint_step: Option<u64>) -> WorkerStatus {
        WorkerStatus {
            state: WorkerState::Processing,
            heartbeat: Some(10_000),
            job: None,
            progress: Some(progress.into()),
            grace: None,
            alert_only: false,
            rank: None,
            gang: None,
            checkpoint_step,
        }
    }

    fn marks(f: Option<Fruitless>, progress_since: Millis) -> Marks {
        Marks {
            fruitless: f,
            progress: Some(("x".into(), progress_since)),
            ..Marks::default()
        }
    }

    #[test]
    fn positions_are_steps_from_progress_or_the_checkpoint() {
        assert_eq!(position(Some(&status("41200", None))), Some(41_200));
        assert_eq!(position(Some(&status("step-41200", None))), Some(41_200));
        assert_eq!(position(Some(&status("Step 5", None))), Some(5));
        assert_eq!(position(Some(&status("step-7", Some(9)))), Some(9));
        for no_step in [
            "warmup",
            "epoch3-batch10",
            "v2",
            "beat-7",
            "5/10",
            "loss=0.25",
            "-5",
            "",
        ] {
            assert_eq!(position(Some(&status(no_step, None))), None, "{no_step}");
        }
        assert_eq!(position(None), None);
    }

    #[test]
    fn two_restarts_without_progress_past_the_stop_block_the_third() {
        let hung = status("step-41200", None);
        let first = after_restart(&marks(None, 0), Some(&hung), 1_000);
        assert_eq!((first.count, first.past), (1, Some(41_200)));
        // Resumed from the checkpoint at 41000 and stopped at 41200 again.
        let again = status("step-41200", None);
        let m = marks(Some(first), 2_000);
        assert!(!blocks(&m, Some(&again), 2));
        let second = after_restart(&m, Some(&again), 3_000);
        assert_eq!((second.count, second.since), (2, 1_000));
        let m = marks(Some(second.clone()), 4_000);
        assert!(blocks(&m, Some(&again), 2), "the third restart is refused");
        assert!(!blocks(&m, Some(&again), 0), "0: no limit");
        assert!(!blocks(&m, Some(&again), 3));
        // One step past where it stopped: the run is over.
        assert!(!blocks(&m, Some(&status("step-41201", None)), 2));
        let fresh = after_restart(&m, Some(&status("step-41201", None)), 5_000);
        assert_eq!(
            (fresh.count, fresh.since, fresh.past),
            (1, 5_000, Some(41_201))
        );
        // The old incarnation's last record (written before the restart) is no progress.
        let mut old = status("step-41201", None);
        old.heartbeat = Some(2_500);
        assert!(blocks(&m, Some(&old), 2));
        assert!(describe(&second).starts_with(
            "restarts are not helping: 2 restart(s), no progress past step 41200 since"
        ));
    }

    #[test]
    fn without_a_step_any_beat_of_the_new_incarnation_is_progress() {
        let f = Fruitless {
            count: 2,
            since: 1_000,
            last: 3_000,
            past: None,
        };
        let mut warm = status("warmup", None);
        warm.heartbeat = Some(2_500);
        assert!(
            blocks(&marks(Some(f.clone()), 0), Some(&warm), 2),
            "no beat since"
        );
        warm.heartbeat = Some(3_500);
        assert!(
            !blocks(&marks(Some(f.clone()), 0), Some(&warm), 2),
            "it came back"
        );
        warm.state = WorkerState::Error;
        assert!(
            blocks(&marks(Some(f.clone()), 0), Some(&warm), 2),
            "in error is no progress"
        );
        assert_eq!(Fruitless::decode(&f.encode()), Some(f));
        assert_eq!(Fruitless::decode("2:1:3:41200").unwrap().past, Some(41_200));
        assert_eq!(Fruitless::decode("junk"), None);
    }
}
