//! The restart pipeline, run: the steps of `crate::hang::policy_pipeline` in one loop. Each step
//! is one call below (the steps themselves are in `before_command`, `limits` and `command`; the
//! lock's, taken and checked, here); after each, the policy's [`next`] says what follows, and a
//! stop gives back what the policy says the pass holds. The node lock taken at `Lock` is released
//! here, whatever happened.
//!
//! A pass is its own object, [`Pipeline`]: the incident it acts on and what it carries from one
//! step to the next; and what its steps take — the context, the pager, the trail, what the node
//! watches right before the command and the rules the worker is judged by — nothing else of the
//! worker's evaluation.

use crate::clock::{human, ms, Millis};
use crate::config::LOCK_MARGIN;
use crate::coord::lease::Lease;
use crate::coord::Result;
use crate::hang::policy_pipeline::{first, next, Next, Seen, Skip, Step, Undo, Unit};

use crate::hang::context::Context;
use crate::hang::journal::Journal;
use crate::hang::stand_down::NodeWatch;
use crate::runtime::RuntimeError;
use crate::vocab::workload::Remediation;

use super::pager::Pager;
use super::rhythm::Judge;
use super::{Act, RestartPath};

/// One pass of the restart pipeline for a worker's incident: the incident, what the pass carries
/// from one step to the next, and all its steps take.
pub(super) struct Pipeline<'a> {
    pub(super) ctx: &'a Context,
    pub(super) pager: Pager<'a>,
    pub(super) journal: &'a mut Journal,
    /// Shutdown, maintenance and GPU state, read again right before the command.
    pub(super) watch: &'a NodeWatch,
    /// The rules the worker is judged by (its restart's, at the last moment).
    pub(super) judge: Judge<'a, 'a>,
    /// The incident the pass acts on.
    pub(super) act: &'a Act<'a>,
    /// The coordinator's clock as the last step that read it saw it (`Logs`, `Revalidate`,
    /// `Observe`, `Caps`): from `Caps` on, the time of the claim and the command.
    pub(super) now: Millis,
    /// The node lock, from `Lock` on.
    pub(super) lease: Option<Lease>,
    /// The restart call's answer, from `Command` to `Verify`.
    call: Option<Result<(), RuntimeError>>,
    /// How the worker is restarted, as `Decide` found its controllers (in place where unset).
    pub(super) how: Remediation,
}

impl RestartPath<'_> {
    /// The pass of the pipeline for `act`, an incident of this worker's evaluation whose restart
    /// is due (at the evaluation's clock, `Case::now`).
    pub(super) fn pipeline<'p>(&'p mut self, act: &'p Act<'p>) -> Pipeline<'p> {
        let pager = Pager::new(self.ctx, self.alerts, &mut self.gangs.sent);
        let judge = Judge { policy: &self.ctx.cfg.policy, rhythm: self.rhythm };
        Pipeline {
            ctx: self.ctx,
            pager,
            journal: self.journal,
            watch: self.watch,
            judge,
            act,
            now: act.case.now,
            lease: None,
            call: None,
            how: Remediation::IN_PLACE,
        }
    }
}

impl Pipeline<'_> {
    /// The pass: its steps in one loop. Coordinator errors end it (fail closed) after giving
    /// back what it holds.
    pub(super) async fn run(&mut self) -> Result<()> {
        let mut step = first(Unit::Worker);
        let result = loop {
            let ran = self.run_step(step).await;
            let seen = ran.as_ref().map_or(Seen::Failed, |s| *s);
            match next(Unit::Worker, step, seen, self.ctx.cfg.dry_run) {
                Next::Go(s) => step = s,
                Next::Stop(undo) => {
                    self.give_back(undo).await;
                    break ran.map(drop);
                }
            }
        };
        if let Some(lease) = &self.lease {
            // Only our own lock (compare-and-delete).
            if let Err(e) = lease.release(self.ctx.coord.as_ref()).await {
                tracing::warn!(error = %e, "could not release the node lock; it expires by its TTL");
            }
        }
        result
    }

    /// Run one step: what it found (a refusal said why in the trail).
    async fn run_step(&mut self, step: Step) -> Result<Seen> {
        match step {
            Step::Decide => self.decide().await,
            // Cheap: an open breaker collects no logs and posts no restart alert.
            Step::Peek => self.blocked_by_caps(true).await,
            Step::Lock => self.take_lock().await,
            Step::Logs => {
                self.now = self.ctx.coord.time().await?;
                self.logs_and_alert().await
            }
            // Sets `self.now` from its own read.
            Step::Revalidate => self.last_moment_checks().await,
            Step::Observe => {
                self.now = self.ctx.coord.time().await?;
                self.observe_only().await
            }
            Step::Caps => {
                // NB: taken here, immediately before the command, never at the pipeline's
                // start: a pass that stopped earlier must not consume the breaker or the budget.
                self.now = self.ctx.coord.time().await?;
                self.blocked_by_caps(false).await
            }
            Step::Claim => self.hold_lock_and_mark().await,
            // NB: once more right before the command: the increments and marker writes above
            // are round trips, and a person's restart, stop or pause (or a maintenance notice)
            // in that time must stop us. What is left is the window between this inspect and
            // the command.
            Step::Recheck => self.node_and_container_checks().await,
            // NB: after the inspect above, which may take `runtime.call_timeout`: the lock's
            // margin must cover only the command's start, not a slow runtime's answer.
            Step::LockCheck => self.lock_renewed().await,
            Step::Command => {
                self.call = Some(self.command().await);
                Ok(Seen::Pass)
            }
            // The command's two outcomes, each its own answer.
            Step::Verify => {
                let call = self.call.take().unwrap_or(Ok(()));
                self.verify(call).await
            }
            // A gang's steps (`super::gang`): never in a worker's pass.
            Step::Count | Step::Announce => Ok(Seen::Pass),
        }
    }

    /// Give back what a stopped pass holds (best-effort: what fails here expires by its TTL).
    async fn give_back(&self, undo: Undo) {
        if undo.release_alert {
            // The restart alert's dedup key, so that the restart that eventually runs for this
            // incident alerts (with its logs) again.
            let key = self.ctx.keys.alert_dedup(&self.act.inc.id, "restart");
            let _ = self.ctx.coord.del(&[key]).await;
        }
        if undo.release_claim {
            self.release_claim().await;
        }
        if undo.refund_caps {
            // What `caps` took (the breaker's unit, the fleet's) for a restart that will not run.
            self.caps().refund(self.now).await;
        }
    }

    /// Take the node lock. `LockHeld`: another instance holds it and acts.
    async fn take_lock(&mut self) -> Result<Seen> {
        let (key, ttl) = (self.ctx.keys.lock(), self.ctx.cfg.safety.lock_ttl);
        self.lease = Lease::take(self.ctx.coord.as_ref(), key, Lease::random_token(), ttl).await?;
        if self.lease.is_some() {
            return Ok(Seen::Pass);
        }
        let detail = "another instance holds this node's lock; it acts, we skip".to_string();
        self.skip(Skip::LockHeld, detail, true).await
    }

    /// Right before the command, after the recheck's inspect (up to `runtime.call_timeout`, which
    /// `safety.lock_ttl`'s minimum does not count): the lock, still ours, renewed to its full TTL
    /// (compare-and-renew), so it covers the whole restart. `LockExpiring` when it is no longer
    /// ours: nothing will run (the pipeline gives back what the pass holds).
    ///
    /// NB: read, not renewed, it refused every restart of a lock at its TTL's minimum whose
    /// inspect took a few seconds (the simulation's learned seed 24: a hang never restarted).
    pub(super) async fn lock_renewed(&mut self) -> Result<Seen> {
        let Some(lease) = &self.lease else { return Ok(Seen::Skip(Skip::LockExpiring)) };
        if lease.renew(self.ctx.coord.as_ref(), self.ctx.cfg.safety.lock_ttl).await? {
            return Ok(Seen::Pass);
        }
        let detail = "lock lost (expired or taken over) before the command".to_string();
        self.skip(Skip::LockExpiring, detail, false).await
    }

    /// The lock must still be ours, with room for the whole restart (`runtime.restart_timeout`
    /// and [`LOCK_MARGIN`]), at the claim. `LockExpiring` otherwise: nothing will run (the
    /// pipeline gives back what the pass holds).
    pub(super) async fn lock_covers(&mut self) -> Result<Seen> {
        let Some(lease) = &self.lease else { return Ok(Seen::Skip(Skip::LockExpiring)) };
        let needed = self.ctx.cfg.runtime.restart_timeout + LOCK_MARGIN;
        let left = lease.left(self.ctx.coord.as_ref()).await?;
        if crate::coord::lease::covers(left, needed) {
            return Ok(Seen::Pass);
        }
        let detail = match left {
            Some(t) => format!("lock has {} left, {} needed", human(t), human(ms(needed))),
            None => "lock lost (expired or taken over)".into(),
        };
        self.skip(Skip::LockExpiring, detail, false).await
    }
}
