//! A worker's pages that a pass notes in the trail, each sent through `super::pager`'s one way
//! out: hung or errored (with the GPU evidence), its alert-only episodes, the escalation. The
//! pipeline's pages (restarts that do not help, a runtime that refuses it, failed log
//! collection, `restarting` with the logs, a failed restart, the breaker and the fleet budget)
//! are sent where their steps are (`before_command`, `command`, `limits`); a gang's are
//! `super::gang_pages`.

use crate::alerts::AlertKind;
use crate::clock::{human, ms};
use crate::coord::Result;
use crate::hang::marks::MARK_TTL;
use crate::hang::model::{Episode, Incident};
use crate::hang::policy::Verdict;
use crate::hang::policy_pipeline::Unit;
use crate::hang::{policy_due, policy_record};
use crate::trail::Code;

use super::{Act, Case, RestartPath};

/// The kind of an episode's alert.
pub(super) fn episode_kind(e: Episode) -> AlertKind {
    match e {
        Episode::Unreachable => AlertKind::Unreachable,
        Episode::Stalled => AlertKind::Stalled,
        Episode::GpuFailed => AlertKind::GpuFailed,
        Episode::TpuFailed => AlertKind::TpuFailed,
        Episode::Paused => AlertKind::Paused,
        Episode::Exited => AlertKind::Exited,
    }
}

/// An episode's page: what it says, and since when.
fn episode_detail(case: &Case<'_>, e: Episode) -> String {
    let ahead = case.status.and_then(|s| policy_record::heartbeat_from_future(s, case.now));
    match e {
        Episode::Unreachable => match (case.invalid, ahead.map(human)) {
            (Some(invalid), _) => format!(
                "{invalid}; alert only until the record is fixed (other workers are judged as usual)"
            ),
            (None, Some(ahead)) => format!(
                "the record's heartbeat is {ahead} ahead of the coordinator's clock (milliseconds written where seconds belong?): the record is invalid, alert only until the worker writes seconds since the epoch"
            ),
            (None, None) => "status record missing or unreadable; alert only (the machine may be rebooting, partitioned or off on purpose)".into(),
        },
        Episode::Stalled => "heartbeat fresh but progress unchanged; alert only (long jobs legitimately look like this)".into(),
        Episode::GpuFailed => "the GPU under this worker has failed; a restart cannot fix hardware".into(),
        Episode::TpuFailed => "the node's TPU has failed; a restart cannot fix hardware".into(),
        Episode::Paused => "the container is paused (someone's decision); alert only, never restarted while paused".into(),
        Episode::Exited => "the container has exited and nothing runs in its place; alert only: Vigil never starts what someone stopped (a crash is for the runtime's restart policy)".into(),
    }
}

impl RestartPath<'_> {
    /// The hung / errored page, once per incident, with the GPU evidence beside it.
    pub(super) async fn alert_incident(&mut self, case: &Case<'_>, inc: &Incident) -> Result<()> {
        let kind = if case.v == Verdict::Errored { AlertKind::Errored } else { AlertKind::Hung };
        let wait = policy_due::restart_wait(case.v, &self.ctx.cfg.policy);
        let since = policy_due::condition_since(case.v, inc.started, case.marks, case.status);
        let mut detail = if case.alert_only() {
            "alert only: its restarts belong to its owner; Vigil will not restart it".to_string()
        } else {
            let due = (inc.started + ms(wait) - case.now).max(0);
            format!("restart due in {}", human(due))
        };
        if !self.gpu_evidence.is_empty() {
            // Application XIDs on the worker's GPU do not make the hardware unhealthy, but
            // they are the first thing a person wants to see next to a hang.
            let evidence = self.gpu_evidence.join("; ");
            detail.push_str(&format!("; GPU evidence: {evidence}"));
        }
        // Once per incident and verdict (the verdict names the page in the incident's key).
        // NB: `order` plays no part in paging (`act_alert`, `page_incident`, `about`).
        let act = Act { case, inc, since, order: None };
        let alert = self.pager().act_alert(kind, &act, case.now, detail);
        if !self.pager().page_incident(&act, case.v.as_str(), alert, case.now).await? {
            return Ok(());
        }
        let detail = format!("{} alert sent", kind.as_str());
        self.journal.note(case.now, act.about(), Code::Alerted, detail).await
    }

    /// An alert-only episode's page: the key is the episode itself (the first observer pages).
    pub(super) async fn open_episode(&mut self, case: &Case<'_>, e: Episode) -> Result<()> {
        let (kind, now) = (episode_kind(e), case.now);
        let since = case.marks.progress.as_ref().map(|(_, t)| *t).filter(|_| e == Episode::Stalled);
        let alert = self.pager().alert_for(kind, case, since, now, episode_detail(case, e));
        let key = self.ctx.keys.episode(case.worker(), e.as_str());
        if !self.pager().page_once(&key, MARK_TTL, alert, Unit::Worker, now).await? {
            return Ok(());
        }
        let detail = format!("{} alert sent", kind.as_str());
        self.journal.note(now, case.about(), Code::Alerted, detail).await
    }

    /// Still broken `escalate_after` past our restart: a person is paged, once.
    pub(super) async fn escalate(&mut self, case: &Case<'_>) -> Result<()> {
        let restarted = case.marks.restarted_at.unwrap_or(case.now);
        let detail = format!(
            "still broken {} after our restart; the restart did not fix it, a person is needed",
            human(case.now - restarted)
        );
        let alert =
            self.pager().alert_for(AlertKind::Escalation, case, Some(restarted), case.now, detail);
        let key = self.ctx.keys.escalated(case.worker());
        if !self.pager().page_once(&key, MARK_TTL, alert, Unit::Worker, case.now).await? {
            return Ok(());
        }
        let detail = "paged: restart did not recover the worker".to_string();
        self.journal.note(case.now, case.about(), Code::Escalated, detail).await
    }
}
