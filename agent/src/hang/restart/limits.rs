//! The restart caps as the restart path meets them: the node's breaker and the fleet's budget
//! (taken through `crate::coord::caps`), and the alerts (node-wide: no worker) and trail entries
//! when one refuses.

use crate::alerts::AlertKind;
use crate::clock::utc_day;
use crate::coord::caps::{fleet_window, Allowance, Caps, BREAKER_TTL};
use crate::coord::Result;
use crate::hang::policy_pipeline::{Seen, Unit};

use super::pipeline::Pipeline;
use super::Skip;

impl Pipeline<'_> {
    /// The caps a pass takes: the node's breaker and the fleet budget — for a gang member's
    /// restart the breaker only (the gang took the fleet unit for all its members).
    pub(super) fn caps(&self) -> Caps<'_> {
        Caps {
            fleet: self.act.order.is_none(),
            ..Caps::node(self.ctx.coord.as_ref(), &self.ctx.keys, &self.ctx.cfg.safety)
        }
    }

    /// The breaker, then the fleet budget (`crate::coord::caps::Caps::take`: both units or
    /// none). With `peek` (or in observe mode) only reads them.
    pub(super) async fn blocked_by_caps(&mut self, peek: bool) -> Result<Seen> {
        let (now, caps) = (self.now, self.caps());
        let said = match peek || self.ctx.cfg.dry_run {
            true => caps.look(now).await?,
            false => caps.take(now).await?,
        };
        let s = &self.ctx.cfg.safety;
        // The page (under `key`, for `ttl`), and what the trail says.
        let (kind, skip, page, key, ttl, detail) = match said {
            Allowance::Granted => return Ok(Seen::Pass),
            Allowance::BreakerOpen => {
                let (per_day, day) = (s.breaker_per_day, utc_day(now));
                // The page: one a day.
                let page = format!("circuit breaker open: {per_day} restart(s) already on this node today (UTC {day}); automation stopped, alert only until tomorrow");
                let key = self.ctx.keys.breaker_alert(&day);
                let detail = format!("breaker open: {per_day} restarts used today ({day})");
                (AlertKind::BreakerOpen, Skip::BreakerOpen, page, key, BREAKER_TTL, detail)
            }
            Allowance::BudgetExhausted => {
                let (budget, window) = (s.fleet_budget, s.fleet_window);
                let every = humantime::format_duration(window);
                // The page: one a window.
                let page = format!("fleet restart budget exhausted: {budget} restart(s) across the fleet in this {every} window; no restart anywhere until it ends (a systemic cause is likely)");
                let key = self.ctx.keys.fleet_budget_alert(fleet_window(now, window));
                let detail = format!("fleet budget of {budget} per {every} exhausted");
                (AlertKind::BudgetExhausted, Skip::BudgetExhausted, page, key, window * 2, detail)
            }
        };
        // NB: node-wide (docs/alerts.md): the cap refuses every worker of the node (the budget,
        // of the fleet), not this one. Placed at this worker, its incident's end would resolve
        // it in the sinks that keep alerts open while the cap still refuses the others, whose
        // refusals the spent page key keeps silent; and it would carry this job's gang.
        let alert = self.pager.node_alert(kind, page);
        self.pager.page_once(&key, ttl, alert, Unit::Worker, now).await?;
        self.skip(skip, detail, true).await
    }
}
