//! The restart command and how it ends: verified by the container's start time (restarted,
//! with the cooldown from the restart), or failed (paged once per incident, retried after a
//! backoff); and the claim written before the command, undone when the command does not run.

use crate::alerts::{AlertKind, Resolve};
use crate::clock::{brief, human, ms, Millis, Stamp};
use crate::coord::{Op, Result};
use crate::hang::context::Context;
use crate::hang::marks::{self, MARK_TTL};
use crate::hang::model::{Fruitless, Retry, WorkerStatus};
use crate::hang::policy::Verdict;
use crate::hang::policy_due;
use crate::hang::policy_fruitless::{self, Beat};
use crate::hang::policy_lost::IncidentTimes;
use crate::hang::policy_pipeline::Seen;
use crate::runtime::RuntimeError;
use crate::trail::Code;

use super::pipeline::Pipeline;
use super::short;

/// Where a settled fruitless run's line goes: beats newer than it may show progress.
#[derive(Clone, Copy)]
pub(super) enum Line {
    /// The claim's line stands.
    Kept,
    /// The restart's verification: the new incarnation runs from here.
    At(Millis),
    /// A failure seen here: the line moves no earlier than the claim's.
    NotBefore(Millis),
}

impl Pipeline<'_> {
    /// The restart call, bounded by `runtime.restart_timeout`: its answer, for `verify`.
    /// The way the controllers want it (`how`): a SIGKILL where a restart rule or a Job must
    /// see one, and where the controller makes the next pod, the pod failed and nothing awaited.
    pub(super) async fn command(&self) -> Result<(), RuntimeError> {
        let d = &self.ctx.cfg.runtime;
        let (c, rt) = (self.act.case.c, &self.ctx.runtime);
        let grace = if self.how.kills() { std::time::Duration::ZERO } else { d.stop_grace };
        let call = async {
            match self.how.restarted_in_place() {
                true => rt.restart(c, grace).await,
                false => rt.fail(c, grace, self.how.fails_pod()).await,
            }
        };
        let timeout = d.restart_timeout;
        tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| {
            Err(RuntimeError::Timeout { op: "restart", container: c.id.clone(), timeout })
        })
    }

    /// The restart's verification by the container's start time: restarted, or failed.
    /// Whether the command restarted the container (a new incarnation running: `Pass`, else
    /// `RestartFailed`), with what follows either way done: the cooldown and the trail, or the
    /// failure's page and backoff.
    pub(super) async fn verify(&mut self, call: Result<(), RuntimeError>) -> Result<Seen> {
        // NB: verify by the container's start time even when the call failed: a restart whose
        // reply was lost did happen, and treating it as failed would drop the cooldown and let
        // the next cycle restart the booting container again.
        let c = self.act.case.c;
        let after = self.ctx.runtime.successor(c).await;
        let restarted = match (&after, self.how.restarted_in_place()) {
            (Ok(Some(a)), true) => a.running && (a.id != c.id || a.started_at != c.started_at),
            // Stopped for its controller: the hung incarnation no longer runs (gone, exited,
            // or already followed by the kubelet's next attempt); the next incarnation is the
            // controller's (a new pod, a new group), verified by its beats.
            (Ok(Some(a)), false) => !a.running || a.id != c.id || a.started_at != c.started_at,
            (Ok(None), false) => true,
            _ => false,
        };
        let done = self.ctx.coord.time().await.ok();
        if restarted {
            let detail = self.restarted_detail(call, done.unwrap_or(self.now));
            self.restarted(detail, done).await?;
            return Ok(Seen::Pass);
        }
        // What was observed of a restart that did not leave a running new incarnation: the call's
        // answer and what the container looked like afterwards, for the page and the trail.
        let observed = match &after {
            Ok(Some(a)) if a.id != c.id || a.started_at != c.started_at => {
                "the container started again and exited at once (it is not running)".to_string()
            }
            Ok(Some(_)) => "its start time did not change (it was not restarted)".to_string(),
            Ok(None) => "the container disappeared".to_string(),
            Err(e) => format!("it could not be inspected afterwards ({e})"),
        };
        let why = match call {
            Err(e) => format!("the restart call failed ({e}) and {observed}"),
            Ok(()) => format!("the restart call returned, but {observed}"),
        };
        self.restart_failed(why, done.unwrap_or(self.now)).await?;
        Ok(Seen::RestartFailed)
    }

    /// A verified restart (`verified`: the store's clock after it, when it answered): the
    /// incident over, the time lost counted, the run settled, the cooldown, the trail's `detail`.
    async fn restarted(&mut self, detail: String, verified: Option<Millis>) -> Result<()> {
        let act = self.act;
        // NB: the marker's time is the first instant a heartbeat can only be the new
        // incarnation's. Without the store's clock after the restart there is no such instant
        // (the decision's is before the old one was stopped): then none, and the worker boots
        // for the whole cooldown, as before booting could end early.
        let booted_after = verified.unwrap_or(Millis::MAX);
        let done = verified.unwrap_or(self.now);
        let (k, w, c) = (&self.ctx.keys, act.case.worker(), act.case.c);
        self.ctx.coord.del(&[k.incident(w), k.suspect(w)]).await?;
        self.pager.resolve_alerts(w, Resolve::IncidentCleared).await;
        // NB: the cooldown runs from the restart, not from the claim before it: a pause between
        // the two, or a slow restart, must not shorten it. Same marker, fresh TTL, and its time
        // is the verification's: a heartbeat after it is the new incarnation's first beat,
        // which ends the booting (`policy_record::booted`).
        let marker = format!("{}{}", marks::claim(booted_after, &act.inc.id, c), marks::DONE);
        // NB: the time lost is kept, and the run of fruitless restarts settled (the old
        // incarnation's last step taken in, the line drawn at the verification), before the
        // marker goes up: the first beat may be seen by another instance the moment it does,
        // and a marker whose write lost its reply leaves no later moment to settle the run in
        // (the simulation's seed 89191: a run settled after the marker was never settled, and
        // the new incarnation's beats short of the old one's last step ended it).
        self.count_lost(verified).await?;
        self.settle_run(verified.map_or(Line::Kept, Line::At)).await;
        self.ctx.coord.set(&k.cooldown(w), &marker, self.ctx.cfg.policy.cooldown).await?;
        self.ctx.metrics.decisions.restart(act.case.v.as_str(), "restarted");
        self.ctx.metrics.workers.restarted(w, self.now);
        self.journal.note(done, act.about(), Code::Restarted, detail).await
    }

    /// What the trail says of a verified restart: how long the hang and the restart took, the
    /// controllers' way (`how`), why a restart waited out the whole stop grace, and the call's
    /// error.
    fn restarted_detail(&self, call: Result<(), RuntimeError>, done: Millis) -> String {
        let (c, how) = (self.act.case.c, &self.how);
        let started = self.now;
        let verb = match how.fails_pod() {
            true => "failed (SIGKILL, exit 137) for its controller",
            false => "restarted",
        };
        let (name, id, hung_for) = (&c.name, short(&c.id), human(started - self.act.since));
        let took = brief(std::time::Duration::from_millis((done - started).max(0) as u64));
        let cooldown = humantime::format_duration(self.ctx.cfg.policy.cooldown);
        let mut detail = format!(
            "{verb} container {name} ({id}) after {hung_for}; the restart took {took}; cooldown {cooldown}"
        );
        // NB: a worker that does not exit on SIGTERM (Python or a shell as PID 1, a handler
        // that waits on a stuck loop) holds every restart for the whole stop grace: say so where
        // the operator reads the restart, with the fix.
        if !how.how().is_empty() {
            detail.push_str(&format!(" ({})", how.how()));
        }
        let grace = self.ctx.cfg.runtime.stop_grace;
        // A stop that is a SIGKILL at once (the controllers' way) waits out no grace.
        if !how.kills() && done - started >= ms(grace) {
            let grace = humantime::format_duration(grace);
            detail.push_str(&format!(
                " (the worker did not exit on SIGTERM: its stop waited out runtime.stop_grace, {grace}, then SIGKILL; run it under an init, `docker run --init`, or let it exit on SIGTERM)"
            ));
        }
        if let Err(e) = call {
            detail.push_str(&format!(" (the restart call reported: {e})"));
        }
        detail
    }

    /// The time the incident lost up to the new incarnation: counted now (the cause's and the
    /// restart's), and kept for its first beat, which completes it (`end_booting`). Without the
    /// store's clock after the restart there is no such instant: nothing is counted.
    async fn count_lost(&self, verified: Option<Millis>) -> Result<()> {
        let Some(incarnation) = verified else { return Ok(()) };
        let act = self.act;
        let key = self.ctx.keys.lost(act.case.worker());
        // NB: a restart after one whose incarnation never beat counts from where that one's
        // count ended (its verification), never again from the old incarnation's last beat.
        let held = self.ctx.coord.get(&key).await?.and_then(|t| IncidentTimes::decode(&t));
        // The later of the two (`None` is the least).
        let counted_to = held.map(|t| t.incarnation).max(act.case.marks.restarted_at);
        let times = IncidentTimes {
            since: counted_to.map_or(act.since, |t| act.since.max(t)),
            verdict: act.inc.started,
            command: self.now,
            incarnation,
            incident: act.inc.id.clone(),
        };
        let (p, lost) = (times.phases(incarnation), &self.ctx.metrics.lost);
        // The cause the incident's time before the command is lost to.
        let cause = if act.case.v == Verdict::Errored { "error" } else { "hang" };
        lost.add(cause, p.detection + p.decision, self.now);
        lost.add("restart", p.restart, incarnation);
        self.ctx.coord.set(&key, &times.encode(), self.ctx.cfg.policy.cooldown * 2).await
    }

    /// The restart seen done or failed, for the run of fruitless restarts it belongs to: the
    /// worker's own, or — a gang member's — the member's line in its gang's run.
    async fn settle_run(&self, line: Line) {
        let w = self.act.case.worker();
        match self.act.order {
            None => settle_fruitless(self.ctx, w, line, true).await,
            Some(_) => settle_gang_line(self.ctx, w, line, Millis::MIN).await,
        }
    }

    /// A failed restart pages at once — the first of its incident; later ones update that
    /// page without paging again — and releases the dedup key and markers so that a later
    /// cycle retries, after a backoff from the stop grace (see [`policy_due::retry_backoff`]).
    async fn restart_failed(&mut self, why: String, done: Millis) -> Result<()> {
        let act = self.act;
        self.ctx.metrics.backends.runtime_error();
        self.ctx.metrics.decisions.restart(act.case.v.as_str(), "failed");
        let (k, w) = (self.ctx.keys.clone(), act.case.worker());
        let earlier = act.case.marks.retry.as_ref().filter(|r| r.incident == act.inc.id);
        let failures = earlier.map_or(1, |r| r.failures.saturating_add(1));
        let p = &self.ctx.cfg.policy;
        let wait = policy_due::retry_backoff(failures, self.ctx.cfg.runtime.stop_grace, p.cooldown);
        let retry = Retry { incident: act.inc.id.clone(), failures, not_before: done + ms(wait) };
        let (name, retry_in) = (&act.case.c.name, human(ms(wait)));
        let detail = format!("restart of container {name} failed (attempt {failures} of this incident): {why}; retried in {retry_in} while it is hung and running");
        // NB: the page goes out even when the coordinator fails below: a failed restart is a
        // person's business at once. Only the first failure of an incident pages; later ones
        // update its page.
        let mut alert = self.pager.act_alert(AlertKind::RestartFailed, act, done, detail);
        alert.attempt = Some(failures);
        match self.pager.page_incident(act, "restart-failed", alert.clone(), done).await {
            Ok(true) => {}
            Ok(false) => {
                (alert.page, alert.update) = (false, true);
                self.ctx.notifier.send(&alert).await;
            }
            // NB: a failed claim (the coordinator is down) pages too: a repeat beats silence.
            Err(_) => self.ctx.notifier.send(&alert).await,
        }
        self.ctx.coord.set(&k.retry(w), &marks::encode_retry(&retry), MARK_TTL).await?;
        self.ctx.coord.del(&[k.alert_dedup(&act.inc.id, "restart"), k.restarted(w)]).await?;
        // NB: our claim only, compare-and-delete: a restart that failed to our eyes may have
        // run, and an HA partner that saw its new incarnation meanwhile wrote a cooldown of its
        // own over the claim — deleted, the next restart came inside it (simulation seed 59582).
        let claim = marks::claim(self.now, &act.inc.id, act.case.c);
        self.ctx.coord.del_if_owner(&k.cooldown(w), &claim).await?;
        // NB: the fruitless run keeps this attempt: a restart verified as failed may still
        // run later (a slow runtime), and a failed restart brought no progress either. The old
        // incarnation's last step is taken in, and the line moves to the failure if that is
        // later than the claim's, never earlier: a restart that failed only to our eyes (its
        // reply lost, the check refused) may have run, or may run yet, and the old
        // incarnation's beats in the slow runtime's window would read as its progress (the
        // simulation's seed 171192: the run ended, and a fruitless restart went through).
        self.settle_run(Line::NotBefore(done)).await;
        let why = format!("{why}; attempt {failures}, next not before {retry_in}");
        self.journal.note(done, act.about(), Code::RestartFailed, why).await
    }

    /// Release the claim `write_restart_markers` made (at the pass's clock) for a restart that
    /// will not run: our marker goes by compare-and-delete, never another instance's, and what
    /// the claim wrote over or removed is put back as the cycle read it. After a failed write (a
    /// lost reply may hide that the claim was made) a claim left in place would read as our own
    /// restart booting for a cooldown and a lock TTL (the incident timer dropped), though no
    /// restart ran (simulation seed 9006434). Best-effort: if this fails too, the claim expires.
    pub(super) async fn release_claim(&self) {
        let act = self.act;
        let (k, w, m) = (&self.ctx.keys, act.case.worker(), act.case.marks);
        let marker = marks::claim(self.now, &act.inc.id, act.case.c);
        let Ok(true) = self.ctx.coord.del_if_owner(&k.cooldown(w), &marker).await else { return };
        // A restart that did not run (or failed) gives back what its claim drew: the last
        // restart's record and its escalation page (the claim wrote its own record over them),
        // the error timer (an errored worker refused for a passing reason — its container
        // paused a moment, the lock short — must not wait `error_for` again), and the worker's
        // run of fruitless restarts as it was before the claim (best-effort: a count left too
        // high stops restarts one early, never one late), or a gang member's own line (its old
        // incarnation runs on).
        let (run_key, run) = match act.order {
            None => (k.fruitless(w), m.fruitless.as_ref().map(Fruitless::encode)),
            Some(_) => (k.gang_line(w), m.gang_line.map(|t| t.to_string())),
        };
        // NB: the escalation page's claim is only ever read as present or not.
        let escalated = m.escalated.then(|| Stamp::new(self.now, "restored").to_string());
        let before = [
            (k.restarted(w), m.restarted_at.map(|t| t.to_string()), MARK_TTL),
            (k.escalated(w), escalated, MARK_TTL),
            (k.error_since(w), m.error_since.map(|t| t.to_string()), MARK_TTL),
            (run_key, run, marks::FRUITLESS_TTL),
        ];
        let (mut put, mut gone) = (Vec::new(), Vec::new());
        for (key, value, ttl) in before {
            match value {
                Some(value) => put.push(Op::Set { key, value, ttl }),
                None => gone.push(key),
            }
        }
        let _ = self.ctx.coord.batch(&put).await;
        let _ = self.ctx.coord.del(&gone).await;
    }

    /// The run of fruitless restarts as the claim leaves it. NB: counted at the claim, like the
    /// restart record: a restart whose verification never comes (we die mid-command) still
    /// counts, and one that does not run is given back.
    fn claimed_run(&self) -> Op {
        let act = self.act;
        let (k, w) = (&self.ctx.keys, act.case.worker());
        // NB: a beat that counts as progress must be the new incarnation's; the old one may
        // beat until the command, which runs while the lock holds (the claim checked its TTL):
        // until its verification says better (`settle_run`), only later beats count — the
        // worker's own run's, or this member's in its gang's run (a gang's run is counted at its
        // decision, before any member's restart runs).
        let line = self.now + ms(self.ctx.cfg.safety.lock_ttl);
        let (key, value) = match act.order {
            None => {
                let status = act.case.status;
                let before = act.case.marks.fruitless.as_ref();
                let before = before.filter(|f| policy_fruitless::same_job(f, status));
                let beats = Beat::of_worker(status);
                let mut run = policy_fruitless::after_restart(before, beats.as_slice(), self.now);
                run.last = line;
                run.job = status.and_then(|s| s.job.clone()).or(run.job);
                (k.fruitless(w), run.encode())
            }
            Some(_) => (k.gang_line(w), line.to_string()),
        };
        Op::Set { key, value, ttl: marks::FRUITLESS_TTL }
    }

    /// Claim the restart with the cooldown marker and record it. `false`: the claim failed.
    pub(super) async fn write_restart_markers(&self) -> Result<bool> {
        let act = self.act;
        let (k, w) = (&self.ctx.keys, act.case.worker());
        let marker = marks::claim(self.now, &act.inc.id, act.case.c);
        // NB: a claim (SET NX), not a plain write. Revalidation saw no marker, so one here now
        // is another instance's restart that got past a lost lock (TTL expiry in a pause, a
        // failover that forgot it): the first claim wins, and at most one restart runs per
        // cooldown whatever happened to the lock.
        // NB: the claim outlives our lock. Should we die mid-command, the instance that finds
        // the new incarnation once our lock has expired must still find the claim, or it would
        // record our restart as someone else's. The cooldown proper runs from the verification,
        // which rewrites the marker with the cooldown as its TTL.
        let claim_ttl = self.ctx.cfg.policy.cooldown + self.ctx.cfg.safety.lock_ttl;
        if !self.ctx.coord.set_nx(&k.cooldown(w), &marker, claim_ttl).await? {
            return Ok(false);
        }
        let record = Op::Set { key: k.restarted(w), value: self.now.to_string(), ttl: MARK_TTL };
        // NB: one round trip for both: the claim is followed by the command as closely as
        // before the fruitless run was counted.
        self.ctx.coord.batch(&[record, self.claimed_run()]).await?;
        // The error timer must not survive our restart, or a record still saying `error` after
        // the cooldown would count as errored at once instead of after `error_for` (a claim
        // given back puts it back: `release_claim`).
        self.ctx.coord.del(&[k.escalated(w), k.error_since(w)]).await?;
        Ok(true)
    }
}

/// A gang member's line, where its restart was seen done or failed (`Keys::gang_line`): its
/// old incarnation may beat until the command runs, and a beat of it past the gang's step
/// ended the gang's run. Only a line drawn by the claim (at `claimed` or later: an older
/// restart's is left as it is) is moved. Best-effort: without it the claim's line stands
/// (only beats after the lock's end count).
pub(super) async fn settle_gang_line(ctx: &Context, worker: &str, line: Line, claimed: Millis) {
    let (Line::At(t) | Line::NotBefore(t)) = line else { return };
    let key = ctx.keys.gang_line(worker);
    let held = ctx.coord.get(&key).await.ok().flatten();
    let held = held.map(|h| h.parse::<Millis>().unwrap_or(Millis::MIN));
    let Some(held) = held.filter(|&h| h >= claimed) else { return };
    let to = if matches!(line, Line::NotBefore(_)) { held.max(t) } else { t };
    let _ = ctx.coord.set(&key, &to.to_string(), marks::FRUITLESS_TTL).await;
}

/// The fruitless run's restart, seen done or failed: progress past where the worker stopped
/// must come in a beat newer than the run's `line` (the old incarnation may have beaten
/// between the claim and the command), and with `take_past`, where it stopped is its
/// record's last position before then. Best-effort: without it the claim's mark stands
/// (only beats after the lock's end count).
pub(super) async fn settle_fruitless(ctx: &Context, worker: &str, line: Line, take_past: bool) {
    let key = ctx.keys.fruitless(worker);
    let raw = ctx.coord.get(&key).await.ok().flatten();
    let Some(mut run) = raw.and_then(|r| Fruitless::decode(&r)) else { return };
    // The old incarnation's beats up to `upto` are where it stopped; newer ones than `last`
    // may show progress.
    let (upto, last) = match line {
        Line::Kept => (None, run.last),
        Line::At(t) => (Some(t), t),
        Line::NotBefore(t) => (Some(t), run.last.max(t)),
    };
    // NB: without the record, the line's time alone still puts the old incarnation's
    // beats (all before the command) behind it.
    if take_past {
        if let Ok(fields) = ctx.coord.hgetall(&ctx.keys.status(worker)).await {
            let old = WorkerStatus::from_fields(&fields)
                .filter(|s| upto.is_none_or(|t| s.heartbeat.is_some_and(|hb| hb <= t)));
            run.past = run.past.max(policy_fruitless::position(old.as_ref()));
        }
    }
    run.last = last;
    let _ = ctx.coord.set(&key, &run.encode(), marks::FRUITLESS_TTL).await;
}
