//! A gang's pace at work (issue 45, fail-slow; `gang.pace`): each member's agent measures its
//! own member's pace every cycle (`crate::hang::policy_pace`: in a synchronous collective every
//! rank runs at the gang's pace). A member found slow asks once per run to open the gang's slow
//! episode (one SET NX); the agent that opens it reads the gang's view once, names the member
//! the evidence points to, and pages `slow` once. That agent — the opener — ends the episode
//! when its own member is back at its pace (compare-and-delete, then a quiet mark for
//! `slow_for` so that members a window behind do not open it again at once), resolves the alert
//! it sent and says `slow-over` once. Never a restart, and no other mark of the gang's is
//! touched. The opener renews the episode's lease (its key's TTL) as it reads it: an opener
//! restarted takes its episode back at its next slow look, and an episode whose opener is gone
//! lapses, so that a gang still slow opens another. The learned pace is kept in the member's
//! entry, and an agent restarted goes on from it.

use std::collections::BTreeMap;

use crate::alerts::{AlertKind, Resolve};
use crate::clock::{human, ms, Millis};
use crate::config::PaceConfig;
use crate::coord::Result;
use crate::hang::context::Context;
use crate::hang::gang_marks;
use crate::hang::marks::MARK_TTL;
use crate::hang::model::{Gang, WorkerState};
use crate::hang::model_gang::{Member, SlowOpened};
use crate::hang::model_slow::{claim_id, episode, lease, opener_of, rates_of, settled};
use crate::hang::model_slow::{since_of, why_of, QUIET};
use crate::hang::policy::Verdict;
use crate::hang::policy_fruitless::position;
use crate::hang::policy_gang::{present, Timing};
use crate::hang::policy_pace::{suspect_scored, Look, Pace, PaceVerdict, STRONG};
use crate::hang::policy_pipeline::Unit;
use crate::vocab::node::Named;

use super::pager::Pager;
use super::{Case, RestartPath};

/// A gang member's pace at work, for one cycle: what it takes of the worker's evaluation — the
/// context, the pager, what this agent learned of the member's pace, and the slow episodes it
/// opened (`GangCycle::slow`) — and nothing else.
pub(super) struct PaceWatch<'a> {
    pub(super) ctx: &'a Context,
    pub(super) pager: Pager<'a>,
    pub(super) pace: &'a mut Pace,
    pub(super) slow: &'a mut BTreeMap<String, SlowOpened>,
    /// This node shows a slowdown its workload cannot cause (`RestartPath::machine_slow`).
    pub(super) machine_slow: bool,
}

impl RestartPath<'_> {
    /// The member's pace watch for this cycle.
    pub(super) fn pace_watch(&mut self) -> PaceWatch<'_> {
        let pager = Pager::new(self.ctx, self.alerts, &mut self.gangs.sent);
        let machine_slow = self.machine_slow;
        PaceWatch {
            ctx: self.ctx,
            pager,
            pace: self.pace,
            slow: &mut self.gangs.slow,
            machine_slow,
        }
    }
}

/// The episode `value` of gang `gang` names `own` as the member it waits for: what the Node's
/// `VigilSlow` condition says (how slow, which worker, why) and whether the evidence is strong
/// enough to evict (`NoExecute`): it scored [`STRONG`] and this node shows a slowdown its
/// workload cannot cause now (`machine`). NB: compute time and steps are the job's own word (its
/// records), and a kernel's bad access (an XID 31), its clocks or the host's pressure its own
/// doing: alone they would let a tenant evict another namespace's pods from a shared node.
fn named_here(value: &str, gang: &str, own: &Member, machine: bool) -> Option<Named> {
    let mut parts = value.splitn(4, '|');
    if parts.nth(1)? != own.id() {
        return None;
    }
    let points: u32 = parts.next()?.parse().ok()?;
    let why = parts.next().unwrap_or("");
    let (rate, base) = rates_of(value)?;
    let pct = if base > 0.0 { 100.0 * rate / base } else { 0.0 };
    let (pace, worker) = (against(rate, base), &own.worker);
    let line = format!(
        "gang {gang} runs at {pace} ({pct:.0} %) and waits for {worker} on this node: {why}"
    );
    Some(Named { line, strong: points >= STRONG && machine })
}

/// The rate against the baseline in words: `0.82 steps/s against its usual 1.64 steps/s`.
fn against(rate: f64, base: f64) -> String {
    format!("{rate:.2} steps/s against its usual {base:.2} steps/s")
}

/// This cycle's look at the member's pace: its step at its heartbeat (`None` without either).
/// NB: a window teaches nothing while the worker announced a long operation, left
/// `processing`, is not healthy by its own verdict, its node stands down, or its container is
/// warming up (compile, a restart's warm-up).
fn look_at(case: &Case<'_>, own: &Member, cfg: &PaceConfig) -> Option<Look> {
    let s = case.status?;
    let warming = case.c.started_ms().is_some_and(|st| case.now - st < ms(cfg.warmup));
    let held = s.grace.is_some()
        || s.state != WorkerState::Processing
        || case.v != Verdict::Healthy
        || own.stand_down.is_some()
        || warming;
    Some(Look { hb: s.heartbeat?, step: position(Some(s))?, held })
}

impl PaceWatch<'_> {
    /// This gang member's pace, measured and exported (with the time a slow run loses); the
    /// gang's slow episode opened, or — by its opener — ended.
    pub(super) async fn look(&mut self, case: &Case<'_>, own: &Member) -> Result<()> {
        let (cfg, now) = (self.ctx.cfg.gang.pace.clone(), case.now);
        // NB: pace off (a reload may turn it off) or no gang: nothing of an episode is its.
        let Some(g) = case.gang().filter(|_| cfg.enabled) else {
            self.pace.forget_episode();
            self.ctx.metrics.pace.forget(&case.c.worker);
            return Ok(());
        };
        // NB: the pace its entry keeps was taken (`PaceWatch::resume`) before the entry was written.
        self.pace.follow(&g.id);
        self.pace.observe(look_at(case, own, &cfg), &cfg);
        let verdict = self.pace.verdict(now, &cfg);
        let (rate, base) = (self.pace.rate, self.pace.baseline);
        let slow = matches!(verdict, PaceVerdict::Slow { .. });
        self.ctx.metrics.pace.observe(&case.c.worker, &g.id, rate, base, slow);
        self.ctx.metrics.lost.add("slow", self.pace.deficit(verdict, now), now);
        match verdict {
            PaceVerdict::Slow { since, rate, baseline } => {
                self.slow_began(g, own, (since, rate, baseline), now).await
            }
            PaceVerdict::Recovered { rate, baseline } => {
                self.slow_ended(g, rate, baseline, now).await
            }
            _ => self.at_pace(g, own, now).await,
        }
    }

    /// Not slow now (learning, steady, held): an episode this agent opened that ended elsewhere
    /// is resolved. NB: a hold, a missing heartbeat or a window between the slow and the
    /// recovery line is no end: while the episode still names this worker, it still does (read
    /// once a cycle), until its member is back at its pace or the episode ends.
    async fn at_pace(&mut self, g: &Gang, own: &Member, now: Millis) -> Result<()> {
        (self.pace.episode_seen, self.pace.heard) = (false, false);
        if !self.slow.contains_key(&g.id) && self.pace.named.is_none() {
            return Ok(());
        }
        let held = self.ctx.coord.get(&self.ctx.keys.gang_slow(&g.id)).await?;
        if self.pace.named.is_some() {
            self.hear_episode(g, own, held.as_deref());
        }
        self.follow_episode(g, held.as_deref(), false, now).await
    }

    /// Open the gang's slow episode (asked once per slow run; one SET NX for the gang), name its
    /// member from the gang's view (read once, by the opener only), page `slow` once.
    async fn slow_began(
        &mut self,
        g: &Gang,
        own: &Member,
        (since, rate, baseline): (Millis, f64, f64),
        now: Millis,
    ) -> Result<()> {
        let (key, lease) = (self.ctx.keys.gang_slow(&g.id), lease(&self.ctx.cfg.gang.pace));
        // NB: asked again once half the lease passed: an episode whose opener is gone lapses,
        // and a run that goes on opens the next.
        if self.pace.episode_seen && now - self.pace.asked >= ms(lease) / 2 {
            (self.pace.episode_seen, self.pace.heard) = (false, false);
        }
        // NB: once the episode is seen, one read a cycle while the run lasts, until it names
        // someone else: the member it names shows it on its Node (`VigilSlow`), whichever agent
        // opened it, and the opener follows its end.
        if self.pace.episode_seen {
            if self.pace.heard && !self.slow.contains_key(&g.id) {
                return Ok(());
            }
            let held = self.ctx.coord.get(&key).await?;
            self.hear_episode(g, own, held.as_deref());
            return self.follow_episode(g, held.as_deref(), true, now).await;
        }
        self.pace.asked = now;
        let placeholder = episode(since, (rate, baseline), (&own.id(), now), "?");
        if !self.ctx.coord.set_nx(&key, &placeholder, lease).await? {
            // Open (asked no more this run), or just ended: asked again once the quiet ends.
            let held = self.ctx.coord.get(&key).await?;
            self.pace.episode_seen = held.as_deref() != Some(QUIET);
            self.hear_episode(g, own, held.as_deref());
            // NB: ours, and not followed: its naming write got no answer but landed.
            if held.as_deref().and_then(opener_of) == Some(own.id().as_str()) {
                self.take_back(g, &own.id(), now).await?;
            }
            return Ok(());
        }
        self.pace.episode_seen = true;
        let opened = self.open_slow(g, own, (since, rate, baseline), now).await;
        if opened.is_err() && !self.slow.contains_key(&g.id) {
            // NB: our placeholder, left half open by a read or write that failed, would hold
            // every member off until its lease lapses: removed (best-effort), asked again.
            let _ = self.ctx.coord.del_if_owner(&key, &placeholder).await;
            self.pace.episode_seen = false;
        }
        opened
    }

    /// This agent opened the episode: name its member from the gang's view (read once), write
    /// it into the episode, page `slow` once.
    async fn open_slow(
        &mut self,
        g: &Gang,
        own: &Member,
        (since, rate, baseline): (Millis, f64, f64),
        now: Millis,
    ) -> Result<()> {
        let key = self.ctx.keys.gang_slow(&g.id);
        let mut view =
            gang_marks::read_view(self.ctx.coord.as_ref(), &self.ctx.keys, &g.id, g.size, None)
                .await?;
        super::gang_reads::with_own(&mut view, own);
        let members = present(&view, now, &Timing::of(&self.ctx.cfg));
        let named = suspect_scored(&members);
        // NB: with nobody named the alert is placed at this agent's own member (it must be
        // placed somewhere to be resolved); its text says nobody stands out.
        let at = named.as_ref().map_or(own, |(m, _, _)| *m);
        let placed = named.map_or_else(
            || "-".to_string(),
            |(m, why, points)| format!("{}|{points}|{}", m.id(), why.join("; ")),
        );
        let value = episode(since, (rate, baseline), (&own.id(), now), &placed);
        self.ctx.coord.set(&key, &value, lease(&self.ctx.cfg.gang.pace)).await?;
        self.hear_episode(g, own, Some(&value));
        self.ctx.metrics.pace.episodes.inc();
        let (node, worker) = (at.node.clone(), at.worker.clone());
        let opened = SlowOpened { value: value.clone(), node, worker, renewed: now, paged: false };
        self.slow.insert(g.id.clone(), opened);
        // NB: a claim that gets no answer leaves the page owed: `follow_episode` tries again
        // while the member is slow.
        self.page_slow(g, &members, (&value, at), (since, rate, baseline), now).await
    }

    /// The `slow` page of the episode this agent opened went out.
    pub(super) fn paged(&mut self, g: &Gang) {
        if let Some(o) = self.slow.get_mut(&g.id) {
            o.paged = true;
        }
    }

    /// What the episode's value says of this worker: named, it shows on its Node; named
    /// someone else, it is read no more this run.
    fn hear_episode(&mut self, g: &Gang, own: &Member, held: Option<&str>) {
        let here = held.and_then(|v| named_here(v, &g.id, own, self.machine_slow));
        self.pace.heard = here.is_none() && held.is_some_and(settled);
        self.pace.named = here.map(|n| (g.id.clone(), n));
    }

    /// The `slow` page of the episode `value`, sent once per episode (its claim), then marked
    /// paged: the gang, its rate against its usual, for how long, the member named (`at`) and
    /// why (the evidence read back from the value, as a page rebuilt from it says it:
    /// `follow_episode`; none: nobody stands out, and `at` is the opener's member).
    pub(super) async fn page_slow(
        &mut self,
        g: &Gang,
        members: &[Member],
        (value, at): (&str, &Member),
        (since, rate, baseline): (Millis, f64, f64),
        now: Millis,
    ) -> Result<()> {
        let (worker, node) = (&at.worker, &at.node);
        let who = match why_of(value) {
            Some(why) => format!("the member it waits for is {worker} on node {node}: {why}"),
            None => "no member's evidence stands out (workers that publish compute_ms, and GPUs NVML reads, name the rank)".to_string(),
        };
        let (gang, pace, pct, took) =
            (&g.id, against(rate, baseline), 100.0 * rate / baseline, human(now - since));
        let detail = format!("gang {gang} runs slow: {pace} ({pct:.0} %) for {took}; {who}. Vigil does not restart for slowness");
        let a = self.pager.gang_alert(AlertKind::Slow, g, members, Some(at), detail);
        let claim = self.ctx.keys.gang_alert(&g.id, &claim_id(value), "slow");
        self.pager.page_once(&claim, MARK_TTL, a, Unit::Gang, now).await?;
        self.paged(g);
        Ok(())
    }

    /// Its member back at its pace: named no more, and asked again at its next slow run. The
    /// opener ends the episode (compare-and-delete, then the quiet mark for `slow_for`), resolves
    /// the alert it sent, says `slow-over` once.
    async fn slow_ended(&mut self, g: &Gang, rate: f64, baseline: f64, now: Millis) -> Result<()> {
        (self.pace.episode_seen, self.pace.named) = (false, None);
        let Some(opened) = self.slow.get(&g.id).cloned() else { return Ok(()) };
        let SlowOpened { value, node, worker, paged, .. } = opened;
        let key = self.ctx.keys.gang_slow(&g.id);
        if !self.ctx.coord.del_if_owner(&key, &value).await? {
            let held = self.ctx.coord.get(&key).await?;
            return self.follow_episode(g, held.as_deref(), false, now).await;
        }
        if let Err(e) = self.ctx.coord.set(&key, QUIET, self.ctx.cfg.gang.pace.slow_for).await {
            // NB: the episode is over all the same: `slow-over` still goes out.
            tracing::warn!(gang = %g.id, error = %e, "the slow episode's quiet mark could not be written");
        }
        self.slow.remove(&g.id);
        // NB: one taken back and not measured slow since was paged only if its claim says so
        // (its opener died before paging it: nothing to say is over).
        // A read that fails says `slow-over` (one too many, rather than one lost).
        let page = self.ctx.keys.gang_alert(&g.id, &claim_id(&value), "slow");
        if !paged && matches!(self.ctx.coord.get(&page).await, Ok(None)) {
            return Ok(());
        }
        self.ctx.notifier.resolve(&node, &worker, Resolve::Episode(AlertKind::Slow)).await;
        let (gang, pace) = (&g.id, against(rate, baseline));
        let lasted = human(now - since_of(&value).unwrap_or(now));
        let detail =
            format!("gang {gang} is back at its pace: {pace} — the slow episode lasted {lasted}");
        // NB: placed where the `slow` page was; no container (an episode's value names none).
        let at = Member::working(&node, &worker, now);
        let a = self.pager.gang_alert(AlertKind::SlowOver, g, &[], Some(&at), detail);
        let claim = self.ctx.keys.gang_alert(&g.id, &claim_id(&value), "slow-over");
        // NB: owed while the quiet mark stands: this step never runs again for the episode.
        self.pager.page_once_owed(&claim, a, (key, QUIET.to_string()), now).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_member_an_episode_names_reads_it_for_its_node() {
        let own = Member::working("gpu-3", "rank-3", 0);
        let why = "it computes 571 ms before each collective, the others 400 ms (median): they wait for it";
        let at = |placed: &str| episode(1_000, (1.4, 2.0), ("gpu-0/rank-0", 1_000), placed);
        let value = at(&format!("gpu-3/rank-3|2|{why}"));
        let n = named_here(&value, "ml/c", &own, true).expect("named");
        assert_eq!(
            n.line,
            format!("gang ml/c runs at 1.40 steps/s against its usual 2.00 steps/s (70 %) and waits for rank-3 on this node: {why}")
        );
        assert!(n.strong, "compute time, on a node that shows a machine's slowdown: strong");
        let weak = at("gpu-3/rank-3|1|its node shows XID 13");
        assert!(!named_here(&weak, "ml/c", &own, true).expect("named").strong);
        // Compute time is the job's word: strong only where the node shows what no job causes.
        assert!(!named_here(&value, "ml/c", &own, false).expect("named").strong);
        // Another member, nobody, or not named yet: not this node's.
        let other = Member::working("gpu-1", "rank-1", 0);
        assert_eq!(named_here(&value, "ml/c", &other, true), None);
        assert_eq!(named_here(&at("-"), "ml/c", &own, true), None);
        assert_eq!(named_here(&at("?"), "ml/c", &own, true), None);
        assert_eq!(named_here(QUIET, "ml/c", &own, true), None);
        // An older agent's value names it the same.
        let old = format!("1000:1400:2000|gpu-3/rank-3|2|{why}");
        assert!(named_here(&old, "ml/c", &own, true).is_some());
    }
}
