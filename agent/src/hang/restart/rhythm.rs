//! What the restart path learns of a worker's rhythm, and the rules it judges by
//! (`crate::hang::policy_rhythm`): each look at a worker's record teaches its rhythm (a gang
//! member's too: its silences are the collective's), what was learned goes back to the
//! coordinator with the cycle's batch, and the coordinator's copy decides which rule a restart
//! stands on — the worker's own, or, for a gang member, the learned rule its entry in the gang's
//! view carries (`crate::hang::policy_gang::due_on`).

use std::borrow::Cow;

use crate::clock::Millis;
use crate::config::PolicyConfig;
use crate::hang::marks;
use crate::hang::model::{Marks, WorkerStatus};
use crate::hang::policy::Verdict;
use crate::hang::policy_rhythm::{self, Learned, Rhythm};
use crate::runtime::container::Container;

use super::{Case, RestartPath};

/// The rules a worker is judged by: the fixed policy, and what this agent learned of the
/// worker's rhythm. Pure: the same answers for the same reads.
#[derive(Clone, Copy)]
pub(super) struct Judge<'p, 'r> {
    pub(super) policy: &'p PolicyConfig,
    pub(super) rhythm: &'r Rhythm,
}

impl<'p> Judge<'p, '_> {
    /// The policy the worker's own restart is judged by (`policy_rhythm::restart_policy`): the
    /// fixed rule, or the learned one the coordinator's copy of its rhythm (`marks`) allows.
    pub(super) fn restart_rules(
        &self,
        status: Option<&WorkerStatus>,
        marks: &Marks,
        now: Millis,
    ) -> Cow<'p, PolicyConfig> {
        let (shared, own) = (marks.rhythm.as_ref(), self.rhythm.own());
        policy_rhythm::restart_policy(self.policy, shared, own, status, now)
    }

    /// A gang member's learned rule, from the coordinator's copy of its rhythm (`marks`): what
    /// its entry in the gang's view says (`Member::learned`). `None`: not a member, or the fixed
    /// rule.
    pub(super) fn member_rule(
        &self,
        status: Option<&WorkerStatus>,
        marks: &Marks,
        now: Millis,
    ) -> Option<Learned> {
        status.and_then(|s| s.gang.as_ref())?;
        let (shared, own) = (marks.rhythm.as_ref(), self.rhythm.own());
        policy_rhythm::learned_rule(self.policy, shared, own, status, now)
    }

    /// A gang member's learned rule ([`Self::member_rule`]), and whether it is in trouble: its
    /// own agent suspects it, or it is silent past its learned silence (the gang may decide on
    /// that: what its controllers do must be in its entry by then).
    pub(super) fn member_standing(&self, case: &Case<'_>) -> (Option<Learned>, bool) {
        let rule = self.member_rule(case.status, case.marks, case.now);
        let hb = case.status.and_then(|s| s.heartbeat);
        let silent = |r: Learned| hb.is_some_and(|hb| case.now - hb > r.silence);
        let suspected = matches!(case.v, Verdict::Suspect | Verdict::Hung | Verdict::Errored);
        (rule, suspected || rule.is_some_and(silent))
    }

    /// The policy a gang member is judged by within its gang (its entry's silence, and whether
    /// it is silent enough for the gang's turn): its learned rule, else the fixed one.
    pub(super) fn member_rules(
        &self,
        status: Option<&WorkerStatus>,
        marks: &Marks,
        now: Millis,
    ) -> Cow<'p, PolicyConfig> {
        policy_rhythm::by_rule(self.policy, self.member_rule(status, marks, now))
    }
}

impl<'a> RestartPath<'a> {
    /// The rules this worker is judged by, as this agent learned its rhythm so far.
    pub(super) fn judge(&self) -> Judge<'a, '_> {
        Judge { policy: &self.ctx.cfg.policy, rhythm: self.rhythm }
    }

    /// Learn the worker's rhythm from this look at its record (`crate::hang::policy_rhythm`):
    /// the coordinator's copy merged in; with `start_over` (a new incarnation, or our restart
    /// booting) the incarnation's own samples start over (the worker's history stays); what was
    /// learned goes back with the cycle's batch.
    pub(super) fn learn(
        &mut self,
        c: &Container,
        marks: &Marks,
        status: Option<&WorkerStatus>,
        start_over: bool,
        now: Millis,
    ) {
        if !self.ctx.cfg.policy.learned.enabled {
            return;
        }
        self.rhythm.adopt(marks.rhythm.as_ref());
        self.rhythm.see_incarnation(&marks::incarnation(c));
        if start_over {
            self.rhythm.new_incarnation();
        } else {
            self.rhythm.observe(status, now, self.ctx.cfg.policy.learned.min_samples);
        }
        if let Some(v) = self.rhythm.write_due(now) {
            let (key, ttl) = (self.ctx.keys.rhythm(&c.worker), crate::hang::marks::MARK_TTL);
            self.deferred.push(crate::coord::Op::Set { key, value: v, ttl });
        }
    }
}
