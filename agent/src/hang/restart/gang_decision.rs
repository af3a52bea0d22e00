//! A gang's one restart decision, as steps of the restart pipeline's state machine
//! (`crate::hang::policy_pipeline`, [`Unit::Gang`]): under the gang's lock, from a fresh view
//! (revalidate: the incident still the one seen, not decided yet, still hung, restarts so far
//! that helped, every member able to take part), one unit of the gang's breaker and of the fleet
//! budget (caps), one more in the gang's run of fruitless restarts (count), the decision itself
//! (claim: SET NX, the first agent's stands), then the `restarting` page (announce). What a stop
//! gives back is the state machine's answer, as for a worker's pass. Each member's restart is
//! then its own node's worker pass (`super::gang`, `super::pipeline`).

use crate::clock::{utc_day, Millis};
use crate::coord::caps::{Allowance, Breaker, Caps};
use crate::coord::lease::Lease;
use crate::coord::Result;
use crate::hang::context::Context;
use crate::hang::journal::Journal;
use crate::hang::marks::{FRUITLESS_TTL, MARK_TTL};
use crate::hang::model::{Fruitless, Gang, Incident};
use crate::hang::model_gang::{Decision, GangReads, GangState, Member};
use crate::hang::policy::Cancel;
use crate::hang::policy_fruitless::{self, Beat, RunOf};
use crate::hang::policy_gang::{self as gp, Timing};
use crate::hang::policy_pipeline::{first, next, Next, Seen, Skip, Step, Unit};

use super::pager::Pager;
use super::Case;

/// A gang's decision, for one pass: the gang, the member whose agent decides (its case, for the
/// trail) and the incident the decision was planned on, and what it takes of the worker's
/// evaluation — the context, the pager, the trail and the gang's reads — and nothing else.
pub(super) struct GangDecider<'a> {
    pub(super) ctx: &'a Context,
    pub(super) pager: Pager<'a>,
    pub(super) journal: &'a mut Journal,
    pub(super) reads: &'a mut GangReads,
    pub(super) case: &'a Case<'a>,
    pub(super) g: &'a Gang,
    /// This worker's member.
    pub(super) own: &'a Member,
    /// The incident its agent planned the decision on.
    pub(super) planned: Option<&'a Incident>,
}

/// What a gang's decision carries from one step to the next.
struct GangPass {
    /// The coordinator's clock as the fresh view read it.
    now: Millis,
    /// The fresh view, from `Revalidate` on.
    fresh: Option<Fresh>,
    /// The decision that stands: ours from `Claim`, or another agent's found on the way; or the
    /// read of it that failed after the claim was lost: the pass's error once the units are back.
    decision: Result<Option<Decision>>,
}

/// The gang as `Revalidate` read it under the lock.
struct Fresh {
    inc: Incident,
    /// The members present.
    members: Vec<Member>,
    /// The gang's run of fruitless restarts.
    run: Option<Fruitless>,
}

impl GangDecider<'_> {
    /// The gang's one decision: the steps of [`Unit::Gang`] in one loop, what a stop gives back
    /// given back, the gang's lock released whatever happened. `None`: no decision (another
    /// agent holds the lock, a blocker, a cap, the incident over).
    pub(super) async fn decide(&mut self, now: Millis) -> Result<Option<Decision>> {
        let mut pass = GangPass { now, fresh: None, decision: Ok(None) };
        let (mut lease, mut step) = (None, first(Unit::Gang));
        let result = loop {
            let ran = match step {
                Step::Lock => self.take_gang_lock(&mut lease).await,
                _ => self.gang_step(step, &mut pass).await,
            };
            let seen = ran.as_ref().map_or(Seen::Failed, |s| *s);
            match next(Unit::Gang, step, seen, self.ctx.cfg.dry_run) {
                Next::Go(s) => step = s,
                Next::Stop(undo) => {
                    // Observe mode took nothing.
                    if undo.refund_caps && !self.ctx.cfg.dry_run {
                        self.gang_caps().refund(pass.now).await;
                    }
                    // A step's own error first, then a failed read of the decision that
                    // stands, then the decision.
                    break ran.and(pass.decision);
                }
            }
        };
        if let Some(lease) = lease {
            if let Err(e) = lease.release(self.ctx.coord.as_ref()).await {
                tracing::warn!(error = %e, gang = %self.g.id, "could not release the gang lock; it expires by its TTL");
            }
        }
        result
    }

    async fn take_gang_lock(&mut self, lease: &mut Option<Lease>) -> Result<Seen> {
        let (key, ttl) = (self.ctx.keys.gang_lock(&self.g.id), self.ctx.cfg.safety.lock_ttl);
        *lease = Lease::take(self.ctx.coord.as_ref(), key, Lease::random_token(), ttl).await?;
        Ok(lease.as_ref().map_or(Seen::Skip(Skip::LockHeld), |_| Seen::Pass))
    }

    /// One step of the decision after the lock.
    async fn gang_step(&mut self, step: Step, pass: &mut GangPass) -> Result<Seen> {
        if step == Step::Revalidate {
            return self.revalidate_gang(pass).await;
        }
        let Some(f) = pass.fresh.as_ref() else {
            return Ok(Seen::Skip(Skip::Cancelled(Cancel::Recovered)));
        };
        let now = pass.now;
        match step {
            // Observe mode takes no unit and counts nothing (it restarts nobody).
            Step::Caps | Step::Count if self.ctx.cfg.dry_run => Ok(Seen::Pass),
            Step::Caps => self.take_gang_caps_or_refuse(f, now).await,
            Step::Count => self.count_gang_fruitless(f, now).await,
            Step::Claim => {
                let only = gp::one_for_all(&f.members, now).map(|m| m.id());
                let ours = Decision { decided: now, incident: f.inc.id.clone(), only };
                if self.claimed(&ours).await? {
                    pass.decision = Ok(Some(ours));
                    return Ok(Seen::Pass);
                }
                // NB: lost to another agent's decision: the units go back (the run keeps our
                // count, see `count_gang_fruitless`), whether or not the one that stands can be
                // read now.
                pass.decision = self.standing_decision().await;
                Ok(Seen::Skip(Skip::Decided))
            }
            // The `restarting` page of the decision that stands (ours, from `Claim`).
            Step::Announce => {
                if let Ok(Some(d)) = &pass.decision {
                    self.announce_decision((&f.inc, d), &f.members, now).await?;
                }
                Ok(Seen::Pass)
            }
            // The worker's steps are never a gang's.
            _ => Ok(Seen::Skip(Skip::NotRestartable)),
        }
    }

    /// The gang again, under its lock and with a fresh clock: the incident still the one the
    /// decision was planned on and not decided yet (another agent's decision is adopted), a
    /// stale decision of a closed incident removed, still hung, restarts so far that helped,
    /// every member able to take part. A refusal pages once.
    async fn revalidate_gang(&mut self, pass: &mut GangPass) -> Result<Seen> {
        let (g, t) = (self.g, Timing::of(&self.ctx.cfg));
        let fresh = self.reads.read(self.ctx, g, self.own, true).await?;
        let now = self.ctx.coord.time().await?.max(pass.now);
        pass.now = now;
        let (members, state) = (gp::present(&fresh.members, now, &t), fresh.state);
        let Some(inc) = state.incident.clone().filter(|i| Some(i) == self.planned) else {
            return Ok(Seen::Skip(Skip::Cancelled(Cancel::Recovered)));
        };
        if let Some(decided) = state.current_decision() {
            pass.decision = Ok(Some(decided.clone()));
            return Ok(Seen::Skip(Skip::Decided));
        }
        if let Some(old) = state.decision.as_ref() {
            // A decision of another (closed) incident whose removal failed: incident ids are
            // unique, so it is stale; under the gang lock, removed (compare-and-delete).
            self.ctx.coord.del_if_owner(&self.ctx.keys.gang_decision(&g.id), &old.encode()).await?;
        }
        if !gp::decidable(inc.started, &members, now, &t) {
            return Ok(Seen::Skip(Skip::Cancelled(Cancel::Recovered)));
        }
        // NB: before the blockers: restarts that do not help is the standing finding, a missing
        // member or a spent breaker a passing one.
        let (run, beats) = (state.fruitless.as_ref(), Beat::of_members(&members));
        if let Some(refusing) = policy_fruitless::refusal(run, &beats, t.max_fruitless) {
            let r = (Skip::Fruitless, policy_fruitless::describe(refusing, RunOf::Gang(&g.id)));
            return self.refuse(&inc, &members, r, now).await;
        }
        if let Some(who) = gp::starting(&members) {
            tracing::debug!(gang = %g.id, "the gang's decision waits for the first reads of {who}'s agent");
            return Ok(Seen::Skip(Skip::Blocked));
        }
        let why = gp::blockers(&members, g.size, now, &t);
        if !why.is_empty() {
            return self.refuse(&inc, &members, (Skip::Blocked, blocked(g, &why)), now).await;
        }
        pass.fresh = Some(Fresh { inc, members, run: state.fruitless });
        Ok(Seen::Pass)
    }

    /// Whether our decision stands: its SET NX won (the first agent's wins), or — a write that
    /// got no answer may have landed, and a decision that stands is every member's to carry
    /// out, so it is never taken back — the store has it. Not there (or another's): lost, the
    /// units go back. A read that fails too is the write's error: the units stay taken (fewer
    /// restarts, never more).
    async fn claimed(&self, ours: &Decision) -> Result<bool> {
        let dkey = self.ctx.keys.gang_decision(&self.g.id);
        match self.ctx.coord.set_nx(&dkey, &ours.encode(), MARK_TTL).await {
            Err(e) => {
                self.standing_decision().await.map(|s| s.as_ref() == Some(ours)).map_err(|_| e)
            }
            won => won,
        }
    }

    /// The decision that stands for the gang's open incident, as the store has it now.
    async fn standing_decision(&self) -> Result<Option<Decision>> {
        let id = &self.g.id;
        let keys = [self.ctx.keys.gang_incident(id), self.ctx.keys.gang_decision(id)];
        Ok(GangState::decode(&self.ctx.coord.get_many(&keys).await?).current_decision().cloned())
    }

    /// The gang's caps: its own breaker (`gang.breaker_per_day`) and the fleet budget, through
    /// the one owner of the caps (`crate::coord::caps`), as a worker's are.
    fn gang_caps(&self) -> Caps<'_> {
        Caps {
            breaker: Breaker::Gang { id: &self.g.id, per_day: self.ctx.cfg.gang.breaker_per_day },
            ..Caps::node(self.ctx.coord.as_ref(), &self.ctx.keys, &self.ctx.cfg.safety)
        }
    }

    /// One unit of the gang's breaker for the day, then one of the fleet budget (the breaker's
    /// given back when the budget refuses or does not answer: `Caps::take`). Refused: the
    /// decision is refused as blocked — its page sent and its trail entry written (`refuse`).
    /// Never in observe mode (`gang_step`).
    async fn take_gang_caps_or_refuse(&mut self, f: &Fresh, now: Millis) -> Result<Seen> {
        // NB: both units or none (`Caps::take`), as for a worker's restart.
        let refused = match self.gang_caps().take(now).await? {
            Allowance::Granted => return Ok(Seen::Pass),
            Allowance::BreakerOpen => {
                let (per_day, day) = (self.ctx.cfg.gang.breaker_per_day, utc_day(now));
                format!("the gang's breaker is open: {per_day} gang restart(s) already today (UTC {day}, gang.breaker_per_day)")
            }
            Allowance::BudgetExhausted => {
                let safety = &self.ctx.cfg.safety;
                let budget = safety.fleet_budget;
                let every = humantime::format_duration(safety.fleet_window);
                format!("the fleet restart budget is exhausted ({budget} per {every})")
            }
        };
        self.refuse(&f.inc, &f.members, (Skip::Blocked, blocked(self.g, &[refused])), now).await
    }

    /// The decision at `now` is one more restart of every member in the gang's run (a run that
    /// progressed starts over). Never in observe mode, which restarts nobody (`gang_step`). The
    /// step passes unless the write fails.
    ///
    /// NB: never given back. Should our decision's SET NX lose, the one that stands was taken
    /// without the lock (its lease expired, a failover forgot it) and counted itself in the run
    /// we read: writing the old run back would erase its count. One too many refuses one
    /// restart early; one too few lets one more through.
    async fn count_gang_fruitless(&mut self, f: &Fresh, now: Millis) -> Result<Seen> {
        let beats = Beat::of_members(&f.members);
        let run = policy_fruitless::after_restart(f.run.as_ref(), &beats, now);
        let key = self.ctx.keys.gang_fruitless(&self.g.id);
        self.ctx.coord.set(&key, &run.encode(), FRUITLESS_TTL).await?;
        self.reads.runs.insert(self.g.id.clone(), run);
        Ok(Seen::Pass)
    }
}

/// Why nobody is restarted, as the `gang-blocked` page and the trail say it (one page per gang
/// incident naming every blocking member and why).
fn blocked(g: &Gang, why: &[String]) -> String {
    let (gang, why) = (&g.id, why.join("; "));
    format!("gang {gang} is hung but cannot be restarted as a whole, so no member is restarted (a partial restart breaks the job's rendezvous): {why}")
}
