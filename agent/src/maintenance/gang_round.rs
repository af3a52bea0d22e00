//! A gang's checkpoint round: a notice on one member's node asks every member of the gang to
//! save, with one request id, and the node of the notice waits until every member acknowledged
//! that id or the round's budget (the tightest among the members' nodes) ran out.
//!
//! The round is one key of the gang (`Keys::gang_checkpoint`, SET NX with the budget as TTL):
//! a notice on another member's node while it runs joins it rather than opening a second one.
//! The opener writes the request into every member's status record, one pipelined write per
//! node (a node's records share its Cluster slot); each joiner writes its own members' again
//! (idempotent: the same id), so a member missing from the opener's view is still asked.
//! `checkpoint_ack` is not cleared: only this round's id counts, and clearing it on a node
//! written last could erase the ack of a rank that had already saved.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::clock::{duration, ms, Millis};
use crate::coord::{CoordError, Coordinator, Keys, Op};
use crate::hang::gang_marks::read_view;
use crate::hang::model::Gang;
use crate::hang::model_gang::{member_id, Member};
use crate::hang::policy_gang::present;
use crate::maintenance::model_round::{GangRound, MemberAck, Round};
use crate::maintenance::policy_round::round_budget;
use crate::maintenance::request::{acknowledges, new_id, Checkpointer, POLL};
use crate::runtime::Container;

/// Extra life of the round's key past its budget: a joiner that reads it at the last moment
/// still finds it.
pub(crate) const ROUND_MARGIN: Duration = Duration::from_secs(10);

/// What the end of a round takes (the key's removal, the reply): its wait ends this much
/// before the caller's budget.
const WRAP_UP: Duration = Duration::from_millis(300);

/// A member to ask: its node and worker id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Asked {
    pub(crate) node: String,
    pub(crate) worker: String,
}

/// Why a gang's round could not be opened or joined (nobody was asked).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RoundError {
    /// The coordinator could not be read or written.
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// Another agent changed the round key under every attempt.
    #[error("the gang's round key {0} kept changing under three attempts to open or join it")]
    Contended(String),
}

impl Checkpointer {
    /// Run (or join) `gang`'s round for a notice on this node, whose members here are `local`,
    /// within `budget` (cut to the members' tightest) and never past the caller's `until`; a
    /// round joined keeps its end, and this node's workers are told the time it has left.
    /// `Err` only when the coordinator cannot be reached at all (then nobody was asked).
    pub(crate) async fn gang_round(
        &self,
        gang: &Gang,
        local: &[Container],
        reason: &str,
        budget: Duration,
        until: Instant,
    ) -> Result<GangRound, RoundError> {
        let now = self.coord.time().await?;
        let started = Instant::now();
        let (view, view_read) = self.present_members(gang, now).await;
        let node = self.keys.node().to_string();
        let (own, members) = asked(&node, local, &view);
        let budget = round_budget(budget, reason, &view);
        let mine = fresh(reason, now, budget, node, false);
        let (round, opened) = self.open_or_join(&gang.id, mine).await?;
        let io = RoundIo { coord: &*self.coord, prefix: self.keys.prefix() };
        io.write_requests(&round, if opened { &members } else { &own }).await;
        // NB: the round's end, not this node's budget: a node that joins a round opened earlier
        // tells its workers the time the round has left, or a rank saves past its end.
        let ends = (started + duration(round.until - now)).min(until);
        for c in local {
            let Ok(method) = self.method_for(c) else { continue };
            let left = ends.saturating_duration_since(Instant::now());
            if let Err(e) = self.deliver(&method, c, &round.id, reason, left).await {
                tracing::warn!(worker = %c.worker, error = %e, "gang checkpoint request not delivered by its method");
            }
        }
        // NB: the caller stops waiting at `until`: the wait ends a little before, so the
        // round's answer (who did not answer) is what the caller reports.
        let deadline = ends.min(until.checked_sub(WRAP_UP).unwrap_or(started));
        // The members' answers, in the same order.
        let members = io.wait_acks(&round, &members, now, started, deadline).await;
        if opened && members.iter().all(|a| a.acked.is_some()) {
            // The next notice (a preemption after this maintenance round) asks for a new save.
            let key = self.keys.gang_checkpoint(&gang.id);
            let _ = self.coord.del_if_owner(&key, &round.encode()).await;
        }
        Ok(GangRound { gang: gang.id.clone(), round, opened, members, size: gang.size, view_read })
    }

    /// The gang's members in its view, without those whose agent has not written them for
    /// `gone_after` (a rank that moved to another node); and whether the view could be read.
    /// NB: a view that cannot be read leaves this node's own members to ask: a round of the
    /// members it knows beats no round, and it is never reported as acknowledged.
    async fn present_members(&self, gang: &Gang, now: Millis) -> (Vec<Member>, bool) {
        match read_view(&*self.coord, &self.keys, &gang.id, gang.size, None).await {
            Ok(all) => (present(&all, now, &self.timing), true),
            Err(e) => {
                tracing::warn!(gang = %gang.id, error = %e, "cannot read the gang's view: asking this node's members only");
                (Vec::new(), false)
            }
        }
    }

    /// Open the gang's round, or join the one another member's notice opened for the same
    /// reason and that still runs when `fresh` opens. Any other round there — a drill's, another
    /// reason's, one expired between two calls — is replaced by this one, compare-and-swap: two
    /// notices that race to replace it end in one round.
    async fn open_or_join(&self, gang: &str, fresh: Round) -> Result<(Round, bool), RoundError> {
        let key = self.keys.gang_checkpoint(gang);
        let ttl = duration(fresh.until - fresh.at) + ROUND_MARGIN;
        for _ in 0..3 {
            if self.coord.set_nx(&key, &fresh.encode(), ttl).await? {
                return Ok((fresh, true));
            }
            // Gone meanwhile (no text): try to open it again.
            let Some(text) = self.coord.get(&key).await? else { continue };
            // NB: a real notice never joins a drill (its workers must save for the notice) nor a
            // round of another reason (a preemption asks for a save of its own).
            let joinable = |r: &Round| r.until > fresh.at && !r.drill && r.reason == fresh.reason;
            if let Some(r) = Round::decode(&text).filter(joinable) {
                return Ok((r, false));
            }
            self.coord.del_if_owner(&key, &text).await?;
        }
        Err(RoundError::Contended(key))
    }
}

/// A round's reads and writes of the members' records: what a gang's round and a drill
/// (`crate::maintenance::drill`, run from the CLI, with no runtime) share.
pub(crate) struct RoundIo<'a> {
    pub(crate) coord: &'a dyn Coordinator,
    pub(crate) prefix: &'a str,
}

impl RoundIo<'_> {
    /// Write the round's request into every member's record: one pipelined write per node, the
    /// nodes at once. A node whose write fails is logged; its members show as unanswered.
    pub(crate) async fn write_requests(&self, round: &Round, members: &[Asked]) {
        let fields = vec![
            ("checkpoint_request".to_string(), round.id.clone()),
            ("checkpoint_reason".to_string(), round.reason.clone()),
            ("checkpoint_requested_at".to_string(), round.at.to_string()),
            ("checkpoint_drill".to_string(), if round.drill { "1" } else { "" }.to_string()),
        ];
        let mut by_node: BTreeMap<&str, Vec<Op>> = BTreeMap::new();
        for m in members {
            let key = Keys::new(self.prefix, &m.node).status(&m.worker);
            let op = Op::Hset { key, fields: fields.clone(), ttl: None };
            by_node.entry(&m.node).or_default().push(op);
        }
        let writes = by_node.iter().map(|(node, ops)| async move {
            if let Err(e) = self.coord.batch(ops).await {
                tracing::warn!(node = %node, error = %e, round = %round.id, "cannot write the checkpoint request to this node's members");
            }
        });
        join_all(writes).await;
    }

    /// The status records of `members`, in their order.
    pub(crate) async fn records<'m>(
        &self,
        members: impl Iterator<Item = &'m Asked>,
    ) -> Result<Vec<HashMap<String, String>>, CoordError> {
        let keys: Vec<String> =
            members.map(|m| Keys::new(self.prefix, &m.node).status(&m.worker)).collect();
        self.coord.hgetall_many(&keys).await
    }

    /// Wait until every member acknowledged the round's id, or `deadline`. Each member's time is
    /// from the round's opening (`round.at`) to the read that saw its ack.
    pub(crate) async fn wait_acks(
        &self,
        round: &Round,
        members: &[Asked],
        now: Millis,
        started: Instant,
        deadline: Instant,
    ) -> Vec<MemberAck> {
        let mut acks: Vec<MemberAck> = members
            .iter()
            .map(|m| MemberAck { member: member_id(&m.node, &m.worker), acked: None, state: None })
            .collect();
        // A large gang is read less often: 8,000 records every 200 ms would be Redis's whole day.
        let poll = POLL.max(Duration::from_millis(members.len() as u64 / 10));
        loop {
            let pending: Vec<_> = (0..acks.len()).filter(|&i| acks[i].acked.is_none()).collect();
            if pending.is_empty() {
                break;
            }
            match self.records(pending.iter().map(|&i| &members[i])).await {
                Ok(records) => {
                    let at = now + ms(started.elapsed()) - round.at;
                    for (&i, rec) in pending.iter().zip(&records) {
                        if acknowledges(rec, &round.id) || acked_a_later_round(rec, round) {
                            acks[i].acked = Some(at.max(0));
                        }
                        acks[i].state = rec.get("state").filter(|s| !s.is_empty()).cloned();
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, round = %round.id, "cannot read the acknowledgements yet")
                }
            }
            let t = Instant::now();
            if t >= deadline || acks.iter().all(|a| a.acked.is_some()) {
                break;
            }
            tokio::time::sleep(poll.min(deadline - t)).await;
        }
        acks
    }
}

/// Whether the member acknowledged a round written into its record after this one opened (a
/// preemption's round replacing a maintenance round): its save is newer than this round asked
/// for. An earlier round's ack never counts, nor an empty request (`acknowledges`).
fn acked_a_later_round(rec: &HashMap<String, String>, round: &Round) -> bool {
    let Some(id) = rec.get("checkpoint_request").filter(|r| **r != round.id) else { return false };
    let at: Option<Millis> = rec.get("checkpoint_requested_at").and_then(|t| t.parse().ok());
    at.is_some_and(|at| at >= round.at) && acknowledges(rec, id)
}

/// A new round (a fresh id) opened `at` by `by`, cut short `within` later.
pub(crate) fn fresh(reason: &str, at: Millis, within: Duration, by: String, drill: bool) -> Round {
    Round { id: new_id(), reason: reason.to_string(), at, until: at + ms(within), by, drill }
}

/// Who a round asks: this node's members (`own`), and every member, the view's and ours, once
/// (sorted).
pub(crate) fn asked(node: &str, local: &[Container], view: &[Member]) -> (Vec<Asked>, Vec<Asked>) {
    let own: Vec<Asked> =
        local.iter().map(|c| Asked { node: node.to_string(), worker: c.worker.clone() }).collect();
    let mut members: BTreeSet<Asked> =
        view.iter().map(|m| Asked { node: m.node.clone(), worker: m.worker.clone() }).collect();
    members.extend(own.iter().cloned());
    (own, members.into_iter().collect())
}
