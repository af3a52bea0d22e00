//! A gang's learned evidence (pure): whether every member is silent past the silence its own
//! agent learned of its rhythm (`crate::hang::policy_rhythm`, the rule in its entry:
//! `Member::learned`). What the gang does with it — when a restart is due on it, and the fixed
//! rule otherwise — is `crate::hang::policy_gang`'s.

use crate::clock::Millis;
use crate::hang::model_gang::{Activity, Member};
use crate::hang::policy::Verdict;

/// Silent past the silence learned of its rhythm, as its own agent saw it at its last look
/// (`at`); `None` without a learned rule.
///
/// NB: as its own agent saw it, not as `now` says: another agent's entry is as of its own look,
/// up to a poll old, and a learned silence may be shorter than a poll, so a member beating on
/// would read as silent.
pub(crate) fn past_rhythm(m: &Member) -> Option<bool> {
    let l = m.learned?;
    Some(m.heartbeat.is_some_and(|hb| m.at - hb > l.silence))
}

/// The collective's learned evidence: every member's agent holds a learned rule for it
/// (`Member::learned`: from the coordinator's copy of its rhythm, learned long enough), every
/// member is a working one its agent calls healthy, suspect or hung, and every one is silent
/// past its learned silence as its own agent saw it — each far past its own rhythm. Then when
/// the last of them passed it and the longest of their waits: `Some((since, wait))`. `None`
/// (one member without a learned rule — too few samples, a new workload, an agent restarted,
/// learning off on its node, an agent too old to say — or one within its silence): the fixed
/// rule alone.
pub(crate) fn learned_stop(members: &[Member]) -> Option<(Millis, Millis)> {
    let (mut since, mut wait) = (Millis::MIN, 0);
    for m in members {
        let ordinary = matches!(m.verdict, Verdict::Healthy | Verdict::Suspect | Verdict::Hung);
        let shown = (m.learned, m.heartbeat, ordinary, m.activity, past_rhythm(m));
        let (Some(l), Some(hb), true, Activity::Working, Some(true)) = shown else { return None };
        since = since.max(hb + l.silence);
        wait = wait.max(l.wait);
    }
    (!members.is_empty()).then_some((since, wait))
}
