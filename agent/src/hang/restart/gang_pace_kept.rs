//! What a gang's pace keeps beyond one agent (issue 45, fail-slow; `gang.pace`): the pace an
//! agent learned, in its member's entry, so that the agent that watches the member next (this
//! one restarted, or the worker newly on this node) goes on from it — one restarted in a slow run
//! would otherwise learn the slow pace as the usual one; and the slow episode's lease, which its
//! opener renews (compare-and-renew) while its member is measured, so that an episode whose
//! opener is gone lapses and a gang still slow opens the next, and an opener restarted takes its
//! episode back instead of leaving it to lapse.

use crate::clock::{ms, Millis};
use crate::coord::Result;
use crate::hang::model::Gang;
use crate::hang::model_gang::{member_id, Member, SlowOpened};
use crate::hang::model_slow::{lease, opened_of, opener_of, placed_at, rates_of, settled};
use crate::hang::model_slow::{since_of, MOST};
use crate::hang::policy_gang::{self as gp, Timing};

use super::gang_pace::PaceWatch;

impl PaceWatch<'_> {
    /// Once, as this agent starts watching `worker` of gang `g` (`jsu`: its JobSet's uid, when
    /// its pod says): the pace its entry keeps, and the episode it opened. False when the
    /// coordinator did not answer: the member's entry must not be written this cycle (it would
    /// write over the kept pace with nothing).
    pub(super) async fn resume(
        &mut self,
        g: &Gang,
        worker: &str,
        jsu: Option<&str>,
        now: Millis,
    ) -> bool {
        let cfg = self.ctx.cfg.gang.pace.clone();
        if !cfg.enabled {
            return true;
        }
        self.pace.follow(&g.id);
        if self.pace.resumed {
            return true;
        }
        let node = self.ctx.keys.node();
        let own = member_id(node, worker);
        let key = self.ctx.keys.gang_members(&g.id, gp::shard_of(node, gp::shards(g.size)));
        let Ok(entry) = self.ctx.coord.hget(&key, &own).await.map_err(|e| {
            tracing::warn!(worker, error = %e, "the pace kept in the gang's view could not be read; the member's entry waits for it");
        }) else {
            return false;
        };
        // The pace the member's entry keeps, when it is the same job's: an entry written within
        // `gone_after` (an older one is a departed worker's) of the same JobSet, when both say.
        let gone_after = Timing::of(&self.ctx.cfg).gone_after;
        let kept = entry
            .and_then(|json| serde_json::from_str::<Member>(&json).ok())
            .filter(|m| now - m.at <= gone_after)
            .filter(|m| jsu.zip(m.jobset_uid.as_deref()).is_none_or(|(a, b)| a == b))
            .and_then(|m| m.pace);
        self.pace.resume(kept, &cfg);
        // NB: an opener restarted takes its episode back whatever its member's pace now: back
        // at it, the episode ends here (`slow-over`) instead of lapsing unsaid.
        if let Err(e) = self.take_back(g, &own, now).await {
            tracing::warn!(worker, error = %e, "a slow episode this member opened could not be taken back; it lapses with its lease");
        }
        true
    }

    /// The gang's open episode, when this member's agent opened it: followed from here on (its
    /// lease renewed, its end said here, its page sent if it never was). One only half opened
    /// (not yet named, so never paged) is removed: the member still slow opens it again, and
    /// pages.
    pub(super) async fn take_back(&mut self, g: &Gang, own: &str, now: Millis) -> Result<()> {
        let key = self.ctx.keys.gang_slow(&g.id);
        let ours = |v: &String| opener_of(v) == Some(own) && !self.slow.contains_key(&g.id);
        let Some(value) = self.ctx.coord.get(&key).await?.filter(ours) else { return Ok(()) };
        if !settled(&value) {
            return self.ctx.coord.del_if_owner(&key, &value).await.map(drop);
        }
        let Some((node, worker)) = placed_at(&value) else { return Ok(()) };
        if self.ctx.coord.renew_if_owner(&key, &value, lease(&self.ctx.cfg.gang.pace)).await? {
            let opened = SlowOpened { value, node, worker, renewed: now, paged: false };
            // NB: its page is owed until this agent measures the member slow (`follow_episode`):
            // not one sent late for a gang back at its pace while the agent was away.
            self.slow.insert(g.id.clone(), opened);
        }
        Ok(())
    }

    /// The opener, as it reads its episode (`held`: the key's value now): still its own, its
    /// lease renewed once a fifth of it passed while its member is measured (a member held,
    /// idle or hung keeps no episode open), for at most a day from its opening, and its page
    /// sent if it is owed and the member measured `slow` now; ended otherwise (lapsed, or
    /// removed by a person): the alert it sent is resolved.
    pub(super) async fn follow_episode(
        &mut self,
        g: &Gang,
        held: Option<&str>,
        slow: bool,
        now: Millis,
    ) -> Result<()> {
        let Some(o) = self.slow.get(&g.id).cloned() else { return Ok(()) };
        if held != Some(o.value.as_str()) {
            self.slow.remove(&g.id);
            let end = crate::alerts::Resolve::Episode(crate::alerts::AlertKind::Slow);
            self.ctx.notifier.resolve(&o.node, &o.worker, end).await;
            return Ok(());
        }
        let lease = lease(&self.ctx.cfg.gang.pace);
        // NB: the page's claim lives a day (`MARK_TTL`), as an episode is renewed: one older than
        // that may have been paged under a claim gone since, and lapses soon.
        let young = opened_of(&o.value).is_some_and(|at| now - at < MOST);
        if now - o.renewed >= ms(lease) / 5 && young && self.pace.rate.is_some() {
            let key = self.ctx.keys.gang_slow(&g.id);
            // NB: compare-and-renew: a lease that lapsed meanwhile is the next opener's.
            let renewed = self.ctx.coord.renew_if_owner(&key, &o.value, lease).await?;
            if let Some(e) = self.slow.get_mut(&g.id).filter(|_| renewed) {
                e.renewed = now;
            }
        }
        if !slow || o.paged {
            return Ok(());
        }
        // NB: the page not gone out from this process: after its opener took it back (an opener
        // that died between naming it and claiming the page left it unpaged), or after its claim
        // got no answer. The page's claim says whether it went: a page already sent is not sent
        // again (at least once, as every page: an opener that died after sending but before its
        // cycle settled the claim, back after the claim's lease, pages again). It is rebuilt
        // from what the episode's value says (its run, its rates, the member named and why).
        let at = Member::working(&o.node, &o.worker, now);
        if let (Some(since), Some(rates), true) = (since_of(&o.value), rates_of(&o.value), young) {
            return self.page_slow(g, &[], (&o.value, &at), (since, rates.0, rates.1), now).await;
        }
        self.paged(g);
        Ok(())
    }
}
