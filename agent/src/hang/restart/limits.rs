//! The restart caps as the restart path meets them: the node's breaker and the fleet's budget
//! (taken through `crate::coord::caps`), and the alerts and trail entries when one refuses.

use crate::clock::Millis;
use crate::coord::caps::{breaker_day, Allowance, Caps};
use crate::coord::CoordError;

use super::pipeline::Pipeline;
use super::{Act, Skip};

impl Pipeline<'_> {
    /// The caps a pass takes: the node's breaker and the fleet budget — for a gang member's
    /// restart the breaker only (the gang took the fleet unit for all its members).
    pub(super) fn caps<'s>(&'s self, act: &'s Act<'_>) -> Caps<'s> {
        Caps {
            fleet: act.mandate.decided_here(),
            ..Caps::node(self.ctx.coord.as_ref(), &self.ctx.keys, &self.ctx.cfg.safety)
        }
    }

    /// The breaker, then the fleet budget (`crate::coord::caps::Caps::take`: both units or
    /// none). With `peek` (or in observe mode) only reads them.
    pub(super) async fn blocked_by_caps(
        &mut self,
        act: &Act<'_>,
        now: Millis,
        peek: bool,
    ) -> Result<Option<Skip>, CoordError> {
        let caps = self.caps(act);
        let said = match peek || self.ctx.cfg.dry_run {
            true => caps.look(now).await?,
            false => caps.take(now).await?,
        };
        match said {
            Allowance::Granted => Ok(None),
            Allowance::BreakerOpen => {
                self.breaker_open(act, now).await?;
                Ok(Some(Skip::BreakerOpen))
            }
            Allowance::BudgetExhausted => {
                self.budget_exhausted(act, now).await?;
                Ok(Some(Skip::BudgetExhausted))
            }
        }
    }

    pub(super) async fn breaker_open(
        &mut self,
        act: &Act<'_>,
        now: Millis,
    ) -> Result<(), CoordError> {
        let per_day = self.ctx.cfg.safety.breaker_per_day;
        let day = breaker_day(now);
        self.pager.page_breaker_open(act, &day, now).await?;
        let detail = format!("breaker open: {per_day} restarts used today ({day})");
        self.skip(now, act, Skip::BreakerOpen, detail, true).await
    }

    pub(super) async fn budget_exhausted(
        &mut self,
        act: &Act<'_>,
        now: Millis,
    ) -> Result<(), CoordError> {
        let s = &self.ctx.cfg.safety;
        let (budget, window) = (s.fleet_budget, s.fleet_window);
        self.pager.page_budget_exhausted(act, now).await?;
        let detail = format!(
            "fleet budget of {budget} per {} exhausted",
            humantime::format_duration(window)
        );
        self.skip(now, act, Skip::BudgetExhausted, detail, true).await
    }

    /// Give back one breaker and one fleet unit taken for a restart that will not run.
    pub(super) async fn refund_caps(&self, act: &Act<'_>, now: Millis) {
        self.caps(act).refund(now).await;
    }
}
