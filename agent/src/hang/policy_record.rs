//! What a worker's record says, read against the policy (pure): whether it is stale (its
//! allowed silence, a long operation's announced grace within `max_grace`), which rank of a
//! several-rank container stands for it, a heartbeat from the future, and whether a restarted
//! worker has booted.

use std::time::Duration;

use crate::clock::{ms, Millis};
use crate::config::PolicyConfig;
use crate::hang::model::{WorkerState, WorkerStatus};

/// True when the record shows a working worker (any state but `idle` and `error`) whose
/// heartbeat is older than the silence it is allowed ([`allowed_silence`]).
/// NB: "older than" is strict — a heartbeat exactly that old is still fresh.
pub(crate) fn is_stale(status: &WorkerStatus, now: Millis, cfg: &PolicyConfig) -> bool {
    watched(&status.state)
        && matches!(status.heartbeat, Some(hb) if now - hb > allowed_silence(status, cfg))
}

/// States whose silence is a hang: `processing` and every word but `idle` (no work to hang on)
/// and `error` (its own timer). No state is "never hung" for ever: a worker stuck in `loading`
/// is found like one stuck in `processing`.
pub(crate) fn watched(state: &WorkerState) -> bool {
    matches!(state, WorkerState::Processing | WorkerState::Other(_))
}

/// How long (ms) a worker may stay silent after its heartbeat: `stale_after`, or the grace it
/// announced for a long operation when that is longer, never more than `max_grace`.
pub(crate) fn allowed_silence(status: &WorkerStatus, cfg: &PolicyConfig) -> Millis {
    let grace = status.grace.unwrap_or(0).min(ms(cfg.max_grace));
    ms(cfg.stale_after).max(grace)
}

/// The status a record stands for at `now` (the coordinator's clock). A container of several
/// ranks (`ranks = N`, each rank's own fields:
/// `crate::hang::model::WorkerStatus::ranks_from_fields`) is as healthy as its worst rank — one
/// hung rank must not hide behind the others' beats: a rank in `error`, else the watched rank
/// whose allowed silence runs out first (one that never beat first of all), else (all idle)
/// rank 0. A rank beating from the future ([`heartbeat_from_future`]) runs out `now`: it stands
/// for the record (then invalid, as a one-process record from the future is) unless a rank is
/// stale.
pub(crate) fn status_of_record(
    fields: &std::collections::HashMap<String, String>,
    now: Millis,
    cfg: &PolicyConfig,
) -> Option<WorkerStatus> {
    let Some(ranks) = WorkerStatus::ranks_from_fields(fields) else {
        return WorkerStatus::from_fields(fields);
    };
    // NB: a rank from the future (milliseconds written where seconds belong) would otherwise run
    // out last for ever: never found hung, its bad clock never said. Runs out `now`: after every
    // stale rank (a hang is restarted whatever another rank's clock says), before every fresh
    // one. Saturating: `1e300` seconds reads as the largest heartbeat (an overflow panicked a
    // debug build).
    let deadline = |s: &WorkerStatus| match s.heartbeat {
        None => Millis::MIN,
        Some(_) if heartbeat_from_future(s, now).is_some() => now,
        Some(hb) => hb.saturating_add(allowed_silence(s, cfg)),
    };
    // NB: `or_else`: the deadlines are added up only when no rank is in error.
    let errored = ranks.iter().find(|s| s.state == WorkerState::Error);
    let runs_out_first = || ranks.iter().filter(|s| watched(&s.state)).min_by_key(|s| deadline(s));
    errored.or_else(runs_out_first).or(ranks.first()).cloned()
}

/// How far ahead of the coordinator's clock a heartbeat may be before the record is taken for
/// invalid (clock skew between a worker and Redis is seconds; milliseconds written where seconds
/// belong are decades ahead).
pub(crate) const MAX_FUTURE: Duration = Duration::from_secs(300);

/// How far ahead of `now` the record's heartbeat is, when it is beyond [`MAX_FUTURE`]: such a
/// record cannot be trusted, it would look fresh for ever.
pub(crate) fn heartbeat_from_future(status: &WorkerStatus, now: Millis) -> Option<Millis> {
    status.heartbeat.map(|hb| hb - now).filter(|&ahead| ahead > ms(MAX_FUTURE))
}

/// Has a restarted worker come back? Yes once its record holds a heartbeat written after
/// `after` (`crate::hang::marks::booted_after`: when its restart was verified or seen): its
/// booting is over, and from then on it is judged like any other worker — a new hang is a new
/// incident, bounded by the breaker, not something the cooldown hides for ten minutes.
pub(crate) fn booted(after: Option<Millis>, status: Option<&WorkerStatus>) -> bool {
    matches!((after, status.and_then(|s| s.heartbeat)), (Some(t), Some(hb)) if hb > t)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::hang::model::{Marks, Verdict};
    use crate::hang::policy::tests::{cfg, rec, v, NOW, S};
    use crate::hang::policy::{revalidate, verdict, Cancel, NodeContext};

    #[test]
    fn status_fields_parse_seconds_with_decimals() {
        let f: HashMap<String, String> = [
            ("state", "processing"),
            ("heartbeat", "1800000000.25"),
            ("job", "j"),
            ("progress", ""),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let s = WorkerStatus::from_fields(&f).unwrap();
        assert_eq!(s.heartbeat, Some(1_800_000_000_250));
        assert_eq!(s.progress, None);
        assert_eq!(WorkerStatus::from_fields(&HashMap::new()), None);
        let only_checkpoint: HashMap<String, String> =
            [("checkpoint_request".to_string(), "abc".to_string())].into();
        assert_eq!(WorkerStatus::from_fields(&only_checkpoint), None);
        let mut bad = f.clone();
        bad.insert("heartbeat".into(), "yesterday".into());
        assert_eq!(WorkerStatus::from_fields(&bad).unwrap().heartbeat, None);
    }

    #[test]
    fn a_heartbeat_from_the_future_is_an_invalid_record() {
        // Milliseconds written where seconds belong: decades ahead.
        let mut r = rec("processing", 0);
        r.heartbeat = Some(NOW * 1000);
        assert_eq!(
            verdict(Some(&r), &Marks::default(), NodeContext::default(), NOW, &cfg()),
            Verdict::Unreachable
        );
        assert!(heartbeat_from_future(&r, NOW).is_some());
        // A little clock skew is fine.
        r.heartbeat = Some(NOW + 60 * S);
        assert_eq!(
            verdict(Some(&r), &Marks::default(), NodeContext::default(), NOW, &cfg()),
            Verdict::Healthy
        );
    }

    #[test]
    fn a_rank_from_the_future_stands_for_the_record_unless_another_is_stale() {
        let two = |beat0: &str, beat1: &str| -> HashMap<String, String> {
            let f = [("ranks", "2"), ("state@0", "processing"), ("state@1", "processing")];
            let beats = [("heartbeat@0", beat0), ("heartbeat@1", beat1)];
            f.iter().chain(&beats).map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let fresh = (NOW / 1000 - 10).to_string();
        let stale = (NOW / 1000 - 600).to_string();
        // Milliseconds where seconds belong: the record is invalid, as a one-process one is.
        let ms = NOW.to_string();
        let s = status_of_record(&two(&fresh, &ms), NOW, &cfg()).unwrap();
        assert_eq!(s.rank, Some((1, 2)));
        assert_eq!(
            verdict(Some(&s), &Marks::default(), NodeContext::default(), NOW, &cfg()),
            Verdict::Unreachable
        );
        // A stale rank is a hang whatever the other's clock says; the end of time (`1e300`
        // seconds, the largest heartbeat) neither overflows nor hides it.
        for future in [ms.as_str(), "1e300"] {
            let s = status_of_record(&two(future, &stale), NOW, &cfg()).unwrap();
            assert_eq!(s.rank, Some((1, 2)), "{future}");
            assert_eq!(v(Some(&s), &Marks::default()), Verdict::Suspect, "{future}");
        }
        // Within MAX_FUTURE (clock skew), the ahead rank is fresh: the other stands.
        let skewed = (NOW / 1000 + 60).to_string();
        assert_eq!(
            status_of_record(&two(&skewed, &fresh), NOW, &cfg()).unwrap().rank,
            Some((1, 2))
        );
    }

    #[test]
    fn worker_supplied_fields_are_bounded() {
        let big = "x".repeat(5 * 1024 * 1024);
        let f: HashMap<String, String> = [
            ("state", "processing"),
            ("heartbeat", "1800000000"),
            ("job", big.as_str()),
            ("progress", big.as_str()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let st = WorkerStatus::from_fields(&f).unwrap();
        assert!(st.job.unwrap().len() <= crate::hang::model::MAX_FIELD + 3);
        assert!(st.progress.unwrap().len() <= crate::hang::model::MAX_FIELD + 3);
    }

    #[test]
    fn every_working_state_is_watched_and_idle_is_not() {
        // Stuck in `loading` or `compile` (or no state named) is found like `processing`.
        for state in ["processing", "loading", "compile", "checkpoint", ""] {
            assert_eq!(
                v(Some(&rec(state, 120 * S)), &Marks::default()),
                Verdict::Healthy,
                "{state}"
            );
            assert_eq!(
                v(Some(&rec(state, 120 * S + 1)), &Marks::default()),
                Verdict::Suspect,
                "{state}"
            );
        }
        // Idle has no work to hang on; error has its own timer.
        assert_eq!(v(Some(&rec("idle", 9_999 * S)), &Marks::default()), Verdict::Healthy);
        assert_eq!(v(Some(&rec("error", 9_999 * S)), &Marks::default()), Verdict::ErrorPending);
    }

    #[test]
    fn an_announced_grace_holds_up_to_max_grace_and_then_the_worker_is_stale() {
        let busy = |age: Millis, grace_s: Millis| WorkerStatus {
            grace: Some(grace_s * S),
            ..rec("compile", age)
        };
        // 20 minutes announced: fresh through them, stale one millisecond after.
        assert_eq!(v(Some(&busy(1_200 * S, 1_200)), &Marks::default()), Verdict::Healthy);
        assert_eq!(v(Some(&busy(1_200 * S + 1, 1_200)), &Marks::default()), Verdict::Suspect);
        // A grace shorter than stale_after changes nothing.
        assert_eq!(v(Some(&busy(100 * S, 10)), &Marks::default()), Verdict::Healthy);
        // Past max_grace (1 h by default) it is cut: a worker cannot announce forever.
        assert_eq!(v(Some(&busy(3_600 * S, 86_400)), &Marks::default()), Verdict::Healthy);
        assert_eq!(v(Some(&busy(3_600 * S + 1, 86_400)), &Marks::default()), Verdict::Suspect);
        // Revalidation reads the same rule: still within its grace at the last moment = recovered.
        assert_eq!(
            revalidate(Verdict::Hung, Some(&busy(600 * S, 1_200)), &Marks::default(), NOW, &cfg()),
            Err(Cancel::Recovered)
        );
        // A frozen progress marker during a long operation is no stall.
        let marks =
            Marks { progress: Some(("step-10".into(), NOW - 7_200 * S)), ..Marks::default() };
        assert_eq!(v(Some(&busy(10 * S, 1_200)), &marks), Verdict::Healthy);
    }
}
