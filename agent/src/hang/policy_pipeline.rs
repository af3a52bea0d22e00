//! The restart pipeline as one state machine (pure), for either restart unit ([`Unit`]): a
//! worker's pass in the brief's order — decide → lock → logs → revalidate → caps → claim →
//! recheck → lock check → command → verify — and a gang's one decision — lock → revalidate →
//! caps → count → claim → announce (each member is then restarted by its own node's worker
//! pass). After each step, what comes next: the next step, or a stop with what must be given
//! back. The engine (`crate::hang::restart::pipeline`, and the gang's decision in
//! `crate::hang::restart::gang`) runs a step, tells [`next`] what it found, and does what it
//! answers; nothing else orders the steps.
//!
//! What a pass holds once a step has passed, and gives back when it stops later:
//! the restart alert (announced with the logs: released so the restart that eventually runs
//! alerts again, with its logs — unless the incident closed); the breaker and budget units (taken
//! at `Caps`: refunded); the claim (the cooldown marker written at `Claim`: compare-and-deleted).
//! The node lock is held from `Lock` to the end of the pass, whatever happens, and released by
//! the engine.

use crate::hang::policy::Cancel;

/// What a pass restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// One worker: its node's lock, breaker and the fleet budget, then the command.
    Worker,
    /// A gang's one decision: its lock, its breaker and the fleet budget, its run of fruitless
    /// restarts, then the decision every member's agent carries out.
    Gang,
}

/// A step of the restart pipeline, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Step {
    /// The worker is the runtime's to restart, and nobody else's (`alert-only`).
    Decide,
    /// A cheap read of the breaker and the budget, so an open breaker collects no logs and
    /// posts no restart alert (the authoritative check is `Caps`).
    Peek,
    /// The node lock: one restart at a time on a node.
    Lock,
    /// The container's last lines, then the restart alert with them (once per incident). Logs
    /// that cannot be read refuse (`LogsFailed`) for two polls from their first failure, then
    /// pass: the alert goes without them (`crate::hang::restart`'s `before_command`).
    Logs,
    /// The verdict again from a fresh record, marks and clock; the node's state; the incarnation.
    Revalidate,
    /// Observe mode: everything but the command.
    Observe,
    /// One unit of the unit's breaker and of the fleet's budget, taken atomically.
    Caps,
    /// A gang's run of fruitless restarts counts the decision, before the decision is taken: a
    /// decision is never taken without its count.
    Count,
    /// A worker: the lock still covers the restart; the cooldown marker claimed (SET NX). A
    /// gang: the decision (SET NX: the first agent's stands).
    Claim,
    /// The node's state and the incarnation once more, right before the command.
    Recheck,
    /// The lock, still ours, renewed to its full TTL (compare-and-renew) after the last slow
    /// step (`Recheck`'s inspect may take `runtime.call_timeout`): only the command follows it.
    LockCheck,
    /// The restart call.
    Command,
    /// The container's start time says whether it restarted.
    Verify,
    /// A gang's `restarting` page, once its decision stands.
    Announce,
}

/// Why a pass stopped short of the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    LockHeld,
    BreakerOpen,
    BudgetExhausted,
    LockExpiring,
    ContainerChanged,
    /// The container decided on is not running any more (stopped by a person, crashed, or on
    /// CRI replaced by kubelet's next attempt): a restart would start what someone stopped.
    NotRunning,
    Cancelled(Cancel),
    NodeState,
    /// The container's logs could not be read, for less than two polls since their first
    /// failure in the incident: the restart waits for them (past that, it goes without them).
    LogsFailed,
    NotRestartable,
    /// Another instance's restart of this incident failed after our decision: the retry
    /// waits for its backoff.
    RetryPending,
    /// The worker's restarts belong to another controller (`alert-only`).
    AlertOnly,
    /// Restarts in a row brought no progress past where the worker stopped.
    Fruitless,
    /// A gang: a member cannot take part (its node stands down, it is alert-only, its node's
    /// breaker is spent...), or the gang's caps refuse.
    Blocked,
    /// A gang: another member's agent decided this incident first; its decision stands.
    Decided,
}

/// What a step found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// It passed: the next step may run. At `Verify`: the container restarted (a new
    /// incarnation running).
    Pass,
    /// At `Verify`: the command ran and left no running new incarnation — a failed restart, a
    /// first-class outcome (paged at once, retried after a backoff). Nothing is given back: the
    /// command ran, and the breaker's unit was spent on it.
    RestartFailed,
    /// It refused (and said why in the trail).
    Skip(Skip),
    /// The coordinator failed under it: the pass ends (fail closed).
    Failed,
}

/// What a pass gives back when it stops (see the module's notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Undo {
    pub(crate) release_alert: bool,
    pub(crate) refund_caps: bool,
    pub(crate) release_claim: bool,
}

/// What comes after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    Go(Step),
    /// The pass ends here (the command ran, or a step refused or failed): give back `Undo`.
    Stop(Undo),
}

/// The steps a pass of `unit` runs when every one passes, in order. In observe mode a worker's
/// pass runs `Observe` after `Revalidate`, and stops there; a gang's runs the same steps
/// (`Caps` and `Count` take nothing there).
fn steps(unit: Unit) -> &'static [Step] {
    use Step::*;
    match unit {
        Unit::Worker => &[
            Decide, Peek, Lock, Logs, Revalidate, Caps, Claim, Recheck, LockCheck, Command, Verify,
        ],
        // The gang plan (`crate::hang::policy_gang`) decided to decide.
        Unit::Gang => &[Lock, Revalidate, Caps, Count, Claim, Announce],
    }
}

/// The step a pass of `unit` begins with.
pub(crate) fn first(unit: Unit) -> Step {
    steps(unit)[0]
}

/// The one answer to "what next": from the unit, the step that ran, what it found, and the
/// mode. A step that passed leads to the next of [`steps`] (after the last, or a step that is
/// not the unit's, the pass ends holding nothing to give back); anything else stops the pass.
pub(crate) fn next(unit: Unit, step: Step, seen: Seen, dry_run: bool) -> Next {
    let order = steps(unit);
    let after = order.iter().position(|&s| s == step).and_then(|i| order.get(i + 1));
    let observe = dry_run && step == Step::Revalidate;
    match (unit, seen, after) {
        (Unit::Worker, Seen::Pass, _) if observe => Next::Go(Step::Observe),
        (_, Seen::Pass, Some(&s)) => Next::Go(s),
        (_, Seen::Pass, None) => Next::Stop(Undo::default()),
        (Unit::Worker, _, _) => Next::Stop(undo(step, seen)),
        (Unit::Gang, _, _) => Next::Stop(gang_undo(step, seen)),
    }
}

/// What a gang's decision gives back when it stops at `step`: the units taken at `Caps` (a
/// refusing `Caps` gave its own back) when it stops at the count or another agent's decision
/// won the claim. NB: a claim that failed keeps them: the decision's write may have landed (its
/// reply lost), and a decision is never left without its units.
fn gang_undo(step: Step, seen: Seen) -> Undo {
    // The units are held from `Caps` on; a decision of ours may stand once `Claim` wrote it.
    let lost = step == Step::Claim && matches!(seen, Seen::Skip(_));
    Undo { refund_caps: step == Step::Count || lost, ..Undo::default() }
}

/// What a pass that stops at `step` gives back: nothing from `Command` on, whatever the command
/// did (it ran).
fn undo(step: Step, seen: Seen) -> Undo {
    // The restart alert went out at `Logs`; a refusal after it releases it, unless revalidation
    // closed the incident (it recovered, or another instance restarted the worker: the incident
    // timer is deleted with it). A coordinator failure keeps it: the next pass must not page
    // "restarting" twice for one incident — except at `Claim`, whose failed write may hide a
    // claim: that pass is undone whole.
    let closed = step == Step::Revalidate && matches!(seen, Seen::Skip(Skip::Cancelled(_)));
    let refused = matches!(seen, Seen::Skip(_));
    // Past `Claim`: its claim (and the units) held.
    let claimed = matches!(step, Step::Recheck | Step::LockCheck);
    let announced = matches!(step, Step::Revalidate | Step::Caps | Step::Claim) || claimed;
    // The units were taken at `Caps` (a refusing or failing `Caps` gave the breaker's back:
    // `crate::coord::caps::Caps::take`): from `Claim` on they are held, and so is the claim,
    // which a failed write at `Claim` may have made unseen.
    Undo {
        release_alert: announced && !closed && (refused || step == Step::Claim),
        refund_caps: step == Step::Claim || claimed,
        release_claim: (step == Step::Claim && seen == Seen::Failed) || claimed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEPS: [Step; 12] = [
        Step::Decide,
        Step::Peek,
        Step::Lock,
        Step::Logs,
        Step::Revalidate,
        Step::Observe,
        Step::Caps,
        Step::Claim,
        Step::Recheck,
        Step::LockCheck,
        Step::Command,
        Step::Verify,
    ];

    /// The steps a pass runs when every one passes.
    fn path(dry_run: bool) -> Vec<Step> {
        let mut out = vec![Step::Decide];
        while let Next::Go(s) = next(Unit::Worker, *out.last().unwrap(), Seen::Pass, dry_run) {
            out.push(s);
        }
        out
    }

    #[test]
    fn a_clean_pass_runs_the_brief_s_order() {
        use Step::*;
        let pass = [
            Decide, Peek, Lock, Logs, Revalidate, Caps, Claim, Recheck, LockCheck, Command, Verify,
        ];
        assert_eq!(path(false), pass);
        assert_eq!(path(true), [Decide, Peek, Lock, Logs, Revalidate, Observe]);
    }

    #[test]
    fn the_command_runs_only_after_every_safeguard_in_every_mode() {
        use Step::*;
        for dry_run in [false, true] {
            let p = path(dry_run);
            if let Some(i) = p.iter().position(|s| *s == Command) {
                for needed in [Lock, Revalidate, Caps, Claim, Recheck, LockCheck] {
                    let at = p.iter().position(|s| *s == needed).expect("every safeguard runs");
                    assert!(at < i, "{needed:?} after the command");
                }
                assert!(!dry_run, "observe mode ran the command");
            }
        }
    }

    /// Property 8 (docs/safety.md): the lock is renewed after the last slow step — the
    /// runtime's inspect at `Recheck` may take `runtime.call_timeout` — so nothing but the command
    /// follows the last look at it; and a lock lost by then gives back all the
    /// pass holds by then (the claim, the units, the restart alert).
    #[test]
    fn the_lock_is_checked_after_the_last_slow_step_right_before_the_command() {
        use Step::*;
        let p = path(false);
        let at = |found: Option<usize>| found.expect("in a clean pass");
        let command = at(p.iter().position(|&s| s == Command));
        // The steps that wait on the runtime (and the alert sinks), and those that read the lock.
        let slow = at(p.iter().rposition(|s| matches!(s, Logs | Revalidate | Recheck)));
        let checked = at(p.iter().rposition(|s| matches!(s, Claim | LockCheck)));
        assert!(slow < checked && checked + 1 == command, "{p:?}");
        assert_eq!(
            next(Unit::Worker, LockCheck, Seen::Skip(Skip::LockExpiring), false),
            Next::Stop(Undo { release_alert: true, refund_caps: true, release_claim: true })
        );
    }

    #[test]
    fn every_refusal_and_failure_stops_the_pass() {
        for step in STEPS {
            for seen in [Seen::Skip(Skip::NodeState), Seen::Failed, Seen::RestartFailed] {
                for dry_run in [false, true] {
                    assert!(
                        matches!(next(Unit::Worker, step, seen, dry_run), Next::Stop(_)),
                        "{step:?} {seen:?}"
                    );
                }
            }
        }
    }

    /// Exhaustively: a stop gives back exactly what the pass holds at that step.
    #[test]
    fn a_stop_gives_back_what_the_pass_holds() {
        let skips = [
            Skip::LockHeld,
            Skip::NodeState,
            Skip::RetryPending,
            Skip::ContainerChanged,
            Skip::NotRunning,
            Skip::LockExpiring,
            Skip::Cancelled(Cancel::Recovered),
            Skip::Cancelled(Cancel::CooldownAppeared),
        ];
        let seens = skips.map(Seen::Skip).into_iter().chain([Seen::Failed]);
        for seen in seens {
            for step in STEPS {
                let Next::Stop(u) = next(Unit::Worker, step, seen, false) else { unreachable!() };
                let after = |s: Step| step >= s && step != Step::Observe;
                // Units only once taken, never after the command ran.
                let held = matches!(step, Step::Claim | Step::Recheck | Step::LockCheck);
                assert_eq!(u.refund_caps, held, "{step:?}");
                if u.release_claim {
                    assert!(after(Step::Claim) && step < Step::Command, "{step:?}");
                }
                // The claim, once written (or maybe written: a failed write at `Claim`).
                let claimed = matches!(step, Step::Recheck | Step::LockCheck)
                    || (step == Step::Claim && seen == Seen::Failed);
                assert_eq!(u.release_claim, claimed, "{step:?} {seen:?}");
                if u.release_alert {
                    assert!(after(Step::Revalidate) && step < Step::Command, "{step:?} {seen:?}");
                    let closed = matches!(seen, Seen::Skip(Skip::Cancelled(_)));
                    assert!(!(closed && step == Step::Revalidate), "{seen:?}");
                }
                // A refusal once the alert is out releases it (the incident still open).
                let still_open =
                    !(step == Step::Revalidate && matches!(seen, Seen::Skip(Skip::Cancelled(_))));
                let announced = held || matches!(step, Step::Revalidate | Step::Caps);
                if matches!(seen, Seen::Skip(_)) && still_open && announced {
                    assert!(u.release_alert, "{step:?} {seen:?}");
                }
            }
        }
        // The claim may have been made by a write whose reply was lost: released.
        assert_eq!(
            next(Unit::Worker, Step::Claim, Seen::Failed, false),
            Next::Stop(Undo { release_alert: true, refund_caps: true, release_claim: true })
        );
        // A coordinator failure after the alert keeps it (the pass may have failed writing the
        // trail after a refusal): the incident's one "restarting" page stands; at the recheck
        // and the lock check the claim and the units still go back.
        assert_eq!(
            next(Unit::Worker, Step::Revalidate, Seen::Failed, false),
            Next::Stop(Undo::default())
        );
        for step in [Step::Recheck, Step::LockCheck] {
            assert_eq!(
                next(Unit::Worker, step, Seen::Failed, false),
                Next::Stop(Undo { release_alert: false, refund_caps: true, release_claim: true }),
                "{step:?}"
            );
        }
        // After the command, nothing is given back, whether it restarted the container or
        // not (two outcomes, one stop): it ran.
        for seen in [Seen::Pass, Seen::RestartFailed, Seen::Failed] {
            assert_eq!(
                next(Unit::Worker, Step::Verify, seen, false),
                Next::Stop(Undo::default()),
                "{seen:?}"
            );
        }
    }

    /// The steps a gang's decision runs when every one passes.
    fn gang_path() -> Vec<Step> {
        let mut out = vec![first(Unit::Gang)];
        while let Next::Go(s) = next(Unit::Gang, *out.last().unwrap(), Seen::Pass, false) {
            out.push(s);
        }
        out
    }

    #[test]
    fn a_gangs_decision_runs_lock_revalidate_caps_count_claim_announce() {
        use Step::*;
        assert_eq!(first(Unit::Worker), Decide);
        assert_eq!(gang_path(), [Lock, Revalidate, Caps, Count, Claim, Announce]);
        // The same in observe mode (its caps and count take nothing).
        let mut out = vec![first(Unit::Gang)];
        while let Next::Go(s) = next(Unit::Gang, *out.last().unwrap(), Seen::Pass, true) {
            out.push(s);
        }
        assert_eq!(out, gang_path());
    }

    /// Exhaustively, for a gang's decision: every refusal and failure stops it, and a stop gives
    /// back the units exactly when they were taken and no decision of ours may stand.
    #[test]
    fn a_gangs_stop_gives_back_its_units_only_when_its_decision_cannot_stand() {
        let seens = [
            Seen::Skip(Skip::LockHeld),
            Seen::Skip(Skip::Blocked),
            Seen::Skip(Skip::Decided),
            Seen::Skip(Skip::Fruitless),
            Seen::Skip(Skip::Cancelled(Cancel::Recovered)),
            Seen::Failed,
        ];
        for step in gang_path() {
            for seen in seens {
                let Next::Stop(u) = next(Unit::Gang, step, seen, false) else {
                    panic!("{step:?} {seen:?} did not stop");
                };
                assert!(!u.release_alert && !u.release_claim, "{step:?} {seen:?}");
                let taken = step > Step::Caps;
                let may_stand =
                    step == Step::Announce || (step == Step::Claim && seen == Seen::Failed);
                assert_eq!(u.refund_caps, taken && !may_stand, "{step:?} {seen:?}");
            }
        }
        assert_eq!(
            next(Unit::Gang, Step::Announce, Seen::Pass, false),
            Next::Stop(Undo::default())
        );
    }
}
