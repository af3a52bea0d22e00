//! The gang's decisions (pure): from the members' entries in the gang's fleet view and the
//! gang's shared state, on the coordinator's clock — is the collective hung, who stopped first,
//! what blocks a restart of every rank, whether the incident is over, and what this member's
//! agent does now; and its learned evidence: whether every member is silent past the silence its
//! own agent learned of its rhythm (`crate::hang::policy_rhythm`, the rule in its entry:
//! `Member::learned`). The executor is `crate::hang::restart::gang`.
//!
//! NB: a collective stops as a whole: when one rank stalls (NCCL, a bad GPU), every other rank
//! blocks in the next all-reduce within seconds. So the gang is *hung* only when a member is
//! confirmed hung (or errored) by its own agent and no member makes progress; a stopped member
//! beside progressing ones is a *straggler*. Members missing against `gang_size` are reported,
//! never guessed: a gang restart needs every member's node to take part.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::{human, ms, Millis};
use crate::config::{Config, GangAction, StragglerAction};
use crate::hang::model_gang::{Activity, Decision, GangState, Member};
use crate::hang::policy::Verdict;
use crate::hang::policy_life::Stage;

/// The durations the gang's rules use, from the configuration (and the one count: how many
/// restarts in a row may bring no progress).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Timing {
    /// A member's agent that has not written its entry for this long is silent.
    pub(crate) silent_after: Millis,
    /// An entry this old is no member any more (its pod moved, its agent is long gone).
    pub(crate) gone_after: Millis,
    pub(crate) restart_delay: Millis,
    /// `policy.confirm_after`: the fixed rule's confirming look, for [`due_on`]'s guard.
    pub(crate) confirm_after: Millis,
    pub(crate) cooldown: Millis,
    pub(crate) escalate_after: Millis,
    /// `policy.max_fruitless_restarts`, for the gang's own run.
    pub(crate) max_fruitless: u32,
}

impl Timing {
    pub(crate) fn of(cfg: &Config) -> Timing {
        // NB: an agent writes its members' entries once per cycle, and a cycle may spend a
        // whole restart (up to `runtime.restart_timeout`) on another worker of its node.
        let silent = cfg.poll_interval * 3 + cfg.runtime.restart_timeout;
        Timing {
            silent_after: ms(silent),
            gone_after: ms((silent * 4).max(cfg.policy.stale_after * 2)),
            restart_delay: ms(cfg.policy.restart_delay),
            confirm_after: ms(cfg.policy.confirm_after),
            cooldown: ms(cfg.policy.cooldown),
            escalate_after: ms(cfg.policy.escalate_after),
            max_fruitless: cfg.policy.max_fruitless_restarts,
        }
    }

    /// How long a view's shard lives without a write.
    pub(crate) fn view_ttl(&self) -> Duration {
        Duration::from_millis(self.gone_after.max(1_000) as u64)
    }
}

/// Members per shard of a gang's view: a shard is one Redis hash (and one Cluster slot).
pub(crate) const MEMBERS_PER_SHARD: u32 = 128;
/// The most shards a view has (a gang of 65,536 ranks: 1,024 per shard).
pub(crate) const MAX_SHARDS: u32 = 64;

/// How many shards the view of a gang of `size` members has (one when the size is unknown).
pub fn shards(size: Option<u32>) -> u32 {
    size.map_or(1, |n| n.div_ceil(MEMBERS_PER_SHARD).clamp(1, MAX_SHARDS))
}

/// The shard a node's members write: every member of one node in one shard, so a node writes
/// one hash per gang per cycle. FNV-1a: stable across builds and versions, unlike std's hasher.
pub fn shard_of(node: &str, shards: u32) -> u32 {
    let h = node.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    h % shards.max(1)
}

/// The gang's verdict.
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum GangVerdict {
    /// Nobody stopped, or nobody is confirmed stopped yet.
    Running,
    /// These members stopped while another progresses.
    Straggler(Vec<String>),
    /// A member stopped and no member progresses: the collective stopped. `first` is the member
    /// that stopped making progress first (earliest last heartbeat): the one place to look.
    Hung { first: String },
}

/// Its own agent confirmed it hung or errored.
pub(crate) fn stopped(m: &Member) -> bool {
    matches!(m.verdict, Verdict::Hung | Verdict::Errored)
}

/// Working, with a heartbeat inside its allowed silence (`ok`: the fixed rule's, or its grace).
pub(crate) fn progressing(m: &Member, now: Millis) -> bool {
    m.activity == Activity::Working && m.heartbeat.is_some_and(|hb| now - hb <= m.silence)
}

/// Moving as far as its own agent can tell: within its allowed silence and, when its agent
/// holds a learned rule for it, within that too.
fn moving(m: &Member, now: Millis) -> bool {
    progressing(m, now) && past_rhythm(m) != Some(true)
}

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

/// The entries that still stand for members (written within `gone_after`), in id order.
pub(crate) fn present(members: &[Member], now: Millis, t: &Timing) -> Vec<Member> {
    let recent = |m: &&Member| now - m.at <= t.gone_after;
    // NB: once a member of a JobSet's next attempt is seen, the last attempt's members are the
    // controller's to remove (it deletes their pods): neither blockers nor stopped ranks of the
    // gang its restart made. Attempts compare within one JobSet (its uid): one deleted and
    // created again under the same name starts its attempts over.
    let mut latest: BTreeMap<Option<&str>, u32> = BTreeMap::new();
    for (m, a) in members.iter().filter(recent).filter_map(|m| Some((m, m.attempt?))) {
        let top = latest.entry(m.jobset_uid.as_deref()).or_default();
        *top = (*top).max(a);
    }
    let current = |m: &&Member| {
        m.attempt.is_none_or(|a| latest.get(&m.jobset_uid.as_deref()).is_none_or(|top| a >= *top))
    };
    let mut v: Vec<Member> = members.iter().filter(recent).filter(current).cloned().collect();
    v.sort_by_key(|m| m.id());
    v
}

/// The gang's verdict from its present members: hung when a member is confirmed stopped by its
/// own agent and none progresses, or — on learned evidence ([`learned_stop`]) — when every
/// member is silent past the silence learned of its rhythm. Without learned evidence, exactly
/// the fixed rule's verdict: a learned rule held for some members only changes nothing.
pub(crate) fn verdict(members: &[Member], now: Millis) -> GangVerdict {
    if learned_stop(members).is_none() {
        let stopped: Vec<String> = members.iter().filter(|m| stopped(m)).map(Member::id).collect();
        if stopped.is_empty() {
            return GangVerdict::Running;
        }
        if members.iter().any(|m| progressing(m, now)) {
            return GangVerdict::Straggler(stopped);
        }
    }
    first_stopped(members, now)
        .map_or(GangVerdict::Running, |first| GangVerdict::Hung { first: first.id() })
}

/// What a gang's restart is due on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Basis {
    /// Every member's learned rule ([`learned_stop`]): when the last member passed its learned
    /// silence, and the longest of their waits.
    Learned { since: Millis, wait: Millis },
    /// The fixed rule.
    Fixed,
}

/// Whether the hung gang's restart is due, and on what: on learned evidence, once every member
/// has been silent past its learned silence for the longest of their waits ([`learned_stop`];
/// from the incident's start at the earliest); else by the fixed rule, `restart_delay` past the
/// incident's start — and, once any member holds a learned rule, past the moment the fixed rule
/// stopped a member (`stale_after`, or its grace, past its last beat, and the confirming look):
/// an incident opened on learned evidence that no longer holds (a member's agent lost its rule)
/// is never restarted sooner than the fixed rule would. `opened`: the incident's start.
pub(crate) fn due_on(opened: Millis, members: &[Member], now: Millis, t: &Timing) -> Option<Basis> {
    let learned = learned_stop(members).filter(|&(since, wait)| now - since.max(opened) >= wait);
    if let Some((since, wait)) = learned {
        return Some(Basis::Learned { since, wait });
    }
    let from = match members.iter().any(|m| m.learned.is_some()) {
        false => Some(opened),
        true => fixed_stop(members, t).map(|at| at.max(opened)),
    };
    from.filter(|from| now - from >= t.restart_delay).map(|_| Basis::Fixed)
}

/// Whether the gang may be decided now, on the fresh view its decision reads under the gang's
/// lock: hung, and its restart due. NB: a decision planned on learned evidence stands on every
/// member's entry as written now (a member whose agent lost its rule since leaves the gang to
/// the fixed rule).
pub(crate) fn decidable(started: Millis, members: &[Member], now: Millis, t: &Timing) -> bool {
    matches!(verdict(members, now), GangVerdict::Hung { .. })
        && due_on(started, members, now, t).is_some()
}

/// The earliest moment a member stopped by the fixed rule: an errored one (its error persisted
/// already) or a hung one its allowed silence past its last beat and the confirming look later.
/// `None`: no member is stopped by the fixed rule.
fn fixed_stop(members: &[Member], t: &Timing) -> Option<Millis> {
    let at = |m: &Member| match (m.verdict, m.heartbeat) {
        (Verdict::Hung, Some(hb)) => hb + m.silence + t.confirm_after,
        _ => Millis::MIN,
    };
    members.iter().filter(|m| stopped(m)).map(at).min()
}

/// The member that stopped making progress first: the earliest last heartbeat among those not
/// moving (one that never beat first of all); ties by id.
pub(crate) fn first_stopped(members: &[Member], now: Millis) -> Option<&Member> {
    let stopped_at = |m: &&Member| (m.heartbeat.unwrap_or(Millis::MIN), m.id());
    members.iter().filter(|m| !moving(m, now)).min_by_key(stopped_at)
}

/// When one member's restart restarts every member (its pod's controllers: a JobSet that
/// restarts on a failed Job, a LeaderWorkerSet group) — every member names the same whole —
/// the member the decision names: the one that stopped first. `None`: every member is
/// restarted (or, with names that differ, none: [`blockers`]).
pub(crate) fn one_for_all(members: &[Member], now: Millis) -> Option<&Member> {
    let whole = members.first()?.one_for_all.as_ref()?;
    if members.iter().any(|m| m.one_for_all.as_ref() != Some(whole)) {
        return None;
    }
    first_stopped(members, now)
}

/// Members whose restarts differ: some restarted one for all (and of which whole), the others
/// not, or for another whole. One decision cannot name one member for them all (a label-named
/// gang over two groups, an agent too old to say).
fn mixed_restarts(members: &[Member]) -> Option<String> {
    let mut ways: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for m in members {
        ways.entry(m.one_for_all.as_deref().unwrap_or("each in place")).or_default().push(m.id());
    }
    if ways.len() < 2 || members.iter().all(|m| m.one_for_all.is_none()) {
        return None;
    }
    let said = ways.iter().map(|(way, ids)| format!("{way}: {}", ids.join(", ")));
    let said = said.collect::<Vec<_>>().join("; ");
    Some(format!("the members are restarted different ways by their controllers ({said}): one decision cannot restart them all"))
}

/// Why the gang cannot be restarted as a whole now: each member whose node cannot take part,
/// and the members missing against `size`. Empty: every member can.
pub(crate) fn blockers(
    members: &[Member],
    size: Option<u32>,
    now: Millis,
    t: &Timing,
) -> Vec<String> {
    let mut why = Vec::new();
    let have = members.len() as u32;
    if let Some(n) = size.filter(|n| have < *n) {
        let missing = n - have;
        why.push(format!(
            "{missing} of {n} members missing (only {have} report; a missing member is never guessed)"
        ));
    }
    // NB: one decision key for agents in both modes would restart for real on an observing
    // agent's decision (no unit taken), or leave the observing agents' members out.
    if members.iter().any(|m| m.dry_run) && members.iter().any(|m| !m.dry_run) {
        let observing: Vec<String> = members.iter().filter(|m| m.dry_run).map(Member::id).collect();
        let observing = observing.join(", ");
        why.push(format!(
            "the members' agents disagree on observe mode (dry_run on {observing}): one mode for the whole gang"
        ));
    }
    why.extend(mixed_restarts(members));
    let mut on_node: BTreeMap<&str, u64> = BTreeMap::new();
    for m in members {
        *on_node.entry(m.node.as_str()).or_default() += 1;
    }
    let here = |m: &Member| on_node.get(m.node.as_str()).copied().unwrap_or(1);
    why.extend(members.iter().filter_map(|m| member_blocker(m, here(m), now, t)));
    why
}

/// The members whose agent has just started and not read its node yet, if any: the gang's
/// decision waits for them (at most `metadata.first_read_wait`), quietly — a wait of seconds is
/// no reason to page `gang-blocked`, and a page would spend the incident's one.
pub(crate) fn starting(members: &[Member]) -> Option<String> {
    let ids: Vec<String> = members.iter().filter(|m| m.starting).map(Member::id).collect();
    (!ids.is_empty()).then(|| ids.join(", "))
}

/// Why one member cannot take part in the gang's restart, if it cannot. `here`: the gang's
/// members on its node (each takes a unit of that node's breaker).
fn member_blocker(m: &Member, here: u64, now: Millis, t: &Timing) -> Option<String> {
    let (id, node) = (m.id(), &m.node);
    let silent = now - m.at;
    if silent > t.silent_after {
        return Some(format!("{id}: the agent on {node} has been silent for {}", human(silent)));
    }
    if let Some(sd) = &m.stand_down {
        return Some(format!("{id}: {sd} on {node}"));
    }
    if m.breaker_left == Some(0) {
        return Some(format!("{id}: the breaker of {node} is open for today"));
    }
    if let Some(left) = m.breaker_left.filter(|left| *left < here) {
        // NB: each member's restart takes a unit of its own node's breaker.
        return Some(format!(
            "{id}: {node} runs {here} members of the gang but its breaker allows {left} more restart(s) today"
        ));
    }
    if m.activity == Activity::Idle {
        return Some(format!(
            "{id}: idle (not part of the stopped collective, and never restarted: a person decides)"
        ));
    }
    if m.verdict == Verdict::Booting {
        // NB: its own cooldown refuses the restart: deciding now would leave it out (the
        // simulation's seed 1002: a member restarted late, then left out of the next wave).
        return Some(format!(
            "{id}: booting (restarted less than policy.cooldown ago; its cooldown refuses another restart)"
        ));
    }
    use Verdict::{Exited, GpuFailed, InMaintenance, Paused, TpuFailed, Unreachable};
    let cannot = [Paused, Exited, GpuFailed, TpuFailed, InMaintenance, Unreachable];
    cannot.contains(&m.verdict).then(|| format!("{id}: {}", m.verdict.as_str()))
}

/// Whether the gang's open incident is over: its restart was decided and every member has beaten
/// since (or the cooldown has passed since the decision), or — before any decision — a member
/// beat working since the incident began: the collective moved.
///
/// NB: a beat since, not a silence within the allowed one now. An incident opened on learned
/// evidence is open while every member is still within the fixed rule's silence, and must not
/// close on that (a build without this closed it, reopened it and paged `hung` twice). And the
/// gang's turn comes only while a member is stale: an incident whose collective moved again
/// unseen (a person restarted the job) is still open at its next stop, and must close then, not
/// restart the new stop on the old one's clock (gang seed 6: 135 s after the stop).
pub(crate) fn incident_over(
    state: &GangState,
    members: &[Member],
    now: Millis,
    t: &Timing,
) -> bool {
    let Some(inc) = &state.incident else { return false };
    let beat_since = |m: &Member, at: Millis| m.heartbeat.is_some_and(|hb| hb > at);
    let Some(d) = state.current_decision() else {
        let moved = |m: &Member| m.activity == Activity::Working && beat_since(m, inc.started);
        return members.iter().any(moved);
    };
    let all_beat = !members.is_empty() && members.iter().all(|m| beat_since(m, d.decided));
    all_beat || now - d.decided >= t.cooldown
}

/// What a member's agent does for its gang this cycle, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GangStep {
    /// The gang incident's `hung` page (once per incident).
    PageHung,
    /// The gang hangs again after its restart at `restarted`: one escalation per restart.
    PageEscalation { restarted: Millis },
    /// This member stopped while its peers progress: one alert naming it.
    PageStraggler,
    /// The straggler is restarted alone (`gang.straggler = "restart"`).
    RestartAlone,
    /// Take the gang's decision (its lock, the blockers, the gang breaker and one fleet unit).
    Decide,
    /// Restart this member, as the gang's decision says.
    Execute,
}

/// The gang's policy as the configuration and the members say it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rules {
    pub(crate) action: GangAction,
    pub(crate) straggler: StragglerAction,
    pub(crate) timing: Timing,
}

/// The stage of the gang's incident in the life of a hang (`crate::hang::policy_life`), from the
/// gang's shared state and its present members: `confirmed` while the incident waits, `due` once
/// its restart is ([`due_on`]), `restarting` while its decision stands (the members restart
/// over several cycles), `escalated` once that decision is `escalate_after` old and no member
/// progresses, `recovered` after a restart while the next incident would be "again".
///
/// NB: escalation looks at the data, not at the verdicts: restarted members boot (no member's
/// agent calls them hung) while the gang may still be stuck.
pub(crate) fn stage(state: &GangState, members: &[Member], now: Millis, t: &Timing) -> Stage {
    let Some(inc) = &state.incident else {
        return if again(state, now, t).is_some() { Stage::Recovered } else { Stage::Quiet };
    };
    match state.current_decision() {
        Some(d)
            if now - d.decided >= t.escalate_after
                && !members.iter().any(|m| progressing(m, now)) =>
        {
            Stage::Escalated
        }
        Some(_) => Stage::Restarting,
        None if due_on(inc.started, members, now, t).is_some() => Stage::Due,
        None => Stage::Confirmed,
    }
}

/// The gang's last restart, while an incident beginning `at` is the same trouble again (its page
/// an escalation, not `hung`).
fn again(state: &GangState, at: Millis, t: &Timing) -> Option<Millis> {
    state.restarted.filter(|r| at - r < t.cooldown + t.escalate_after)
}

/// The steps for `own` (this agent's member, its entry as of this cycle), given the gang's
/// verdict and state (an open incident already opened when the gang is hung): what the stage of
/// its incident asks.
pub(crate) fn plan(
    verdict: &GangVerdict,
    state: &GangState,
    members: &[Member],
    own: &Member,
    now: Millis,
    rules: &Rules,
) -> Vec<GangStep> {
    let t = &rules.timing;
    let stage = stage(state, members, now, t);
    if let (Stage::Restarting | Stage::Escalated, Some(d)) = (stage, state.current_decision()) {
        let escalated = stage == Stage::Escalated;
        let page = escalated.then_some(GangStep::PageEscalation { restarted: d.decided });
        // NB: a standing decision is carried out whatever the verdict now: the members already
        // restarted boot (no agent calls them hung), and this one may be only suspect again
        // (the simulation's seed 39: a member left out because the gang no longer read hung).
        let execute = executable(d, own, now, t).then_some(GangStep::Execute);
        return page.into_iter().chain(execute).collect();
    }
    match (verdict, &state.incident) {
        (GangVerdict::Straggler(ids), _) if ids.contains(&own.id()) => match rules.straggler {
            StragglerAction::AlertOnly => vec![GangStep::PageStraggler],
            StragglerAction::Restart => vec![GangStep::PageStraggler, GangStep::RestartAlone],
        },
        (GangVerdict::Hung { .. }, Some(inc)) => {
            let restart_all =
                rules.action == GangAction::RestartAll && !members.iter().any(|m| m.alert_only);
            // NB: from the incident's start, not from now: an incident's page is one kind for
            // its whole life (simulation: an escalation, then a `hung` page for the same
            // incident once `now` had moved on).
            let page = match again(state, inc.started, t) {
                Some(restarted) => GangStep::PageEscalation { restarted },
                None => GangStep::PageHung,
            };
            let decide = (restart_all && stage.runs_pipeline()).then_some(GangStep::Decide);
            std::iter::once(page).chain(decide).collect()
        }
        // Running, a straggler other than this member, or hung with no incident open.
        _ => vec![],
    }
}

/// Whether the decision still asks this member's restart: it has not beaten since the decision,
/// it is not progressing, and it is not booting (our own restart of it).
pub(crate) fn executable(d: &Decision, own: &Member, now: Millis, t: &Timing) -> bool {
    // NB: the decision stands for `policy.cooldown` (then the incident is over): a member whose
    // new incarnation never beat is booting until its cooldown ends, and must not then read as
    // still owed the same decision's restart (review: a second restart, alone).
    // NB: a decision of one member for all (its controller restarts the rest) is that
    // member's alone: the others' pods are its controller's to recreate. And only while its
    // container ran when the decision was taken: a controller's next incarnation (a new pod of
    // the same worker on the same node, its record still the old one's) is never stopped on the
    // last one's decision; a start the runtime does not say is unknown, not carried out.
    let ran_then = own.started.is_some_and(|st| st <= d.decided);
    now - d.decided < t.cooldown
        && d.only.as_ref().is_none_or(|m| *m == own.id() && ran_then)
        && own.verdict != Verdict::Booting
        && !moving(own, now)
        && own.heartbeat.is_none_or(|hb| hb < d.decided)
}

#[cfg(test)]
#[path = "policy_gang_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "policy_gang_learned_tests.rs"]
mod learned_tests;

#[cfg(test)]
#[path = "policy_gang_life_tests.rs"]
mod life_tests;
