//! Restarts that do not help are not repeated (pure). After a restart Vigil watches whether the
//! worker gets past where it stopped: its `progress`, when it is a number (a step), or its
//! `checkpoint_step`. `policy.max_fruitless_restarts` restarts in a row without that stop
//! restarting it (one page says so); the next progress past that point resets the count. A
//! worker that publishes no step gets past by any beat of its new incarnation (a restarted
//! worker that never beats again is still caught). A record naming another `job` than the run's
//! is a new job under the same worker id: the run is not its.

use crate::clock::{rfc3339, Millis};
use crate::hang::model::{Fruitless, WorkerState, WorkerStatus};
use crate::hang::model_gang::{Activity, Member};

/// How far a worker has got: the larger of its numeric progress and its checkpoint step.
pub(crate) fn position(status: Option<&WorkerStatus>) -> Option<u64> {
    let s = status?;
    s.progress.as_deref().and_then(step_of).max(s.checkpoint_step)
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
    // NB: digits only (`parse` alone would take `+5`); none at all parses to nothing.
    digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse().ok()).flatten()
}

/// One beat a run of restarts is judged by: a worker's record, or one member's entry in its
/// gang's view. A worker's run and a gang's are one rule set over their beats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Beat {
    /// When it beat (the coordinator's clock).
    pub(crate) at: Option<Millis>,
    /// Its own line, past the run's: a gang member's beats up to its own restart's line may be
    /// its old incarnation's (`Member::line`). A worker's run holds its line itself.
    pub(crate) after: Option<Millis>,
    /// How far it had got then ([`position`]).
    pub(crate) step: Option<u64>,
    /// It reported `error`.
    pub(crate) in_error: bool,
    /// A beat in `error` past the step may show progress: a gang member's may (a collective
    /// that trained on and then failed as a whole, as an NCCL watchdog fails every rank, was
    /// helped by its restart); a worker's never does — its old incarnation may still beat in
    /// error past the step between the claim and a slow command, and such a beat ended the run
    /// and let one restart too many through (the simulation's seed 179499).
    pub(crate) error_counts: bool,
}

impl Beat {
    /// A worker's record as a beat (none without a record).
    pub(crate) fn of_worker(status: Option<&WorkerStatus>) -> Option<Beat> {
        let s = status?;
        let (step, in_error) = (position(Some(s)), s.state == WorkerState::Error);
        Some(Beat { at: s.heartbeat, after: None, step, in_error, error_counts: false })
    }

    /// A member's entry as a beat.
    pub(crate) fn of_member(m: &Member) -> Beat {
        let in_error = m.activity == Activity::Error;
        Beat { at: m.heartbeat, after: m.line, step: m.step, in_error, error_counts: true }
    }

    /// Every member's entry as a beat.
    pub(crate) fn of_members(members: &[Member]) -> Vec<Beat> {
        members.iter().map(Beat::of_member).collect()
    }

    /// Whether this beat shows the unit got past where it stopped: newer than the run's last
    /// restart (and than the member's own line), not in error (but see
    /// [`Beat::error_counts`]), and further than `past` — or, without a step to compare (`past`
    /// unknown), any such beat: a restart that brought it back helped, and only restarts after
    /// which it never beat again count. Without a step, a beat in error is never a sign that it
    /// helped.
    fn gets_past(&self, f: &Fruitless) -> bool {
        let line = self.after.map_or(f.last, |a| a.max(f.last));
        let fresh = self.at.is_some_and(|hb| hb > line);
        // In error, a beat shows progress only past a known step, and only where it may.
        let error_ok = !self.in_error || (self.error_counts && f.past.is_some());
        fresh && error_ok && f.past.is_none_or(|past| self.step.is_some_and(|p| p > past))
    }
}

/// Whether the unit got past where it stopped since the run began: one beat is enough (a
/// collective moves as a whole, and a member that moves is not stopped).
pub(crate) fn progressed(f: &Fruitless, beats: &[Beat]) -> bool {
    beats.iter().any(|b| b.gets_past(f))
}

/// The run, when it forbids another restart of the unit (`max` 0: never).
pub(crate) fn refusal<'a>(
    run: Option<&'a Fruitless>,
    beats: &[Beat],
    max: u32,
) -> Option<&'a Fruitless> {
    run.filter(|f| max > 0 && f.count >= max && !progressed(f, beats))
}

/// The run after one more restart at `now` (a run that progressed starts over); where the unit
/// stopped is its furthest beat's step — a member's beats up to its own line left out: its old
/// incarnation's, in its last restart's window, say nothing of where the collective stopped.
pub(crate) fn after_restart(run: Option<&Fruitless>, beats: &[Beat], now: Millis) -> Fruitless {
    let old = |b: &&Beat| b.after.is_some_and(|a| b.at.is_none_or(|hb| hb <= a));
    let here = beats.iter().filter(|b| !old(b)).filter_map(|b| b.step).max();
    match run.filter(|f| !progressed(f, beats)) {
        Some(f) => Fruitless { count: f.count + 1, last: now, past: f.past.max(here), ..f.clone() },
        None => Fruitless { count: 1, since: now, last: now, past: here, job: None },
    }
}

/// Whether a worker's run is its record's job's: not when both name a job and the names differ
/// (a new job started from step 0 under the same worker id would be refused at once, paged as
/// the old job's). A job that names a fresh `job` at each of its attempts is never refused by
/// its run: the breaker still bounds it.
pub(crate) fn same_job(f: &Fruitless, status: Option<&WorkerStatus>) -> bool {
    match (&f.job, status.and_then(|s| s.job.as_ref())) {
        (Some(run), Some(now)) => run == now,
        _ => true,
    }
}

/// Whose run a page speaks of.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RunOf<'a> {
    Worker,
    Gang(&'a str),
}

/// `restarts are not helping: 2 restart(s), no progress past step 41200 since 2026-…` (a
/// gang's: `2 restart(s) of every member`), and what ends the refusal.
pub(crate) fn describe(f: &Fruitless, whose: RunOf<'_>) -> String {
    let past = f.past.map_or("no progress".to_string(), |p| format!("no progress past step {p}"));
    let (restarts, until) = match whose {
        RunOf::Worker => (
            "restart(s)",
            "not restarting it until it gets past that (or its fruitless mark is removed)".into(),
        ),
        RunOf::Gang(gang) => (
            "restart(s) of every member",
            format!("not restarting gang {gang} until a member gets past that (or the gang's fruitless mark is removed)"),
        ),
    };
    let (count, since) = (f.count, rfc3339(f.since));
    format!("restarts are not helping: {count} {restarts}, {past} since {since}; {until}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hang::model::{Marks, WorkerState};

    // The worker's and the gang's calls, as the engine makes them.
    fn blocks(m: &Marks, status: Option<&WorkerStatus>, max: u32) -> bool {
        refusal(m.fruitless.as_ref(), Beat::of_worker(status).as_slice(), max).is_some()
    }

    fn worker_after(m: &Marks, status: Option<&WorkerStatus>, now: Millis) -> Fruitless {
        after_restart(m.fruitless.as_ref(), Beat::of_worker(status).as_slice(), now)
    }

    fn gang_refusal<'a>(
        run: Option<&'a Fruitless>,
        m: &[Member],
        max: u32,
    ) -> Option<&'a Fruitless> {
        refusal(run, &Beat::of_members(m), max)
    }

    fn gang_after_restart(run: Option<&Fruitless>, m: &[Member], now: Millis) -> Fruitless {
        after_restart(run, &Beat::of_members(m), now)
    }

    fn gang_progressed(f: &Fruitless, m: &[Member]) -> bool {
        progressed(f, &Beat::of_members(m))
    }

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
            compute: None,
        }
    }

    fn marks(f: Option<Fruitless>, progress_since: Millis) -> Marks {
        Marks { fruitless: f, progress: Some(("x".into(), progress_since)), ..Marks::default() }
    }

    #[test]
    fn positions_are_steps_from_progress_or_the_checkpoint() {
        assert_eq!(position(Some(&status("41200", None))), Some(41_200));
        assert_eq!(position(Some(&status("step-41200", None))), Some(41_200));
        assert_eq!(position(Some(&status("Step 5", None))), Some(5));
        assert_eq!(position(Some(&status("step-7", Some(9)))), Some(9));
        for no_step in ["warmup", "epoch3-batch10", "v2", "beat-7", "5/10", "loss=0.25", "-5", ""] {
            assert_eq!(position(Some(&status(no_step, None))), None, "{no_step}");
        }
        assert_eq!(position(None), None);
    }

    #[test]
    fn two_restarts_without_progress_past_the_stop_block_the_third() {
        let hung = status("step-41200", None);
        let first = worker_after(&marks(None, 0), Some(&hung), 1_000);
        assert_eq!((first.count, first.past), (1, Some(41_200)));
        // Resumed from the checkpoint at 41000 and stopped at 41200 again.
        let again = status("step-41200", None);
        let m = marks(Some(first), 2_000);
        assert!(!blocks(&m, Some(&again), 2));
        let second = worker_after(&m, Some(&again), 3_000);
        assert_eq!((second.count, second.since), (2, 1_000));
        let m = marks(Some(second.clone()), 4_000);
        assert!(blocks(&m, Some(&again), 2), "the third restart is refused");
        assert!(!blocks(&m, Some(&again), 0), "0: no limit");
        assert!(!blocks(&m, Some(&again), 3));
        // One step past where it stopped: the run is over.
        assert!(!blocks(&m, Some(&status("step-41201", None)), 2));
        let fresh = worker_after(&m, Some(&status("step-41201", None)), 5_000);
        assert_eq!((fresh.count, fresh.since, fresh.past), (1, 5_000, Some(41_201)));
        // The old incarnation's last record (written before the restart) is no progress.
        let mut old = status("step-41201", None);
        old.heartbeat = Some(2_500);
        assert!(blocks(&m, Some(&old), 2));
        assert!(describe(&second, RunOf::Worker).starts_with(
            "restarts are not helping: 2 restart(s), no progress past step 41200 since"
        ));
    }

    #[test]
    fn without_a_step_any_beat_of_the_new_incarnation_is_progress() {
        let f = Fruitless { count: 2, since: 1_000, last: 3_000, past: None, job: None };
        let mut warm = status("warmup", None);
        warm.heartbeat = Some(2_500);
        assert!(blocks(&marks(Some(f.clone()), 0), Some(&warm), 2), "no beat since");
        warm.heartbeat = Some(3_500);
        assert!(!blocks(&marks(Some(f.clone()), 0), Some(&warm), 2), "it came back");
        warm.state = WorkerState::Error;
        assert!(blocks(&marks(Some(f.clone()), 0), Some(&warm), 2), "in error is no progress");
        assert_eq!(Fruitless::decode(&f.encode()), Some(f));
        assert_eq!(Fruitless::decode("2:1:3:41200").unwrap().past, Some(41_200));
        assert_eq!(Fruitless::decode("junk"), None);
    }
    fn member(node: &str, hb: Millis, step: Option<u64>) -> Member {
        serde_json::from_value(serde_json::json!({
            "n": node, "w": "rank", "v": "hung", "s": "w", "hb": hb, "p": step, "ok": 1, "at": hb
        }))
        .unwrap()
    }

    #[test]
    fn a_gang_run_counts_decisions_until_any_member_gets_past_the_furthest_stop() {
        // Stopped at 41200 (the furthest member), one rank behind at 41150.
        let stopped = [member("a", 900, Some(41_200)), member("b", 800, Some(41_150))];
        let first = gang_after_restart(None, &stopped, 1_000);
        assert_eq!((first.count, first.since, first.past), (1, 1_000, Some(41_200)));
        // The new incarnations resumed from 41000 and stopped at 41200 again.
        let again = [member("a", 1_900, Some(41_200)), member("b", 1_900, Some(41_180))];
        assert!(gang_refusal(Some(&first), &again, 2).is_none(), "one restart so far");
        let second = gang_after_restart(Some(&first), &again, 2_000);
        assert_eq!((second.count, second.since, second.last), (2, 1_000, 2_000));
        assert!(gang_refusal(Some(&second), &again, 2).is_some(), "the third is refused");
        assert!(gang_refusal(Some(&second), &again, 0).is_none(), "0: no limit");
        assert!(gang_refusal(None, &again, 2).is_none());
        // One member one step past, in a beat after the last decision: the run is over.
        let past = [member("a", 2_500, Some(41_201)), member("b", 2_500, Some(41_190))];
        assert!(gang_progressed(&second, &past));
        assert!(gang_refusal(Some(&second), &past, 2).is_none());
        let fresh = gang_after_restart(Some(&second), &past, 3_000);
        assert_eq!((fresh.count, fresh.since, fresh.past), (1, 3_000, Some(41_201)));
        // Past the step but in a beat before the decision (the old incarnation's): no progress.
        let old = [member("a", 1_500, Some(41_300))];
        assert!(gang_refusal(Some(&second), &old, 2).is_some());
        // A member in error past the step trained on before the collective failed: progress.
        let mut errored = member("a", 2_500, Some(41_300));
        errored.activity = Activity::Error;
        assert!(gang_refusal(Some(&second), &[errored.clone()], 2).is_none());
        errored.step = Some(41_200);
        assert!(gang_refusal(Some(&second), &[errored], 2).is_some(), "not past it");
        assert!(describe(&second, RunOf::Gang("ml/llm")).starts_with(
            "restarts are not helping: 2 restart(s) of every member, no progress past step 41200 since"
        ));
        assert!(describe(&second, RunOf::Gang("ml/llm")).contains("not restarting gang ml/llm"));
    }

    #[test]
    fn a_gang_that_publishes_no_step_progresses_by_any_beat_after_its_restart() {
        let f = Fruitless { count: 2, since: 1_000, last: 3_000, past: None, job: None };
        assert!(gang_refusal(Some(&f), &[member("a", 2_900, None)], 2).is_some());
        assert!(gang_refusal(Some(&f), &[member("a", 2_900, None), member("b", 3_100, None)], 2)
            .is_none());
        let mut errored = member("b", 3_100, None);
        errored.activity = Activity::Error;
        assert!(gang_refusal(Some(&f), &[errored], 2).is_some(), "back only to fail: no progress");
        assert_eq!(gang_after_restart(None, &[member("a", 1, None)], 5).past, None);
    }

    /// A member's beats up to its own restart's line (`Member::line`: its claim plus the lock's
    /// TTL, its verification, its failure) may be its old incarnation's, beating on while its
    /// restart was slow: they never end the gang's run, whatever their step; its later beats
    /// do, and other members' beats are judged by the run's line alone.
    #[test]
    fn a_members_beats_up_to_its_own_line_are_no_progress() {
        let run = Fruitless { count: 1, since: 1_000, last: 1_000, past: Some(41_200), job: None };
        let mut slow = member("a", 1_030, Some(41_201));
        slow.line = Some(1_090);
        assert!(!gang_progressed(&run, &[slow.clone()]), "the old incarnation's");
        assert!(gang_refusal(Some(&run), &[slow.clone()], 1).is_some());
        slow.heartbeat = Some(1_090);
        assert!(!gang_progressed(&run, &[slow.clone()]), "at the line");
        slow.heartbeat = Some(1_091);
        assert!(gang_progressed(&run, &[slow.clone()]), "after it");
        // A line older than the run's (an earlier restart's) changes nothing.
        let mut other = member("b", 1_030, Some(41_201));
        other.line = Some(500);
        assert!(gang_progressed(&run, &[other]));
        let stale = Fruitless { last: 2_000, ..run.clone() };
        assert!(!gang_progressed(&stale, &[slow.clone()]), "the run's line still holds");
        // Nor is its step where the gang stopped, at the next decision.
        slow.heartbeat = Some(1_030);
        let b = member("b", 1_500, Some(41_190));
        let next = gang_after_restart(Some(&run), &[slow, b], 3_000);
        assert_eq!((next.count, next.past), (2, Some(41_200)));
    }

    /// A run is its job's: a record naming another `job` is not refused by it (nor by a run
    /// of no job, nor when the record names none: unknown is the same job); the job is kept
    /// through the stored form, `:` and all, and an older agent's form reads as no job.
    #[test]
    fn a_run_is_its_job_s() {
        let run = Fruitless { count: 2, since: 1_000, last: 3_000, past: Some(100), job: None };
        let of = |job: &str| Fruitless { job: Some(job.into()), ..run.clone() };
        let mut s = status("step-0", None);
        assert!(same_job(&run, Some(&s)) && same_job(&of("ml:run-7"), Some(&s)));
        s.job = Some("ml:run-8".into());
        assert!(!same_job(&of("ml:run-7"), Some(&s)), "another job");
        assert!(same_job(&of("ml:run-8"), Some(&s)) && same_job(&run, Some(&s)));
        assert!(same_job(&of("ml:run-7"), None));
        assert_eq!(Fruitless::decode(&of("ml:run-7").encode()), Some(of("ml:run-7")));
        assert_eq!(of("ml:run-7").encode(), "2:1000:3000:100:ml:run-7");
        assert_eq!(Fruitless::decode("2:1000:3000:100"), Some(run.clone()));
        // The next restart of a run keeps its job.
        let next = after_restart(Some(&of("j")), &[], 4_000);
        assert_eq!((next.count, next.job.as_deref()), (3, Some("j")));
    }

    /// One rule set, one difference: past its step, a gang member's beat in error is progress
    /// (the collective trained on, then failed as a whole); a worker's is not — its old
    /// incarnation may beat in error past the step before a slow command (seed 179499).
    #[test]
    fn past_the_step_an_error_beat_ends_a_gang_s_run_but_not_a_worker_s() {
        let run = Fruitless { count: 2, since: 1_000, last: 3_000, past: Some(41_200), job: None };
        let m = marks(Some(run.clone()), 0);
        let mut failed_on = status("step-41300", None);
        failed_on.heartbeat = Some(3_500);
        failed_on.state = WorkerState::Error;
        assert!(blocks(&m, Some(&failed_on), 2), "a worker's error beat");
        let mut rank = member("a", 3_500, Some(41_300));
        rank.activity = Activity::Error;
        assert!(gang_refusal(Some(&run), &[rank], 2).is_none(), "a member's");
        failed_on.state = WorkerState::Processing;
        assert!(!blocks(&m, Some(&failed_on), 2), "past its step, working");
        assert!(blocks(&m, None, 2), "no record, no progress");
    }
}
