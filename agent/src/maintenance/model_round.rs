//! A gang's checkpoint round, as data: the round every member of a distributed job is asked to
//! save in (one id for all of them, a drill's too) and what each member answered (a drill's
//! measured result is `crate::vocab::maintenance::DrillResult`, which the metrics export). The
//! decisions on them are in `crate::maintenance::policy_round`.

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

/// The reason a drill's requests carry (`checkpoint_reason`): a worker may tell a drill from a
/// notice, and must save the same way.
pub(crate) const DRILL_REASON: &str = "drill";

/// A gang's open checkpoint round, stored at the gang's `checkpoint` key while it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Round {
    /// The request id every member acknowledges with (its `checkpoint_ack`).
    pub(crate) id: String,
    /// Why: `preemption`, `host-maintenance`, `sigterm`, `drill`…
    pub(crate) reason: String,
    /// When it was opened (the coordinator's clock, ms): every member's `checkpoint_requested_at`.
    pub(crate) at: Millis,
    /// When it is cut short (ms): the tightest budget among the members' nodes.
    pub(crate) until: Millis,
    /// The node whose notice opened it.
    pub(crate) by: String,
    /// A drill, not a notice.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) drill: bool,
}

impl Round {
    pub(crate) fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub(crate) fn decode(text: &str) -> Option<Round> {
        serde_json::from_str(text).ok()
    }
}

/// One member's answer to a round: `acked` is how long after the round opened its
/// acknowledgement was seen (`None`: not within the round).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberAck {
    /// `<node>/<worker>`.
    pub(crate) member: String,
    pub(crate) acked: Option<Millis>,
    /// The `state` its record showed at the last read: for a member that did not answer, it
    /// tells a rank stuck before its save (`processing`) from one saving (`checkpoint`).
    pub(crate) state: Option<String>,
}

/// How a gang's round ended, as the node of the notice saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GangRound {
    pub(crate) gang: String,
    pub(crate) round: Round,
    /// Whether this node opened the round (or joined one another member's notice opened).
    pub(crate) opened: bool,
    /// Every member asked, in id order.
    pub(crate) members: Vec<MemberAck>,
    /// The members the gang says it has (`gang_size`), when it says.
    pub(crate) size: Option<u32>,
    /// Whether the gang's view was read (else only this node's members were asked).
    pub(crate) view_read: bool,
}
