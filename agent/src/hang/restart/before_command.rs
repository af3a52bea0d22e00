//! The pipeline's steps up to the command (see `super::pipeline` for their order): the decision
//! that the worker is ours to restart, logs and the restart alert, revalidation and
//! compare-and-restart, the lock check and the claim; each either passes or ends the pass with
//! its skip (said in the trail; its pages go out here, through `super::pager`).

use crate::alerts::{AlertKind, Resolve};
use crate::clock::{human, ms, Stamp};
use crate::coord::Result;
use crate::hang::marks;
use crate::hang::model::{Marks, WorkerStatus};
use crate::hang::policy::{self, Cancel};
use crate::hang::policy_fruitless::{self, Beat, RunOf};
use crate::hang::policy_pipeline::{Seen, Skip};
use crate::trail::Code;
use crate::vocab::workload::{Remediation, Stops};

use super::pipeline::Pipeline;
use super::{short, GangOrder};

/// How long the logs of an incident may fail before its restart goes ahead without them, in
/// polls from the first failed read: a passing hiccup of the runtime gets its retries (with
/// cycles on time, the third try restarts), while logs that are never readable (a log driver
/// `none`, a lost log file) do not leave a hung worker hung, burning its accelerators, for a
/// page's log tail. NB: never on the first failure, whatever the cycles' pace.
const LOGS_PATIENCE_POLLS: u32 = 2;

impl Pipeline<'_> {
    /// Whether the worker is ours and the runtime's to restart: an `alert-only` worker's
    /// restarts belong to its owner, and nothing of the pipeline runs for it (no lock, no caps).
    ///
    /// What it leaves in `how`, when it passes: how the runtime restarts the worker, the way
    /// its pod's controllers restart it (`crate::vocab::workload`).
    pub(super) async fn decide(&mut self) -> Result<Seen> {
        let act = self.act;
        if act.case.alert_only() {
            let detail = "alert only: its restarts belong to its owner (the `.restarts = alert-only` label or record field)".to_string();
            return self.skip(Skip::AlertOnly, detail, true).await;
        }
        // NB: not a gang member's: its restart is the gang's, and one member left out would
        // break the job's rendezvous (a gang's run is judged as the gang's).
        let run = act.case.marks.fruitless.as_ref();
        let run = run.filter(|f| policy_fruitless::same_job(f, act.case.status));
        let beats = Beat::of_worker(act.case.status);
        let max = self.ctx.cfg.policy.max_fruitless_restarts;
        let refusing = policy_fruitless::refusal(run, beats.as_slice(), max);
        if let (None, Some(run)) = (act.order, refusing) {
            // Restarts have not helped: paged once per incident, said in the trail once.
            let detail = policy_fruitless::describe(run, RunOf::Worker);
            let alert = self.pager.act_alert(AlertKind::Fruitless, act, self.now, detail.clone());
            self.pager.page_incident(act, "fruitless", alert, self.now).await?;
            return self.skip(Skip::Fruitless, detail, true).await;
        }
        // NB: before the logs and the restart alert: a drained node (a cordon by a person, GKE's
        // auto-repair or an upgrade) is a standing condition, said once per incident; the wait
        // for the agent's first reads passes within seconds, said each time.
        if let Some(sd) = self.watch.stand_down(act.case.c, self.now, &self.ctx.cfg.metadata) {
            let (detail, once) = match sd.passing() {
                true => (format!("{sd}; not restarting yet"), false),
                false => (format!("{sd}; not restarting while it is"), true),
            };
            return self.skip(Skip::NodeState, detail, once).await;
        }
        // NB: one pod: a gang's decision reserved room for every member's (`Stops::EveryPod`
        // at its members' entries), and those stopped before this one have spent theirs.
        let found = self.ctx.runtime.remediation(act.case.c, Stops::One).await;
        if let Some(why) = self.refusal(&found) {
            // Paged once per incident, said in the trail once.
            let detail = format!("{why}; not restarting, a person must decide");
            let alert = self.pager.act_alert(AlertKind::NotRestartable, act, self.now, detail);
            self.pager.page_incident(act, "not-restartable", alert, self.now).await?;
            return self.skip(Skip::NotRestartable, why, true).await;
        }
        self.how = found;
        Ok(Seen::Pass)
    }

    /// Why this pass must not restart the worker the way its controllers would: they refuse
    /// it, or their way is not this pass's — one member's stop restarts a whole gang, which
    /// only the gang's decision may choose (and a gang's decision, taken for one way, is not
    /// carried out another way: its controllers changed since).
    fn refusal(&self, how: &Remediation) -> Option<String> {
        let (one_for_all, way) = (matches!(how, Remediation::OneForAll { .. }), how.how());
        match (how, self.act.order) {
            (Remediation::Refuse(why), _) => Some(why.clone()),
            (_, Some(GangOrder { gang, decision })) if one_for_all != decision.only.is_some() => {
                Some(format!("its controllers changed since gang {gang}'s decision (now: {way}): the decision is not carried out another way"))
            }
            (_, None) if one_for_all && self.act.case.gang().is_some() => {
                Some(format!("restarting this member alone would restart its whole job ({way})"))
            }
            _ => None,
        }
    }

    /// Write a skip to the trail at the pass's clock (with `once`, the first time per incident
    /// only); answers it: the pass ends.
    pub(super) async fn skip(&mut self, skip: Skip, detail: String, once: bool) -> Result<Seen> {
        let about = if once { self.act.about().once() } else { self.act.about() };
        self.journal.note(self.now, about, skip.code(), detail).await.map(|()| Seen::Skip(skip))
    }

    /// The container's last lines, then the restart (or would-restart) page with them, once per
    /// incident. Logs first: a pass that fails here must not consume the breaker. When collection
    /// fails the pass stops here (no budget consumed): a `logs-failed` page and a skip in the
    /// trail, once per incident; from [`LOGS_PATIENCE_POLLS`] polls after the incident's first
    /// failed read, the restart goes ahead without them, its page saying why. The logs are only
    /// the page's contents: every other gate stands. A gang member's restart reads none: no
    /// page of its own carries them (the gang's `restarting` page went out with its decision).
    pub(super) async fn logs_and_alert(&mut self) -> Result<Seen> {
        let (ctx, act) = (self.ctx, self.act);
        // NB: not read to be dropped: a member's failed read held its restart back on the
        // gang's first failure stamp, shared by every member on every node.
        if act.order.is_some() {
            return Ok(Seen::Pass);
        }
        let (d, c) = (&ctx.cfg.runtime, act.case.c);
        let call = tokio::time::timeout(d.log_timeout, ctx.runtime.logs(&c.id, d.log_lines));
        let why = match call.await {
            Ok(Ok(logs)) => return self.restart_page(Ok(logs)).await,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {}", humantime::format_duration(d.log_timeout)),
        };
        ctx.metrics.backends.runtime_error();
        // NB: the incident's `logs-failed` page claim (`<ms>:<instance>`) says when its logs
        // first failed, alike for every instance and after an agent's restart: no mark of its own.
        let key = ctx.keys.alert_dedup(&act.inc.id, "logs-failed");
        let first = ctx.coord.get(&key).await?.and_then(|v| Stamp::parse(&v)).map(|s| s.at);
        let patience = ms(ctx.cfg.poll_interval * LOGS_PATIENCE_POLLS);
        if let Some(at) = first.filter(|&at| self.now - at >= patience) {
            let unread = format!("they could not be read for {} ({why})", human(self.now - at));
            return self.restart_page(Err(unread)).await;
        }
        let wait = human(patience);
        let detail = format!("log collection failed ({why}); restart not attempted: tried again each cycle, and done without the logs once they have failed for {wait}; breaker not consumed");
        let since = Some(act.since);
        let alert = self.pager.alert_for(AlertKind::LogsFailed, act.case, since, self.now, detail);
        self.pager.page_incident(act, "logs-failed", alert, self.now).await?;
        let detail = format!("log collection failed: {why}; the restart waits for them until they have failed for {wait}, then goes ahead without them");
        self.skip(Skip::LogsFailed, detail, true).await
    }

    /// The restart (or would-restart) page, once per incident: with the logs read, or saying why
    /// they could not be (`Err`).
    async fn restart_page(&mut self, logs: Result<String, String>) -> Result<Seen> {
        let act = self.act;
        let (kind, verb) = match self.ctx.cfg.dry_run {
            true => (AlertKind::WouldRestart, "would restart"),
            false => (AlertKind::Restarting, "restarting"),
        };
        let c = act.case.c;
        let mut detail = format!("{verb} container {} ({})", c.name, short(&c.id));
        if let Err(unread) = &logs {
            detail = format!("{detail} without its logs: {unread}");
        }
        let mut alert = self.pager.act_alert(kind, act, self.now, detail);
        alert.logs = logs.ok();
        self.pager.page_incident(act, "restart", alert, self.now).await?;
        Ok(Seen::Pass)
    }

    /// Revalidate at the last moment, from fresh data and a fresh clock; then the node's state
    /// (shutdown, maintenance, GPU) and the incarnation. A skip ends the pass. The fresh clock is
    /// the pass's from here.
    pub(super) async fn last_moment_checks(&mut self) -> Result<Seen> {
        let act = self.act;
        let w = act.case.worker();
        // A fresh clock, record and marks, in one round trip.
        let fresh = marks::read(self.ctx.coord.as_ref(), &self.ctx.keys, w).await?;
        let (status, _) = super::evaluate::status_of(self.ctx, act.case.c, &fresh);
        let (marks, now) = (marks::decode(&fresh.values).marks, fresh.now);
        self.now = now;
        // NB: by the rule the restart was due under, from the coordinator's copy of the
        // worker's rhythm as this read returns it (the fixed rule when that copy is gone): a
        // gang member's, the rule its entry carries (the gang may have decided on it).
        let rules = match act.order {
            Some(_) => self.judge.member_rules(status.as_ref(), &marks, now),
            None => self.judge.restart_rules(status.as_ref(), &marks, now),
        };
        let mut checked = policy::revalidate(act.case.v, status.as_ref(), &marks, now, &rules);
        if let (Ok(()), Some(order)) = (checked, act.order) {
            checked = self.order_stands(order, status.as_ref(), &marks).await?;
        }
        let (cancel, why) = match checked {
            Ok(()) => return self.node_and_container_checks().await,
            Err(Cancel::RetryPending) => {
                // NB: the incident stands (it is still hung): only this pass ends, and the
                // retry alerts again with its logs (the pipeline releases the alert).
                let why = "a restart of this incident failed after our decision (another instance's); the retry waits for its backoff".to_string();
                return self.skip(Skip::RetryPending, why, false).await;
            }
            Err(c @ Cancel::CooldownAppeared) => {
                (c, "a cooldown marker appeared: another instance already restarted it")
            }
            Err(c @ Cancel::Recovered) => {
                (c, "heartbeat fresh again between decision and command; incident closed")
            }
        };
        let k = &self.ctx.keys;
        self.ctx.coord.del(&[k.incident(w), k.suspect(w)]).await?;
        let end =
            if cancel == Cancel::Recovered { Resolve::Recovered } else { Resolve::IncidentCleared };
        self.pager.resolve_alerts(w, end).await;
        self.skip(Skip::Cancelled(cancel), why.into(), false).await
    }

    /// A gang member's restart against its gang's decision, read again: a closed or replaced
    /// incident restarts nobody, and a member restarted since the decision, or that beat since
    /// (whatever rule still calls it stale), is never restarted for it.
    async fn order_stands(
        &self,
        order: &GangOrder,
        status: Option<&WorkerStatus>,
        marks: &Marks,
    ) -> Result<Result<(), Cancel>> {
        let decided = order.decision.decided;
        if marks.restarted_at.is_some_and(|t| t >= decided) {
            return Ok(Err(Cancel::CooldownAppeared));
        }
        if status.and_then(|s| s.heartbeat).is_some_and(|hb| hb > decided) {
            return Ok(Err(Cancel::Recovered));
        }
        // The last-moment check: the gang's decision still stands.
        let held = self.ctx.coord.get(&self.ctx.keys.gang_decision(&order.gang)).await?;
        let stands = held.as_deref() == Some(order.decision.encode().as_str());
        Ok(if stands { Ok(()) } else { Err(Cancel::Recovered) })
    }

    /// The node's state (shutdown, maintenance, GPU) and compare-and-restart: checked after
    /// revalidation, and again right before the command. A skip ends the pass.
    pub(super) async fn node_and_container_checks(&mut self) -> Result<Seen> {
        let c = self.act.case.c;
        if let Some(why) = self.watch.stand_down(c, self.now, &self.ctx.cfg.metadata) {
            let detail = format!("{why} between decision and command; not restarting");
            return self.skip(Skip::NodeState, detail, false).await;
        }
        // Compare-and-restart: the container is still the incarnation we decided on, and it is
        // running (a stopped or paused one is someone's decision).
        let found = match self.ctx.runtime.inspect(&c.id).await {
            Ok(Some(cur)) if cur.id == c.id && cur.started_at == c.started_at => {
                (!cur.running).then_some(Skip::NotRunning)
            }
            Ok(_) => Some(Skip::ContainerChanged),
            Err(e) => {
                self.ctx.metrics.backends.runtime_error();
                tracing::warn!(error = %e, worker = %c.worker, "inspect before restart failed; not restarting");
                Some(Skip::ContainerChanged)
            }
        };
        let Some(skip) = found else { return Ok(Seen::Pass) };
        let (id, shown) = (short(&c.id), c.display());
        let detail = match skip {
            Skip::NotRunning => format!(
                "container {shown} ({id}) is not running any more; not starting what someone stopped"
            ),
            _ => format!("container {id} is not the incarnation observed at decision time"),
        };
        self.skip(skip, detail, false).await
    }

    /// Observe mode: everything a real restart would do except the command and the restart
    /// record, at the fresh clock `run_step` read for it (the pass's from here).
    pub(super) async fn observe_only(&mut self) -> Result<Seen> {
        let seen = self.blocked_by_caps(true).await?;
        if seen != Seen::Pass {
            return Ok(seen);
        }
        // Observe mode leaves the same "this is me" cooldown, so its timeline is the one a
        // real restart would produce; but no restart record, so it never pages an escalation
        // for a restart that did not happen.
        let act = self.act;
        let (k, w) = (&self.ctx.keys, act.case.worker());
        let marker = Stamp::new(self.now, &act.inc.id).to_string();
        self.ctx.coord.set(&k.cooldown(w), &marker, self.ctx.cfg.policy.cooldown).await?;
        self.ctx.coord.del(&[k.incident(w), k.suspect(w)]).await?;
        self.pager.resolve_alerts(w, Resolve::IncidentCleared).await;
        self.ctx.metrics.decisions.restart(act.case.v.as_str(), "would-restart");
        let (name, id) = (&act.case.c.name, short(&act.case.c.id));
        let detail = format!("would restart container {name} ({id}) now; observe mode");
        self.journal.note(self.now, act.about(), Code::WouldRestart, detail).await?;
        Ok(Seen::Pass)
    }

    /// The lock must still be ours, with room for the whole restart (renewed right before the
    /// command, after the recheck's inspect: `Step::LockCheck`). Then the markers go in —
    /// *before* the command: the booting container will look hung for a minute or more, and the
    /// detector must know that this is us. A skip: nothing will run (the pipeline gives the
    /// units back, and the claim when its write failed).
    pub(super) async fn hold_lock_and_mark(&mut self) -> Result<Seen> {
        let seen = self.lock_covers().await?;
        if seen != Seen::Pass {
            return Ok(seen);
        }
        if self.write_restart_markers().await? {
            return Ok(Seen::Pass);
        }
        // The claim failed: another instance's marker appeared after our revalidation.
        let skip = Skip::Cancelled(Cancel::CooldownAppeared);
        let detail = "another instance's cooldown marker appeared after revalidation (it restarted this worker past a lost lock); not restarting".to_string();
        self.skip(skip, detail, false).await
    }
}
