//! The one way out for every page a restart unit sends, a worker's, a gang's and a cap's:
//! [`Pager::page_once`]. A page is claimed in the coordinator by its de-duplication key (SET NX:
//! the agent that claims it first sends it, once per incident, episode, day or window), placed
//! ([`Pager::alert_for`] at a worker of this node, [`Pager::gang_alert`] at the gang's member to
//! look at, [`Pager::node_alert`] at no worker: the node's breaker, the fleet budget) and sent; a
//! page placed at a gang is remembered by the agent that sent it, which resolves it
//! ([`Pager::resolve_gang_alerts`]).
//!
//! A step that pages takes a `Pager` — the shared context, the alert gate and the gang alerts
//! this agent sent — and nothing else of the worker's evaluation (`RestartPath::pager`, or the
//! one each object that pages is built with: `Pipeline`, `GangDecider`, `PaceWatch`).

use std::time::Duration;

use crate::alerts::gate::{AlertGate, Owed};
use crate::alerts::{Alert, AlertKind, Resolve, NO_WORKER};
use crate::clock::{human, Millis};
use crate::coord::Result;
use crate::hang::context::Context;
use crate::hang::marks::MARK_TTL;
use crate::hang::model::Gang;
use crate::hang::model_gang::{Member, Sent};
use crate::hang::policy_pipeline::Unit;

use super::{Act, Case, RestartPath};

/// What a step needs to page: the context, the alert gate, the gang alerts this agent sent.
pub(super) struct Pager<'a> {
    pub(super) ctx: &'a Context,
    alerts: &'a mut AlertGate,
    sent: &'a mut Sent,
}

impl RestartPath<'_> {
    /// What a step that pages needs of the pass: the context, the alert gate and the gang
    /// alerts this agent sent.
    pub(super) fn pager(&mut self) -> Pager<'_> {
        Pager::new(self.ctx, self.alerts, &mut self.gangs.sent)
    }
}

impl<'a> Pager<'a> {
    pub(super) fn new(ctx: &'a Context, alerts: &'a mut AlertGate, sent: &'a mut Sent) -> Self {
        Pager { ctx, alerts, sent }
    }

    /// Send `alert` once: the agent that claims `key` first (for `ttl`) sends it; a page placed
    /// at a gang (`Unit::Gang`) is remembered for its resolution. True when this agent sent it.
    pub(super) async fn page_once(
        &mut self,
        key: &str,
        ttl: Duration,
        alert: Alert,
        at: Unit,
        now: Millis,
    ) -> Result<bool> {
        let lease = self.ctx.cfg.safety.lock_ttl;
        if !self.alerts.claim(self.ctx.coord.as_ref(), key, now, ttl, lease).await? {
            return Ok(false);
        }
        self.remember(at, &alert);
        self.ctx.notifier.send(&alert).await;
        Ok(true)
    }

    /// [`Self::page_once`] of a worker's page once per incident (`tag` names the page in the
    /// incident's dedup key: `not-restartable`, `restart`, ...).
    pub(super) async fn page_incident(
        &mut self,
        act: &Act<'_>,
        tag: &str,
        alert: Alert,
        now: Millis,
    ) -> Result<bool> {
        let key = self.ctx.keys.alert_dedup(&act.inc.id, tag);
        self.page_once(&key, MARK_TTL, alert, Unit::Worker, now).await
    }

    /// [`Self::page_once`] for a page whose step never runs again (a gang's decision is
    /// announced once): a claim that gets no answer leaves the page owed, sent by a later cycle
    /// once the claim answers (`AlertGate::owed`), while `stands` (a key and the value it holds
    /// while what the page announces stands) still holds.
    pub(super) async fn page_once_owed(
        &mut self,
        key: &str,
        alert: Alert,
        stands: (String, String),
        now: Millis,
    ) -> Result<bool> {
        let sent = self.page_once(key, MARK_TTL, alert.clone(), Unit::Gang, now).await;
        if sent.is_err() {
            self.remember(Unit::Gang, &alert);
            self.alerts.owe(key, Owed { alert, ttl: MARK_TTL, since: now, stands });
        }
        sent
    }

    /// A gang alert this agent sends (or owes): resolved by it when its incident closes, under
    /// the worker the sinks keep it under (its incident's placed at no member:
    /// [`no_worker`](crate::alerts::no_worker), `@<incident>`).
    fn remember(&mut self, at: Unit, alert: &Alert) {
        if let (Unit::Gang, Some(gang), Some(w)) = (at, &alert.gang, alert.kept_under()) {
            let sent = self.sent.entry(gang.clone()).or_default();
            if !sent.iter().any(|(n, x)| *n == alert.node && *x == w) {
                sent.push((alert.node.clone(), w));
            }
        }
    }

    /// The worker's condition ended: the sinks that keep alerts open (Alertmanager) resolve
    /// the alerts `end` covers.
    pub(super) async fn resolve_alerts(&self, worker: &str, end: Resolve) {
        self.ctx.notifier.resolve(self.ctx.keys.node(), worker, end).await;
    }

    /// Resolve the gang alerts this agent sent for `gang` (its incident closed, or its own
    /// member is fine again).
    pub(super) async fn resolve_gang_alerts(&mut self, gang: &str, fine: Option<&str>) {
        let sent = self.sent.remove(gang).unwrap_or_default();
        let here = self.ctx.keys.node().to_string();
        // NB: a member that is fine ends the alerts placed at itself, and the gang's placed at
        // other nodes or at no member (the gang moves again); not those at its siblings on this
        // node (a straggler's page), which their own evaluation ends.
        let (ended, kept): (Vec<_>, Vec<_>) = sent.into_iter().partition(|(node, worker)| {
            fine.is_none_or(|w| *node != here || worker == w || worker.starts_with(NO_WORKER))
        });
        if !kept.is_empty() {
            self.sent.insert(gang.to_string(), kept);
        }
        for (node, worker) in ended {
            // `Recovered`: escalations end too.
            self.ctx.notifier.resolve(&node, &worker, Resolve::Recovered).await;
        }
    }

    /// A page placed at a worker of this node: its rank, container, verdict, job and gang, and
    /// how long its condition has lasted (since `since`).
    pub(super) fn alert_for(
        &self,
        kind: AlertKind,
        case: &Case<'_>,
        since: Option<Millis>,
        now: Millis,
        detail: impl Into<String>,
    ) -> Alert {
        let mut a = Alert::new(kind, self.ctx.keys.node(), detail);
        if let Some((rank, of)) = case.status.and_then(|s| s.rank) {
            // The one place to look in a container of several ranks.
            a.detail = format!("rank {rank} of {of} (the container's worst): {}", a.detail);
        }
        a.worker = Some(case.c.worker.clone());
        a.container = Some(case.c.display());
        a.verdict = Some(case.v.as_str());
        a.job = case.status.and_then(|s| s.job.clone());
        if let Some(g) = case.gang() {
            a.gang = Some(g.id.clone());
            a.gang_size = g.size;
        }
        a.duration = since.map(|t| human(now - t));
        a.dry_run = self.ctx.cfg.dry_run;
        a
    }

    /// A node-wide page (the node's breaker, the fleet budget), as the node's other node-wide
    /// alerts are (`coordinator-down`, `runtime-down`): no worker, container, verdict, job or
    /// gang. Without a worker the sinks that keep alerts open post it once and no worker's end
    /// resolves it (`crate::alerts::alertmanager`).
    pub(super) fn node_alert(&self, kind: AlertKind, detail: impl Into<String>) -> Alert {
        let mut a = Alert::new(kind, self.ctx.keys.node(), detail);
        // Vigil's mode, not a worker's: an observe-mode page still says so.
        a.dry_run = self.ctx.cfg.dry_run;
        a
    }

    /// A page of an incident a pass acts on, placed at its worker.
    pub(super) fn act_alert(
        &self,
        kind: AlertKind,
        act: &Act<'_>,
        now: Millis,
        detail: String,
    ) -> Alert {
        let mut a = self.alert_for(kind, act.case, Some(act.since), now, detail);
        a.incident = Some(act.inc.id.clone());
        a
    }

    /// An alert about the gang, placed at `first` (the member to look at); with none, at no
    /// worker of this node (an incident's is remembered and resolved under its `@<incident>`).
    pub(super) fn gang_alert(
        &self,
        kind: AlertKind,
        g: &Gang,
        members: &[Member],
        first: Option<&Member>,
        detail: String,
    ) -> Alert {
        let node = first.map_or(self.ctx.keys.node(), |m| m.node.as_str());
        let mut a = Alert::new(kind, node, detail);
        a.worker = first.map(|m| m.worker.clone());
        // NB: an entry of an agent that does not say (and a page rebuilt from an episode's
        // value) has no container: none, not an empty one.
        a.container = first.map(|m| m.container.clone()).filter(|c| !c.is_empty());
        a.gang = Some(g.id.clone());
        a.gang_size = g.size;
        a.gang_members = (!members.is_empty()).then_some(members.len() as u32);
        a.dry_run = self.ctx.cfg.dry_run;
        a
    }
}

#[cfg(test)]
#[cfg(feature = "demo")] // NB: the recording sink and the fake runtime are the demo's.
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::alerts::Notifier;
    use crate::clock::FakeClock;
    use crate::config::Config;
    use crate::coord::memory::MemoryCoordinator;
    use crate::coord::Keys;
    use crate::metrics::Metrics;
    use crate::recording::RecordingSink;
    use crate::runtime::sim::FakeRuntime;

    /// A gang's page of an incident with no member to place it at (none of the gang's view
    /// stopped) is on its incident's keys, but was never remembered: no end resolved it, and in
    /// PagerDuty it stayed open for ever. It is resolved under `@<incident>` when its incident
    /// closes here, or when this agent's member is fine again (the gang moves again).
    #[tokio::test]
    async fn a_gang_page_at_no_member_is_resolved_with_its_gang() {
        let (sink, metrics) = (RecordingSink::default(), Arc::new(Metrics::new()));
        let ctx = Context {
            cfg: Config { node_name: "gpu-1".into(), ..Config::default() },
            keys: Keys::new("vigil", "gpu-1"),
            coord: Arc::new(MemoryCoordinator::new(Arc::new(FakeClock::at(1_000_000)))),
            runtime: Arc::new(FakeRuntime::default()),
            notifier: Notifier::new(Some(Arc::new(sink.clone())), metrics.clone()),
            metrics,
        };
        let (mut gate, mut sent) = (AlertGate::new("a"), Sent::default());
        let g = Gang { id: "ml/run-1".into(), size: Some(4) };
        // The incident closes here (`None`); this agent's member is fine again.
        for fine in [None, Some("trainer-0")] {
            let mut pager = Pager::new(&ctx, &mut gate, &mut sent);
            let mut a = pager.gang_alert(AlertKind::GangBlocked, &g, &[], None, "blocked".into());
            a.incident = Some("g-1".into());
            let key = format!("blocked-{fine:?}");
            assert!(pager.page_once(&key, MARK_TTL, a, Unit::Gang, 1_000_000).await.unwrap());
            pager.resolve_gang_alerts(&g.id, fine).await;
        }
        assert_eq!(sink.count(AlertKind::GangBlocked), 2);
        assert_eq!(sink.resolved(), vec![(crate::alerts::no_worker("g-1"), Resolve::Recovered); 2]);
        assert!(sent.is_empty(), "nothing left to resolve");
    }
}
