//! When a confirmed incident's restart is due, and when a failed one may be tried again (pure,
//! `now` handed in): a hang waits `policy.restart_delay` (and its fixed rule, not only its
//! learned rhythm), an error does not; a failed restart bars the worker's next for a backoff
//! from the stop grace to the cooldown.

use std::time::Duration;

use crate::clock::{ms, Millis};
use crate::config::PolicyConfig;
use crate::hang::model::{Marks, Verdict, WorkerStatus};
use crate::hang::policy_record::is_stale;

/// How long a confirmed incident waits before the restart: hangs wait `restart_delay`
/// (persistence before action); an errored worker has already persisted for `error_for`.
pub(crate) fn restart_wait(v: Verdict, cfg: &PolicyConfig) -> Duration {
    match v {
        Verdict::Hung => cfg.restart_delay,
        _ => Duration::ZERO,
    }
}

/// When the broken condition began, for "how long" in alerts: the error clock for an errored
/// worker, the last heartbeat for a hung one, else the incident's start.
pub(crate) fn condition_since(
    v: Verdict,
    incident_started: Millis,
    marks: &Marks,
    status: Option<&WorkerStatus>,
) -> Millis {
    match v {
        Verdict::Errored => marks.error_since.unwrap_or(incident_started),
        _ => status.and_then(|s| s.heartbeat).unwrap_or(incident_started),
    }
}

/// Whether a hang is one by the rule its restart is judged by (`cfg`:
/// `policy_rhythm::restart_policy` — the fixed `policy.stale_after` or its grace, or the learned
/// silence the coordinator's history allows a restart by), not only by the silence the verdict
/// was judged by (which may be learned from this agent's own samples): the restart waits for
/// it. Any other verdict has no learned part.
pub(crate) fn stale_by_restart_rule(
    v: Verdict,
    status: Option<&WorkerStatus>,
    now: Millis,
    cfg: &PolicyConfig,
) -> bool {
    v != Verdict::Hung || status.is_some_and(|s| is_stale(s, now, cfg))
}

/// Whether the restart pipeline should run now for an incident that started at `started`.
/// Hangs wait `restart_delay` (persistence before action); an errored worker has already
/// persisted for `error_for`.
pub(crate) fn restart_due(v: Verdict, started: Millis, now: Millis, cfg: &PolicyConfig) -> bool {
    v == Verdict::Errored || (v == Verdict::Hung && now - started >= ms(cfg.restart_delay))
}

/// Whether a restart may be tried now: not before the `not_before` of the worker's last failed
/// restart, whichever incident it was of (the incident only numbers the attempts, see
/// `restart_failed`).
///
/// NB: the bar is the worker's, not the incident's: a container that ignores SIGTERM is still
/// stopping whoever asks next. A failover that forgets the incident timer (or any other way to a
/// second incident of the same hang) must not let a second command, and a second breaker unit,
/// through within the stop grace (simulation seed 5054008).
pub(crate) fn retry_open(marks: &Marks, now: Millis) -> bool {
    marks.retry.as_ref().is_none_or(|r| now >= r.not_before)
}

/// How long after its `failures`-th failed restart an incident waits for the next try: the
/// stop grace, doubled for each earlier failure, at most the cooldown (never less than the
/// grace).
///
/// NB: a restart that failed still took its breaker unit (the unit counts at execution), and a
/// worker that ignores SIGTERM takes the whole grace to stop: retrying every cycle spent a
/// day's breaker in seconds and paged each time. Spaced this way, an incident takes at most one
/// unit per stop grace.
pub(crate) fn retry_backoff(failures: u32, stop_grace: Duration, cooldown: Duration) -> Duration {
    let doubled = stop_grace.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(cooldown.max(stop_grace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hang::model::Retry;
    use crate::hang::policy::tests::{cfg, NOW, S};

    #[test]
    fn a_failed_restart_bars_every_incident_of_its_worker_until_its_backoff() {
        let retry = |incident: &str, not_before| Marks {
            retry: Some(Retry { incident: incident.into(), failures: 1, not_before }),
            ..Marks::default()
        };
        assert!(retry_open(&Marks::default(), NOW), "no failure yet");
        assert!(!retry_open(&retry("i1", NOW + 1), NOW));
        assert!(retry_open(&retry("i1", NOW), NOW), "open at not_before");
        assert!(
            !retry_open(&retry("i0", NOW + 60 * S), NOW),
            "another incident's failed restart bars too: the container may still be stopping"
        );
        assert!(retry_open(&retry("i0", NOW), NOW));
    }

    #[test]
    fn retries_back_off_from_the_stop_grace_to_the_cooldown() {
        let grace = Duration::from_secs(30);
        let cooldown = Duration::from_secs(600);
        let waits: Vec<u64> =
            (1..=7).map(|n| retry_backoff(n, grace, cooldown).as_secs()).collect();
        assert_eq!(waits, vec![30, 60, 120, 240, 480, 600, 600]);
        assert_eq!(retry_backoff(u32::MAX, grace, cooldown).as_secs(), 600);
        // Never below the grace, even with a cooldown shorter than it.
        let short = Duration::from_secs(10);
        assert_eq!(retry_backoff(1, grace, short), grace);
        assert_eq!(retry_backoff(5, grace, short), grace);
    }

    #[test]
    fn restart_is_due_exactly_at_the_end_of_the_delay() {
        let c = cfg();
        assert!(!restart_due(Verdict::Hung, NOW - 180 * S + 1, NOW, &c));
        assert!(restart_due(Verdict::Hung, NOW - 180 * S, NOW, &c));
        assert!(restart_due(Verdict::Errored, NOW, NOW, &c));
        for v in [Verdict::Suspect, Verdict::Booting, Verdict::Unreachable, Verdict::Stalled] {
            assert!(!restart_due(v, 0, NOW, &c), "{v:?}");
        }
    }
}
