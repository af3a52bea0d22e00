//! The gang path: a member of a distributed job's collective is judged with its gang. Its agent
//! reads the gang's fleet view (only while the member is stale, in error or booting), and carries
//! out `crate::hang::policy_gang`'s steps: the gang incident (SET NX), its pages, the one
//! decision (under the gang's lock: restarts so far that helped, every member able to take part,
//! one unit of the gang's breaker and one of the fleet budget, one more in the gang's run of
//! fruitless restarts), and this member's restart — through the ordinary
//! pipeline, under this node's lock and breaker, revalidated against the decision at the last
//! moment.

use crate::clock::{human, ms, utc_day, Millis, Stamp};
use crate::coord::Result;
use crate::hang::marks::MARK_TTL;
use crate::hang::model::{Gang, Incident, WorkerState};
use crate::hang::model_gang::{Activity, Decision, GangState, Member};
use crate::hang::policy::Verdict;
use crate::hang::policy_fruitless::{self, Beat};
use crate::hang::policy_gang::{self as gp, GangStep, GangVerdict, Rules, Timing};
use crate::hang::policy_record;
use crate::hang::stand_down::StandDown;
use crate::trail::Code;
use crate::vocab::workload::{Remediation, Stops};

use super::gang_decision::GangDecider;
use super::pager::Pager;
use super::{Act, Case, GangOrder, RestartPath};

/// Where a gang step runs: the gang, this agent's member (as the view has it), the members
/// present, and the member's own incident (for a straggler restarted alone).
struct Here<'a> {
    g: &'a Gang,
    own: &'a Member,
    members: &'a [Member],
    incident: &'a Option<Incident>,
}

impl RestartPath<'_> {
    /// This member's entry in its gang's view, as of this cycle (queued for the cycle's batch).
    pub(super) async fn member_entry(&mut self, case: &Case<'_>) -> Option<Member> {
        let (s, now) = (case.status?, case.now);
        let g = s.gang.as_ref()?;
        let sd = self.watch.stand_down(case.c, now, &self.ctx.cfg.metadata);
        let (rule, troubled) = self.judge().member_standing(case);
        let (stand_down, one_for_all) = self.cannot_take_part(case, sd.as_ref(), troubled).await;
        // The JobSet's incarnation, when the gang is the one the pod's labels name.
        let pod_gang = case.c.gang.as_ref().filter(|pg| pg.id == g.id);
        let jsu = pod_gang.and_then(|pg| pg.jobset_uid.as_deref());
        let resumed = self.pace_watch().resume(g, &case.c.worker, jsu, now).await;
        // What this member's node knows that may explain a stop, besides its GPU XIDs
        // (`self.gpu_evidence`, first in `signals`): a failed GPU or TPU.
        let gpu = self.node.gpu_failed.then(|| "its GPU failed".to_string());
        let tpu = self.node.tpu_failed.then(|| "the node's TPU failed".to_string());
        let m = Member {
            node: self.ctx.keys.node().to_string(),
            worker: case.c.worker.clone(),
            verdict: case.v,
            activity: match s.state {
                WorkerState::Idle => Activity::Idle,
                WorkerState::Error => Activity::Error,
                _ => Activity::Working,
            },
            heartbeat: s.heartbeat,
            step: policy_fruitless::position(Some(s)),
            line: case.marks.gang_line,
            silence: policy_record::allowed_silence(s, &self.ctx.cfg.policy),
            learned: rule,
            started: case.c.started_ms(),
            at: now,
            stand_down,
            starting: sd.as_ref().is_some_and(StandDown::passing),
            breaker_left: self.breaker_left(now).await,
            container: case.c.display(),
            signals: self.gpu_evidence.iter().cloned().chain(gpu).chain(tpu).collect(),
            alert_only: case.alert_only(),
            attempt: pod_gang.and_then(|pg| pg.attempt),
            jobset_uid: pod_gang.and_then(|pg| pg.jobset_uid.clone()),
            one_for_all,
            dry_run: self.ctx.cfg.dry_run,
            preemption_budget: Some(ms(self.ctx.cfg.checkpoint.preemption_budget)),
            maintenance_budget: Some(ms(self.ctx.cfg.checkpoint.maintenance_budget)),
            compute: self.pace.compute(s.heartbeat, s.compute),
            slow: self.slow_signals.to_vec(),
            pace: self.pace.kept(&self.ctx.cfg.gang.pace),
        };
        self.gangs.tags.insert(m.worker.clone(), crate::hang::model_gang::tag(&g.id, g.size));
        let key = self.ctx.keys.gang_members(&g.id, gp::shard_of(&m.node, gp::shards(g.size)));
        // NB: not before the pace it keeps was read: it would be written over with nothing.
        if let (Ok(json), true) = (serde_json::to_string(&m), resumed) {
            self.gangs.entries.push((key, m.id(), json));
        }
        self.end_gang_run(&g.id, &m).await;
        Some(m)
    }

    /// Restarts this node's breaker still allows today: as the cycle's batch last read it, or —
    /// in an agent's first cycle, before any batch — read now, once (unknown is no answer to
    /// give a decision: the simulation's seed 4 decided on a fresh agent's unknown and its
    /// member was refused by a spent breaker).
    async fn breaker_left(&mut self, now: Millis) -> Option<u64> {
        let s = &self.ctx.cfg.safety;
        if s.breaker_disabled {
            return None;
        }
        if self.gangs.breaker_left.is_none() {
            // NB: a read that fails is no unit (fail closed): the decision waits for a count.
            let used = self.ctx.coord.counter(&self.ctx.keys.breaker(&utc_day(now))).await;
            return Some(used.map_or(0, |used| u64::from(s.breaker_per_day).saturating_sub(used)));
        }
        self.gangs.breaker_left
    }

    /// Why this member's node cannot restart it now: the node stands down (`sd`), or (asked
    /// only while the member is in trouble: it may be a call to the runtime and the Kubernetes
    /// API) its pod's controllers refuse it (a `Never` pod nothing brings back, a stop that
    /// would fail a Job no JobSet restarts). And, when one member's restart restarts every
    /// member, what restarts (`jobset:<ns>/<name>`, `lws:<ns>/<name>/<group>`): the gang's
    /// decision then names one member, if every member names the same.
    async fn cannot_take_part(
        &self,
        case: &Case<'_>,
        sd: Option<&StandDown>,
        troubled: bool,
    ) -> (Option<String>, Option<String>) {
        // NB: not the wait for the first reads: that defers the gang's decision (the entry's
        // `starting`), it does not block it (a page).
        if let Some(sd) = sd.filter(|sd| !sd.passing()) {
            return (Some(sd.to_string()), None);
        }
        if !troubled {
            return (None, None);
        }
        match self.ctx.runtime.remediation(case.c, Stops::EveryPod).await {
            Remediation::Refuse(why) => {
                (Some(format!("it cannot be restarted by Vigil ({why})")), None)
            }
            Remediation::OneForAll { whole, .. } => (None, Some(whole)),
            _ => (None, None),
        }
    }

    /// A gang member's turn: the gang's verdict, its incident, and the steps for this member.
    pub(super) async fn gang(
        &mut self,
        case: &Case<'_>,
        own: &Member,
        incident: &Option<Incident>,
    ) -> Result<()> {
        let Some(g) = case.gang() else { return Ok(()) };
        let (cfg, now) = (&self.ctx.cfg, case.now);
        let t = Timing::of(cfg);
        let rules = Rules { action: cfg.gang.action, straggler: cfg.gang.straggler, timing: t };
        let view = self.gangs.reads.read(self.ctx, g, own, false).await?;
        if !view.full {
            // Another member's agent reads the gang this poll interval and decides; this one
            // carries out a standing decision for its own member.
            let standing = view.state.current_decision().cloned();
            if let Some(d) = standing.filter(|d| gp::executable(d, own, now, &t)) {
                self.execute(case, g, &view.state, d).await?;
            }
            return Ok(());
        }
        let mut state = view.state;
        let members = gp::present(&view.members, now, &t);
        if gp::incident_over(&state, &members, now, &t) {
            self.close_gang_incident(case, g, &state).await?;
            state = GangState {
                restarted: state.current_decision().map(|d| d.decided).or(state.restarted),
                fruitless: state.fruitless.clone(),
                ..GangState::default()
            };
            self.gangs.reads.remember(g, &state);
        }
        let verdict = gp::verdict(&members, now);
        if let (GangVerdict::Hung { first }, None) = (&verdict, &state.incident) {
            state.incident = Some(self.open_gang_incident(case, g, first).await?);
            self.gangs.reads.remember(g, &state);
        }
        let own = members.iter().find(|m| m.id() == own.id()).unwrap_or(own);
        for step in gp::plan(&verdict, &state, &members, own, now, &rules) {
            let here = Here { g, own, members: &members, incident };
            self.gang_step_of_plan(case, &here, &mut state, step).await?;
        }
        Ok(())
    }

    /// One step of the gang's plan, as this member's agent carries it out.
    async fn gang_step_of_plan(
        &mut self,
        case: &Case<'_>,
        here: &Here<'_>,
        state: &mut GangState,
        step: GangStep,
    ) -> Result<()> {
        let (g, own, members, now) = (here.g, here.own, here.members, case.now);
        match step {
            GangStep::PageHung => self.pager().page_gang_hung(g, state, members, now).await,
            GangStep::PageEscalation { restarted } => {
                self.pager().page_gang_again(g, members, restarted, now).await
            }
            GangStep::PageStraggler => self.page_straggler(case, g, own).await,
            // `gang.straggler = "restart"`: the single-worker pipeline, for this member alone.
            GangStep::RestartAlone => self.consider_restart(case, here.incident).await,
            GangStep::Decide => {
                let planned = state.incident.as_ref();
                let pager = Pager::new(self.ctx, self.alerts, &mut self.gangs.sent);
                let (ctx, journal, reads) = (self.ctx, &mut *self.journal, &mut self.gangs.reads);
                let mut decider = GangDecider { ctx, pager, journal, reads, case, g, own, planned };
                let Some(d) = decider.decide(now).await? else { return Ok(()) };
                state.decision = Some(d.clone());
                self.gangs.reads.remember(g, state);
                if gp::executable(&d, own, now, &Timing::of(&self.ctx.cfg)) {
                    self.execute(case, g, state, d).await?;
                }
                Ok(())
            }
            GangStep::Execute => match state.current_decision().cloned() {
                Some(d) => self.execute(case, g, state, d).await,
                None => Ok(()),
            },
        }
    }

    async fn open_gang_incident(
        &mut self,
        case: &Case<'_>,
        g: &Gang,
        first: &str,
    ) -> Result<Incident> {
        let (key, now) = (self.ctx.keys.gang_incident(&g.id), case.now);
        let id = format!("g{}", crate::coord::lease::Lease::random_token());
        if self.ctx.coord.set_nx(&key, &Stamp::new(now, &id).to_string(), MARK_TTL).await? {
            let gang = &g.id;
            let detail = format!("gang {gang} stopped as a whole: no member progresses; the first to stop was {first}");
            self.journal.note(now, case.about().incident(&id), Code::GangHung, detail).await?;
            return Ok(Incident { started: now, id });
        }
        // Another member's agent opened it first: theirs stands.
        let theirs = GangState::decode(&self.ctx.coord.get_many(&[key]).await?);
        Ok(theirs.incident.unwrap_or(Incident { started: now, id }))
    }

    async fn close_gang_incident(
        &mut self,
        case: &Case<'_>,
        g: &Gang,
        state: &GangState,
    ) -> Result<()> {
        let Some(inc) = &state.incident else { return Ok(()) };
        let (k, now) = (&self.ctx.keys, case.now);
        if let (Some(d), false) = (state.current_decision(), self.ctx.cfg.dry_run) {
            // NB: the restart remembered before the incident goes (any closer writes the same
            // value): a close whose later write failed left the gang's next incident not
            // "again" — a `hung` page where the escalation was due — and never closed again.
            // As long as the incidents it marks as "again" may last (a day), not just the window
            // that opens them: the simulation's seed 4 saw an incident blocked past that window
            // page `hung` after its escalation.
            self.ctx.coord.set(&k.gang_restarted(&g.id), &d.decided.to_string(), MARK_TTL).await?;
        }
        if !self.ctx.coord.del_if_owner(&k.gang_incident(&g.id), &inc.encode()).await? {
            return Ok(());
        }
        let detail = match state.current_decision() {
            Some(d) => {
                self.ctx.coord.del(&[k.gang_decision(&g.id)]).await?;
                // Observe mode restarted nobody: no "again" for the next incident.
                let after = match self.ctx.cfg.dry_run {
                    true => "its decision (observe mode: nothing was restarted)",
                    false => "its restart",
                };
                format!("gang {}: incident over {} after {after}", g.id, human(now - d.decided))
            }
            None => format!("gang {}: the collective moves again; no restart", g.id),
        };
        self.pager().resolve_gang_alerts(&g.id, None).await;
        self.journal.note(now, case.about().incident(&inc.id), Code::GangClosed, detail).await
    }

    /// This member got past where its gang stopped since the gang's last decision: the run is
    /// over (compare-and-delete: a newer decision's run stands). Checked every cycle against the
    /// run as this agent last read it, so progress is seen while the gang trains, not only at
    /// its next hang. A failed delete is tried again next cycle.
    async fn end_gang_run(&mut self, gang: &str, own: &Member) {
        let Some(run) = self.gangs.reads.runs.get(gang) else { return };
        if !policy_fruitless::progressed(run, &[Beat::of_member(own)]) {
            return;
        }
        let key = self.ctx.keys.gang_fruitless(gang);
        if let Err(e) = self.ctx.coord.del_if_owner(&key, &run.encode()).await {
            tracing::warn!(error = %e, gang, "could not end the gang's run of fruitless restarts; trying again next cycle");
            return;
        }
        self.gangs.reads.runs.remove(gang);
    }

    /// This member's restart as the gang's decision asks: the ordinary pipeline under this
    /// node's lock and breaker (the fleet unit was the gang's), revalidated against the decision.
    async fn execute(
        &mut self,
        case: &Case<'_>,
        g: &Gang,
        state: &GangState,
        d: Decision,
    ) -> Result<()> {
        let Some(inc) = &state.incident else { return Ok(()) };
        let errored = case.status.is_some_and(|s| s.state == WorkerState::Error);
        let member = Case { v: if errored { Verdict::Errored } else { Verdict::Hung }, ..*case };
        let order = GangOrder { gang: g.id.clone(), decision: d };
        let since = case.status.and_then(|s| s.heartbeat).unwrap_or(inc.started);
        self.pipeline(&Act { case: &member, inc, since, order: Some(&order) }).run().await
    }
}
