//! The controller's checkpoint rounds: a notice's round recorded when it ends, a round asked
//! directly (`vigil drill`, the scenarios), and SIGTERM's — the round under way waited for, or
//! the workers asked when the node is going away — always recorded before the grace ends.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::OnSigterm;
use crate::maintenance::checkpoint::trail_line;
use crate::maintenance::request::{Outcome, WorkerResult};
use crate::trail::Code;
use crate::vocab::node::EventType;
use crate::vocab::node_info::NodeInfo;
use crate::vocab::stand_down::going_away;

use super::{Controller, RoundResult, Rounds};

/// The longest the SIGTERM path waits to read the Node afresh (the grace period is running).
const FRESH_READ: Duration = Duration::from_secs(3);

/// A SIGTERM this soon after a checkpoint round does not ask the workers again: a preemption's
/// own SIGTERM follows its checkpoint within seconds.
const RECENT_ROUND: Duration = Duration::from_secs(60);

/// After SIGTERM the round must be over this long before `checkpoint.grace` ends: one second for
/// the trail, the annotation and the Event, and the last second is the drain's guard (`crate::app`).
const RECORD_RESERVE: Duration = Duration::from_secs(2);

impl Controller {
    /// A round that ended: record it (a round that panicked is logged, not recorded).
    pub(super) async fn round_done(&mut self, done: Result<RoundResult, tokio::task::JoinError>) {
        match done {
            Ok((reason, results)) => self.record_round(reason, &results).await,
            Err(e) if e.is_cancelled() => {}
            Err(e) => tracing::error!(error = %e, "a checkpoint round failed"),
        }
    }

    /// Ask every worker to checkpoint, wait, and record the outcome everywhere.
    pub async fn checkpoint(&mut self, reason: &str, budget: Duration) -> Vec<WorkerResult> {
        let results = self.rounds.request(reason, budget).await;
        self.record_round(reason, &results).await;
        results
    }

    /// A finished round: the trail per worker, the Node's last-checkpoint annotation, an Event.
    async fn record_round(&mut self, reason: &str, results: &[WorkerResult]) {
        let now = self.now().await;
        self.last_round_ended = Some(Instant::now());
        self.lose_to_round(now);
        let summary = self.rounds.finish(reason, results, now);
        for r in results {
            let (code, detail) = trail_line(reason, r);
            self.note_about(&r.worker, code, detail).await;
        }
        self.node.view.last_checkpoint = Some(summary.clone());
        self.node.publish().await;
        let acked = results.iter().all(|r| r.outcome == Outcome::Acked);
        let kind = if acked { EventType::Normal } else { EventType::Warning };
        let message = format!("checkpoint requested ({summary})");
        self.node.event("VigilCheckpoint", &message, kind).await;
    }

    /// SIGTERM: a round under way (the notice's) is the checkpoint: wait for it and record
    /// it; otherwise ask the workers, unless a round ended moments ago. Either way the round is
    /// over [`RECORD_RESERVE`] before the grace period ends, so its outcome is always recorded:
    /// a round still waiting then is cut short and recorded as such.
    pub(super) async fn on_sigterm(&mut self, rounds: &mut Rounds) {
        let on_sigterm = self.cfg.checkpoint.on_sigterm;
        let signalled = self.term_at.get().copied().unwrap_or_else(Instant::now);
        let record_by = signalled + self.cfg.checkpoint.grace.saturating_sub(RECORD_RESERVE);
        if !rounds.is_empty() {
            return self.finish_round(rounds, record_by).await;
        }
        let ended_ago = self.last_round_ended.map(|t| t.elapsed());
        let why = match on_sigterm {
            OnSigterm::Never => None,
            OnSigterm::Always => Some("checkpoint.on_sigterm = always".to_string()),
            OnSigterm::NodeGoingAway => {
                going_away(self.state.phase, self.fresh_node().await.as_ref())
            }
        };
        let (ask, detail) = sigterm_decision(on_sigterm, why, ended_ago);
        self.note(Code::AgentStopping, detail).await;
        if ask {
            let left = record_by.saturating_duration_since(Instant::now());
            let budget = self.cfg.checkpoint.sigterm_budget.min(left);
            self.checkpoint("agent-sigterm", budget).await;
        }
    }

    /// SIGTERM during a round: it is the checkpoint. Wait for it until `record_by`, then record
    /// it as cut short.
    async fn finish_round(&mut self, rounds: &mut Rounds, record_by: Instant) {
        loop {
            match tokio::time::timeout_at(record_by, rounds.join_next()).await {
                Ok(Some(done)) => self.round_done(done).await,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        rounds.abort_all();
        tracing::error!("the checkpoint round under way did not finish before the grace period: recording it as cut short");
        let grace = self.cfg.checkpoint.grace;
        let reserve = RECORD_RESERVE.as_secs();
        let grace_text = humantime::format_duration(grace);
        let cut = WorkerResult {
            worker: "*".into(),
            method: "none",
            outcome: Outcome::TimedOut,
            waited: grace.saturating_sub(RECORD_RESERVE),
            detail: format!("the round under way was cut short {reserve}s before checkpoint.grace ({grace_text}) ended"),
        };
        self.record_round("sigterm-cut-short", &[cut]).await;
    }

    /// The Node as it is now (a read bounded by a few seconds: the grace is running), else as
    /// last read.
    async fn fresh_node(&mut self) -> Option<NodeInfo> {
        if let Some(reader) = &self.node_reader {
            let read = tokio::time::timeout(FRESH_READ, reader.read(&self.cfg.node_name)).await;
            if let Ok(Ok(raw)) = read {
                return Some(crate::node::policy_info::parse(&raw));
            }
        }
        self.last_info.clone()
    }
}

/// What SIGTERM does with no round under way: whether it asks the workers to checkpoint, and the
/// trail's line saying why or why not. `why`: the setting's reason to ask (`None`: it gives
/// none); `ended_ago`: how long ago the last round ended (`None`: none has).
///
/// NB: each case its own line: a node that is going away but skips the checkpoint because a
/// round just ended (a preemption's SIGTERM after its notice's round) must not read as one that
/// is not going away.
fn sigterm_decision(
    on_sigterm: OnSigterm,
    why: Option<String>,
    ended_ago: Option<Duration>,
) -> (bool, String) {
    match (why, ended_ago.filter(|ago| *ago < RECENT_ROUND)) {
        (Some(why), None) => (true, format!("asking the workers to checkpoint: {why}")),
        (Some(why), Some(ago)) => {
            let secs = ago.as_secs();
            (false, format!("no checkpoint asked: a round ended {secs}s ago ({why})"))
        }
        (None, _) if on_sigterm == OnSigterm::Never => {
            (false, "no checkpoint asked: checkpoint.on_sigterm = never".to_string())
        }
        (None, _) => {
            let line = "no checkpoint asked: the node is not going away (checkpoint.on_sigterm = node-going-away; a rollout leaves the workers running)";
            (false, line.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(on: OnSigterm, why: Option<&str>, ago_s: Option<u64>) -> (bool, String) {
        sigterm_decision(on, why.map(str::to_string), ago_s.map(Duration::from_secs))
    }

    #[test]
    fn each_sigterm_without_a_checkpoint_says_its_own_reason() {
        let notice = Some("a termination or preemption notice");
        let (ask, line) = asked(OnSigterm::NodeGoingAway, notice, Some(600));
        assert!(ask);
        assert_eq!(line, "asking the workers to checkpoint: a termination or preemption notice");
        assert!(asked(OnSigterm::NodeGoingAway, notice, None).0);
        // Going away, but a round ended moments ago: not "the node is not going away".
        let (ask, line) = asked(OnSigterm::NodeGoingAway, notice, Some(12));
        assert!(!ask);
        let expected =
            "no checkpoint asked: a round ended 12s ago (a termination or preemption notice)";
        assert_eq!(line, expected);
        let always = Some("checkpoint.on_sigterm = always");
        let (ask, line) = asked(OnSigterm::Always, always, Some(12));
        assert!(!ask);
        let expected =
            "no checkpoint asked: a round ended 12s ago (checkpoint.on_sigterm = always)";
        assert_eq!(line, expected);
        // `never` says so, whenever the last round ended.
        for ago in [None, Some(12)] {
            let (ask, line) = asked(OnSigterm::Never, None, ago);
            assert!(!ask);
            assert_eq!(line, "no checkpoint asked: checkpoint.on_sigterm = never");
        }
        let (ask, line) = asked(OnSigterm::NodeGoingAway, None, Some(600));
        assert!(!ask);
        assert!(line.starts_with("no checkpoint asked: the node is not going away"), "{line}");
    }
}
