//! One worker's evaluation, top to bottom: what it stands on (its record, its marks read again
//! when a new incarnation was just recorded, a finished boot ended), its verdict and plan, the
//! stage of its incident exported, and the plan's effects carried out in order — a gang member's
//! gang step with its entry in the view, the restart pipeline when the incident's life says the
//! restart is due.

use crate::clock::{human, Millis};
use crate::config::PolicyConfig;
use crate::coord::{Result, WorkerRead};
use crate::hang::context::Context;
use crate::hang::journal::About;
use crate::hang::marks::{self, MARK_TTL};
use crate::hang::model::{Incident, WorkerStatus};
use crate::hang::policy::{self, Effect, Verdict};
use crate::hang::policy_lost::IncidentTimes;
use crate::hang::{policy_due, policy_life, policy_record, policy_rhythm};
use crate::metrics::WorkerSample;
use crate::runtime::container::Container;
use crate::trail::Code;

use super::{Act, Case, RestartPath};

/// The record of `c`'s worker in a read, or why it cannot be read. Its gang is the one its
/// membership gives.
pub(super) fn status_of(
    ctx: &Context,
    c: &Container,
    read: &WorkerRead,
) -> (Option<WorkerStatus>, Option<String>) {
    // NB: a record Redis refuses to read as a hash (a key of another type, bytes that are
    // not UTF-8) is that worker's problem only: no record (unreachable, one alert naming the
    // key and the problem), and the cycle goes on. Only a transport failure fails closed.
    let mut status = match &read.record {
        Ok(fields) => policy_record::status_of_record(fields, read.now, &ctx.cfg.policy),
        Err(detail) => {
            let key = ctx.keys.status(&c.worker);
            return (None, Some(format!("the status record {key} cannot be read: {detail}")));
        }
    };
    // NB: the pod's labels win over the record, and a record names only a gang of its own
    // namespace (`crate::hang::policy_membership`): no tenant joins another's job. The verdict
    // and the last moment's revalidation read the same membership.
    if let Some(s) = status.as_mut() {
        s.gang = crate::hang::policy_membership::of_container(c, s.gang.as_ref()).gang;
    }
    (status, None)
}

impl RestartPath<'_> {
    /// A restarted worker's first beat ends its booting: its cooldown marker goes
    /// (compare-and-delete: never a newer claim), the trail says so, and the time its incident
    /// lost is completed. True when the marker went.
    async fn end_booting(
        &mut self,
        c: &Container,
        marker: &str,
        status: Option<&WorkerStatus>,
        now: Millis,
    ) -> Result<bool> {
        let after = marks::booted_after(marker);
        if !policy_record::booted(after, status) {
            return Ok(false);
        }
        if !self.ctx.coord.del_if_owner(&self.ctx.keys.cooldown(&c.worker), marker).await? {
            return Ok(false);
        }
        let beat = status.and_then(|s| s.heartbeat).unwrap_or(now);
        let took = human((beat - after.unwrap_or(beat)).max(0));
        let detail = format!("first beat {took} after the restart: booting over, watched as usual (a new hang is a new incident)");
        let about = About::worker(&c.worker, Verdict::Booting);
        self.journal.note(now, about, Code::Booted, detail).await?;
        // The first beat completes the time its incident lost (`crate::hang::policy_lost`): the
        // recovery counted, the time to recovery observed, the whole in the trail (`time-lost`).
        let key = self.ctx.keys.lost(&c.worker);
        let Some(raw) = self.ctx.coord.get(&key).await? else { return Ok(true) };
        // NB: compare-and-delete: of two instances that saw the first beat, one counts it. A
        // record of another incident (ours, then someone else's restart) is dropped uncounted.
        if !self.ctx.coord.del_if_owner(&key, &raw).await? {
            return Ok(true);
        }
        let incident = marks::claimed_incident(marker);
        let times = IncidentTimes::decode(&raw).filter(|t| Some(t.incident.as_str()) == incident);
        let Some(times) = times else { return Ok(true) };
        let p = times.phases(beat);
        self.ctx.metrics.lost.add("restart", p.recovery, now);
        self.ctx.metrics.lost.recovered(p.total());
        let about = About::worker(&c.worker, Verdict::Booting).incident(&times.incident);
        self.journal.note(now, about, Code::TimeLost, p.describe()).await?;
        Ok(true)
    }

    /// Evaluate one worker and carry out the policy's effects in order: first what it stands on
    /// (its record, its gang scoped by the tenancy rule, and its marks, read again when a new
    /// incarnation was just recorded, a finished boot ended), then its verdict and plan.
    /// Coordinator errors abort the evaluation (fail closed): nothing after a failed read or
    /// write is done on stale knowledge.
    pub(crate) async fn evaluate(
        &mut self,
        c: &Container,
        mut read: WorkerRead,
    ) -> Result<Verdict> {
        // A new incarnation changes the marks (its cooldown, dropped timers): read them again
        // (one more round trip, only then).
        let mut decoded = marks::decode(&read.values);
        let tracked = self.track_incarnation(c, read.now, &decoded).await?;
        if tracked {
            read = marks::read(self.ctx.coord.as_ref(), &self.ctx.keys, &c.worker).await?;
            decoded = marks::decode(&read.values);
        }
        let now = read.now;
        let (status, invalid) = status_of(self.ctx, c, &read);
        // NB: only once the new incarnation is recorded (not in the cycle that records it).
        let booting = decoded.cooldown.as_deref().filter(|_| !tracked && decoded.marks.cooldown);
        if let Some(marker) = booting {
            decoded.marks.cooldown = !self.end_booting(c, marker, status.as_ref(), now).await?;
        }
        let marks = &decoded.marks;
        let in_gang = status.as_ref().is_some_and(|s| s.gang.is_some());
        // NB: a gang member's rhythm serves only its learned restart rule (its own verdict is the
        // fixed rule's): not learned, nor written to Redis, without `learned.restarts`.
        if !in_gang || self.ctx.cfg.policy.learned.restarts {
            self.learn(c, marks, status.as_ref(), tracked || marks.cooldown, now);
        }
        // The rule the worker's verdict is judged by: its learned silence, or — for a gang member
        // — the fixed rule.
        let cfg = &*policy_rhythm::judged_by(&self.ctx.cfg.policy, self.rhythm, status.as_ref());
        let v = policy::verdict(status.as_ref(), marks, self.node, now, cfg);
        let mut effects = policy::plan(v, status.as_ref(), marks, now, cfg);
        if in_gang {
            // The gang's turn comes once the member is stale by the rule its entry carries.
            let within = self.judge().member_rules(status.as_ref(), marks, now);
            effects = policy::for_gang(effects, status.as_ref(), marks, now, &within);
        }
        // What the cooldown marker says of its restart, and whether the node lock is held.
        let held = (decoded.claim(), decoded.locked);
        let case =
            Case { c, v, status: status.as_ref(), marks, invalid: invalid.as_deref(), held, now };
        self.export(&case, &effects, cfg);
        self.carry_out(&case, effects).await?;
        Ok(v)
    }

    /// The worker's verdict and the stage this cycle leaves it in (its sighting, timer and
    /// escalation written), due by the rule its restart is judged by (learned or fixed).
    fn export(&self, case: &Case<'_>, effects: &[Effect], cfg: &PolicyConfig) {
        let left = policy_life::project(case.marks, effects, case.now);
        let due_by = self.judge().restart_rules(case.status, case.marks, case.now);
        let inc = left.incident.as_ref();
        let stage = policy_life::stage(&left, inc, case.held, case.v, case.now, &due_by);
        self.ctx.metrics.decisions.verdict(case.v.as_str());
        self.ctx.metrics.workers.observe(WorkerSample {
            worker: &case.c.worker,
            state: case.v.as_str(),
            stage: stage.as_str(),
            now: case.now,
            heartbeat: case.status.and_then(|s| s.heartbeat),
            restarted: case.marks.restarted_at,
            silence: case.status.map(|s| policy_record::allowed_silence(s, cfg)),
        });
    }

    /// The plan's effects in order; a gang member's gang step with its entry in the view.
    async fn carry_out(&mut self, case: &Case<'_>, effects: Vec<Effect>) -> Result<()> {
        let own = self.member_entry(case).await;
        if let (Some(g), false) = (case.gang(), effects.contains(&Effect::Gang)) {
            // Its member is fine: the gang alerts this agent sent for it are over.
            self.pager().resolve_gang_alerts(&g.id, Some(case.worker())).await;
        }
        let mut incident = case.marks.incident.clone();
        for effect in effects {
            match (effect, &own) {
                (Effect::Gang, Some(own)) => self.gang(case, own, &incident).await?,
                (Effect::Gang, None) => {}
                (effect, _) => self.apply(case, effect, &mut incident).await?,
            }
        }
        // NB: after the hang path's effects, and never failing them: slowness is paged, and
        // its bookkeeping waits for the next cycle when the coordinator does not answer.
        match &own {
            Some(own) => {
                if let Err(e) = self.pace_watch().look(case, own).await {
                    tracing::warn!(worker = %case.c.worker, error = %e, "the gang's pace could not be judged this cycle");
                }
            }
            // No member now (no gang, no entry): nothing of a slow episode is this worker's.
            None => self.pace.forget_episode(),
        }
        Ok(())
    }

    /// Run the pipeline for the worker's own incident when its life says the restart is due
    /// (`Stage::runs_pipeline`: by the incident's age under the restart's rule, learned or
    /// fixed, and past a failed restart's backoff) and the worker is stale by that rule.
    pub(super) async fn consider_restart(
        &mut self,
        case: &Case<'_>,
        incident: &Option<Incident>,
    ) -> Result<()> {
        let Some(inc) = incident else { return Ok(()) };
        let now = case.now;
        // NB: a hang found by the worker's learned rhythm is restarted only once the fixed rule
        // finds it too, unless the rhythm the coordinator holds may restart it
        // (`policy_rhythm::restart_policy`: `policy.learned.restarts`).
        let rules = self.judge().restart_rules(case.status, case.marks, now);
        let stage = policy_life::stage(case.marks, Some(inc), case.held, case.v, now, &rules);
        if !stage.runs_pipeline()
            || !policy_due::stale_by_restart_rule(case.v, case.status, now, &rules)
        {
            return Ok(());
        }
        let since = policy_due::condition_since(case.v, inc.started, case.marks, case.status);
        self.pipeline(&Act { case, inc, since, order: None }).run().await
    }

    /// One effect of the plan. `incident` is the shared timer as this cycle knows it (opened by
    /// `OpenIncident`, read by the alert and the restart).
    async fn apply(
        &mut self,
        case: &Case<'_>,
        effect: Effect,
        incident: &mut Option<Incident>,
    ) -> Result<()> {
        let (k, w, now) = (self.ctx.keys.clone(), case.worker(), case.now);
        match effect {
            Effect::RecordSuspect { heartbeat } => self.record_suspect(case, heartbeat).await,
            Effect::ClearSuspect => self.ctx.coord.del(&[k.suspect(w)]).await,
            Effect::MarkErrorSince => {
                self.ctx.coord.set_nx(&k.error_since(w), &now.to_string(), MARK_TTL).await.map(drop)
            }
            Effect::ClearErrorSince => self.ctx.coord.del(&[k.error_since(w)]).await,
            Effect::RecordProgress(value) => {
                // NB: written with the node's once-per-cycle batch, not a round trip per worker
                // per cycle: progress feeds the stalled alert only, and a cycle that fails
                // before the batch records it on the next.
                let v = crate::clock::Stamp::new(now, value).to_string();
                let ttl = crate::hang::marks::MARK_TTL;
                self.deferred.push(crate::coord::Op::Set { key: k.progress(w), value: v, ttl });
                Ok(())
            }
            Effect::ClearProgress => self.ctx.coord.del(&[k.progress(w)]).await,
            Effect::ClearIncident(end) => self.clear_incident(case, end).await,
            Effect::ForgetRestart => self.forget_restart(case).await,
            // NB: only the run read this cycle: another instance's claim meanwhile wrote a
            // newer one, which must stand.
            Effect::ClearFruitless => match case.marks.fruitless.as_ref().map(|f| f.encode()) {
                Some(f) => self.ctx.coord.del_if_owner(&k.fruitless(w), &f).await.map(drop),
                None => Ok(()),
            },
            Effect::CloseEpisode(e) => self.close_episode(case, e).await,
            Effect::OpenEpisode(e) => self.open_episode(case, e).await,
            Effect::OpenIncident => {
                *incident = self.open_incident(case).await?;
                Ok(())
            }
            Effect::Escalate => self.escalate(case).await,
            Effect::AlertIncident => match incident {
                Some(inc) => self.alert_incident(case, inc).await,
                None => Ok(()),
            },
            Effect::ConsiderRestart => self.consider_restart(case, incident).await,
            // Carried out by `carry_out`, which holds the member's entry.
            Effect::Gang => Ok(()),
        }
    }
}
