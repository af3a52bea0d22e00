//! A member's agent reads its gang at most once per cycle (`GangReads`, kept in the cycle's
//! `GangCycle`), when a member takes its gang step (stale, in error or booting): the gang's
//! state, and every member's entry only by the gang's reader for the poll interval or for a
//! decision (read apart, fresh); the other members on this node read the cycle's copy. The
//! agent that reads every member's entry also removes those of members departed for good.

use crate::coord::Result;
use crate::hang::context::Context;
use crate::hang::model::Gang;
use crate::hang::model_gang::{GangReads, GangState, Member, View};
use crate::hang::policy_gang::Timing;

/// The gang's members with this member as of now, in place of the entry its last batch wrote.
pub(super) fn with_own(members: &mut Vec<Member>, own: &Member) {
    members.retain(|m| m.id() != own.id());
    members.push(own.clone());
}

impl GangReads {
    /// The gang as this agent sees it this cycle: its state (one round trip), and — when this
    /// agent is the gang's reader for this poll interval, or `fresh` (a decision) — every member's
    /// entry (one more); this member's own entry as of now in place of the one its last batch
    /// wrote. Read once per cycle.
    ///
    /// NB: while a gang of 1,000 nodes hangs, every member is suspect: each reading the whole
    /// view (8,000 entries, 2 MB) every cycle cost Redis a quarter of a core and 14 ms at p99
    /// (bench-fleet, `gang`); one reader per poll interval costs what a healthy gang does.
    pub(super) async fn read(
        &mut self,
        ctx: &Context,
        g: &Gang,
        own: &Member,
        fresh: bool,
    ) -> Result<View> {
        if let Some(mut v) = self.views.get(&g.id).filter(|_| !fresh).cloned() {
            with_own(&mut v.members, own);
            return Ok(v);
        }
        let (coord, keys) = (ctx.coord.as_ref(), &ctx.keys);
        let state = crate::hang::gang_marks::read_state(coord, keys, &g.id).await?;
        match &state.fruitless {
            Some(run) => self.runs.insert(g.id.clone(), run.clone()),
            None => self.runs.remove(&g.id),
        };
        let reader = fresh
            || coord.set_nx(&keys.gang_reader(&g.id), keys.node(), ctx.cfg.poll_interval).await?;
        // NB: entries unwritten for twice `gone_after` go: every reader has ignored them for
        // `gone_after` already (`gp::present`, the pace kept), so none still counts them a
        // member. `own.at` is this cycle's clock: its entry is stamped with it.
        let prune = own.at - 2 * Timing::of(&ctx.cfg).gone_after;
        let mut members = match reader {
            true => {
                crate::hang::gang_marks::read_view(coord, keys, &g.id, g.size, Some(prune)).await?
            }
            false => Vec::new(),
        };
        with_own(&mut members, own);
        let view = View { members, state, full: reader };
        self.views.insert(g.id.clone(), view.clone());
        Ok(view)
    }

    /// The gang's state as this agent changed it (an incident opened or closed, a decision
    /// taken), for the members it evaluates after this one in the cycle.
    pub(super) fn remember(&mut self, g: &Gang, state: &GangState) {
        if let Some(v) = self.views.get_mut(&g.id) {
            v.state = state.clone();
        }
    }
}
