//! The gang's pages: `hung` placed at the member that stopped first, the escalation of a gang
//! that hangs again, a straggler, a decision blocked (and why), restarts that do not help — each
//! sent through `super::pager`'s one way out (de-duplicated per incident in the coordinator,
//! remembered by the agent that sent it, which resolves it). The two that the trail does not
//! note need the pager alone.

use crate::alerts::AlertKind;
use crate::clock::{human, Millis};
use crate::config::{GangAction, StragglerAction};
use crate::coord::Result;
use crate::hang::marks::MARK_TTL;
use crate::hang::model::{Gang, Incident};
use crate::hang::model_gang::{Decision, GangState, Member};
use crate::hang::policy_gang as gp;
use crate::hang::policy_pipeline::{Seen, Skip, Unit};
use crate::trail::Code;

use super::gang_decision::GangDecider;
use super::pager::Pager;
use super::{Case, RestartPath};

impl RestartPath<'_> {
    pub(super) async fn page_straggler(
        &mut self,
        case: &Case<'_>,
        g: &Gang,
        own: &Member,
    ) -> Result<()> {
        let (id, since, gang) = (own.id(), own.heartbeat.unwrap_or(0), &g.id);
        let key = self.ctx.keys.gang_alert(gang, &format!("{id}-{since}"), "straggler");
        let what = match self.ctx.cfg.gang.straggler {
            StragglerAction::AlertOnly => "not restarted alone (gang.straggler = alert-only)",
            StragglerAction::Restart => "restarted alone (gang.straggler = restart)",
        };
        let container = &own.container;
        let detail = format!("{id} ({container}) stopped while the other members of gang {gang} still progress; {what}");
        let a = self.pager().gang_alert(AlertKind::Straggler, g, &[], Some(own), detail.clone());
        if !self.pager().page_once(&key, MARK_TTL, a, Unit::Gang, case.now).await? {
            return Ok(());
        }
        self.journal.note(case.now, case.about(), Code::Straggler, detail).await
    }
}

impl GangDecider<'_> {
    /// The decision's `restarting` page (`would-restart` in observe mode) and its trail entry.
    pub(super) async fn announce_decision(
        &mut self,
        (inc, d): (&Incident, &Decision),
        members: &[Member],
        now: Millis,
    ) -> Result<()> {
        let (g, first) = (self.g, gp::first_stopped(members, now));
        let (kind, verb) = match self.ctx.cfg.dry_run {
            true => (AlertKind::WouldRestart, "would restart"),
            false => (AlertKind::Restarting, "restarting"),
        };
        let (gang, count, per_day) = (&g.id, members.len(), self.ctx.cfg.gang.breaker_per_day);
        let how = match gp::one_for_all(members, now).map(|m| (m.id(), &m.container)) {
            // NB: the job's controller restarts every member once one fails (a JobSet, a
            // LeaderWorkerSet group): one action, never N stops that fight it.
            Some((id, container)) => format!(
                "{verb} gang {gang} the way its controller restarts it: one member, {id} ({container}), is stopped and its controller restarts all {count} members"
            ),
            None => format!("{verb} every member of gang {gang} together ({count} members, each by its own node's agent within two poll intervals)"),
        };
        // NB: what the decision stood on, for the person reading the page at 3 a.m.
        let evidence = match gp::due_on(inc.started, members, now, &gp::Timing::of(&self.ctx.cfg)) {
            Some(gp::Basis::Learned { since, wait }) => {
                let (silent, wait) = (human(now - since), human(wait));
                format!(" On the learned rhythm: every member silent past the silence learned of it, for {silent} (its learned wait {wait}).")
            }
            _ => String::new(),
        };
        let hang = describe_hang(g, members, first, now);
        let detail = format!("{how}; one unit of the fleet budget and of the gang's breaker ({per_day} per day). {hang}{evidence}");
        let akey = self.ctx.keys.gang_alert(gang, &inc.id, "restart");
        let mut a = self.pager.gang_alert(kind, g, members, first, detail.clone());
        a.incident = Some(inc.id.clone());
        // NB: owed while the decision stands: this step never runs again for it, and the trail
        // says the decision whatever became of its page.
        let stands = (self.ctx.keys.gang_decision(&g.id), d.encode());
        let paged = self.pager.page_once_owed(&akey, a, stands, now).await;
        let about = self.case.about().incident(&inc.id);
        self.journal.note(now, about, Code::GangDecided, detail).await?;
        paged.map(drop)
    }

    /// A decision refused — `Skip::Blocked` (a member cannot take part, a cap) or
    /// `Skip::Fruitless` (the gang's restarts have not helped), and what its page says: its page
    /// once per gang incident (placed at the member that stopped first), its trail entry once
    /// (the skip's code); the pass stops at its skip.
    pub(super) async fn refuse(
        &mut self,
        inc: &Incident,
        members: &[Member],
        (skip, detail): (Skip, String),
        now: Millis,
    ) -> Result<Seen> {
        // The page's kind, and its de-duplication kind (`P:gang:{G}:alert:<incident>:<dedup>`).
        let (kind, dedup) = match skip {
            Skip::Fruitless => (AlertKind::Fruitless, "fruitless"),
            _ => (AlertKind::GangBlocked, "blocked"),
        };
        let key = self.ctx.keys.gang_alert(&self.g.id, &inc.id, dedup);
        let first = gp::first_stopped(members, now);
        let mut a = self.pager.gang_alert(kind, self.g, members, first, detail.clone());
        a.incident = Some(inc.id.clone());
        self.pager.page_once(&key, MARK_TTL, a, Unit::Gang, now).await?;
        let about = self.case.about().incident(&inc.id).once();
        self.journal.note(now, about, skip.code(), detail).await?;
        Ok(Seen::Skip(skip))
    }
}

impl Pager<'_> {
    pub(super) async fn page_gang_hung(
        &mut self,
        g: &Gang,
        state: &GangState,
        members: &[Member],
        now: Millis,
    ) -> Result<()> {
        let Some(inc) = &state.incident else { return Ok(()) };
        let first = gp::first_stopped(members, now);
        let mut detail = describe_hang(g, members, first, now);
        let owner = members.iter().find(|m| m.alert_only).map(Member::id);
        match (self.ctx.cfg.gang.action, owner) {
            (GangAction::AlertOnly, _) => {
                detail.push_str("; gang.action = alert-only: Vigil restarts no member")
            }
            (_, Some(id)) => detail.push_str(&format!(
                "; {id} is alert-only (its restarts belong to its owner): Vigil restarts no member"
            )),
            _ => {}
        }
        let mut a = self.gang_alert(AlertKind::Hung, g, members, first, detail);
        a.incident = Some(inc.id.clone());
        a.duration = first.and_then(|m| m.heartbeat).map(|hb| human(now - hb));
        let key = self.ctx.keys.gang_alert(&g.id, &inc.id, "hung");
        self.page_once(&key, MARK_TTL, a, Unit::Gang, now).await.map(drop)
    }

    pub(super) async fn page_gang_again(
        &mut self,
        g: &Gang,
        members: &[Member],
        restarted: Millis,
        now: Millis,
    ) -> Result<()> {
        let key = self.ctx.keys.gang_alert(&g.id, &restarted.to_string(), "escalation");
        let first = gp::first_stopped(members, now);
        let (gang, after) = (&g.id, human(now - restarted));
        let hang = describe_hang(g, members, first, now);
        let detail = format!("gang {gang} hangs again {after} after its restart of every member: the restart did not fix it; a person must look. {hang}");
        let a = self.gang_alert(AlertKind::Escalation, g, members, first, detail);
        self.page_once(&key, MARK_TTL, a, Unit::Gang, now).await.map(drop)
    }
}

/// The page's account of a hung gang: how many members, who stopped first, where, and what its
/// node knows.
fn describe_hang(g: &Gang, members: &[Member], first: Option<&Member>, now: Millis) -> String {
    let count = match g.size {
        Some(n) => format!("{} of {n} members report", members.len()),
        None => format!("{} members", members.len()),
    };
    let Some(f) = first else { return format!("gang {}: {count}", g.id) };
    let last = f
        .heartbeat
        .map_or("never beat".to_string(), |hb| format!("last progress {} ago", human(now - hb)));
    let (gang, worker, node, container) = (&g.id, &f.worker, &f.node, &f.container);
    let mut s = format!(
        "gang {gang} ({count}) stopped: the first to stop was {worker} on node {node} ({container}), {last}"
    );
    if !f.signals.is_empty() {
        s.push_str(&format!("; on its node: {}", f.signals.join(", ")));
    }
    if let Some(sd) = &f.stand_down {
        s.push_str(&format!("; {sd}"));
    }
    s
}
