//! A gang — the ranks of one distributed job, across nodes — as the fleet sees it: each member's
//! entry in the gang's view (written by the member's own agent with its cycle's batch) and the
//! gang's shared state (its incident, its restart decision). Data only: the decisions on it are
//! in `crate::hang::policy_gang`.

use serde::{Deserialize, Serialize};

use crate::clock::{Millis, Stamp};
use crate::hang::model::{Fruitless, Incident, Verdict};
use crate::hang::model_rhythm::Learned;

/// What a member is doing, as its record says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Activity {
    /// `processing` or another working state: its silence is a hang.
    #[serde(rename = "w")]
    #[default]
    Working,
    #[serde(rename = "i")]
    Idle,
    #[serde(rename = "e")]
    Error,
    /// No readable record.
    #[serde(rename = "u")]
    Unknown,
}

/// One member's entry in its gang's fleet view (field `<node>/<worker>` of the view's hash).
/// Short names: a gang of 8,000 ranks keeps 8,000 of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Member {
    #[serde(rename = "n")]
    pub(crate) node: String,
    #[serde(rename = "w")]
    pub(crate) worker: String,
    /// Its own agent's verdict on it (`hung`, `suspect`, `booting`…).
    #[serde(rename = "v", deserialize_with = "Verdict::read_lenient")]
    pub(crate) verdict: Verdict,
    #[serde(rename = "s")]
    pub(crate) activity: Activity,
    /// Its last heartbeat (the coordinator's clock): its last progress.
    #[serde(rename = "hb", default)]
    pub(crate) heartbeat: Option<Millis>,
    /// How far it has got as of that heartbeat (`crate::hang::policy_fruitless::position`):
    /// whether the gang's restarts help.
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub(crate) step: Option<u64>,
    /// Its last restart's line (the coordinator's clock): a beat up to then may be its old
    /// incarnation's (its restart was slow, or seen failed), and never shows that the gang's
    /// restarts help (`crate::hang::policy_fruitless`). An older agent's entry has none.
    #[serde(rename = "ln", default, skip_serializing_if = "Option::is_none")]
    pub(crate) line: Option<Millis>,
    /// How long it may stay silent after that heartbeat (ms): the fixed rule's silence, or the
    /// grace it announced.
    #[serde(rename = "ok")]
    pub(crate) silence: Millis,
    /// The learned restart rule its agent holds for it (`crate::hang::policy_rhythm::
    /// learned_rule`, from the coordinator's copy of its rhythm). `None` (and an older agent's
    /// entry): the fixed rule. The gang restarts on learned evidence only when every member has
    /// one (`crate::hang::policy_gang::learned_stop`); nothing else of the gang reads it, so an
    /// agent that does not know it judges the entry exactly as before.
    #[serde(rename = "lr", default, skip_serializing_if = "Option::is_none")]
    pub(crate) learned: Option<Learned>,
    /// When its container started (ms; the node's clock), when the runtime says.
    #[serde(rename = "st", default)]
    pub(crate) started: Option<Millis>,
    /// When its agent wrote the entry (the coordinator's clock): a silent agent shows here.
    #[serde(rename = "at")]
    pub(crate) at: Millis,
    /// Why its node cannot restart it now (maintenance, shutdown, a failed accelerator).
    #[serde(rename = "sd", default, skip_serializing_if = "Option::is_none")]
    pub(crate) stand_down: Option<String>,
    /// Its agent has just started and not read its node yet (`first_read_wait`): the gang's
    /// decision waits for it, without a page (an older agent's entry has none: not starting).
    #[serde(rename = "sw", default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) starting: bool,
    /// Restarts its node's breaker still allows today (`None`: no breaker).
    #[serde(rename = "br", default)]
    pub(crate) breaker_left: Option<u64>,
    /// `namespace/pod/container` or the container name.
    #[serde(rename = "c", default)]
    pub(crate) container: String,
    /// What its node knows that may explain a stop (a GPU XID, a failed GPU or TPU).
    #[serde(rename = "sig", default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) signals: Vec<String>,
    /// Its restarts belong to someone else (`restarts = alert-only`).
    #[serde(rename = "ao", default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) alert_only: bool,
    /// Its JobSet's `restart-attempt` (the gang's incarnation), when its pod says: the members
    /// of an older attempt are its controller's to remove, and no longer the gang's.
    #[serde(rename = "att", default, skip_serializing_if = "Option::is_none")]
    pub(crate) attempt: Option<u32>,
    /// One member's restart restarts every member, and what restarts (its pod's controllers:
    /// `jobset:<ns>/<name>`, `lws:<ns>/<name>/<group>`): the gang's decision names one member
    /// when every member names the same (else the gang is blocked: a mixed gang, or an agent
    /// too old to say).
    #[serde(rename = "oa", default, skip_serializing_if = "Option::is_none")]
    pub(crate) one_for_all: Option<String>,
    /// Its JobSet's uid (the first 8 characters), with `attempt`: the incarnation is the
    /// attempt of one JobSet (a JobSet deleted and created again under the same name starts
    /// its attempts over).
    #[serde(rename = "jsu", default, skip_serializing_if = "Option::is_none")]
    pub(crate) jobset_uid: Option<String>,
    /// Its agent runs in observe mode (`dry_run`).
    #[serde(rename = "dr", default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) dry_run: bool,
    /// Its node's checkpoint budgets (ms) for a preemption and a host maintenance: a gang's
    /// checkpoint round takes the tightest (`crate::maintenance::policy_round::round_budget`).
    #[serde(rename = "bp", default, skip_serializing_if = "Option::is_none")]
    pub(crate) preemption_budget: Option<Millis>,
    #[serde(rename = "bm", default, skip_serializing_if = "Option::is_none")]
    pub(crate) maintenance_budget: Option<Millis>,
    /// How long its steps compute before the collective (ms): the median of the last five
    /// `compute_ms` its records said (`crate::hang::policy_pace::Pace::compute`). A slow gang
    /// waits for the rank that computes longest (`crate::hang::policy_pace`).
    #[serde(rename = "cmp", default, skip_serializing_if = "Option::is_none")]
    pub(crate) compute: Option<Millis>,
    /// What its node shows that slows a rank down (a GPU clocked down: its throttle reasons).
    #[serde(rename = "slw", default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) slow: Vec<String>,
    /// The pace its agent learned of it (`gang.pace`), kept here so that an agent restarted
    /// goes on from it instead of learning again — one restarted in a slow run would learn the
    /// slow pace as the usual one (`crate::hang::policy_pace::Pace::resume`).
    #[serde(rename = "pb", default, skip_serializing_if = "Option::is_none")]
    pub(crate) pace: Option<PaceKept>,
}

/// A learned pace as a member's entry keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PaceKept {
    /// Steps per second, in millionths.
    #[serde(rename = "r")]
    pub(crate) micro: u64,
    /// The windows that taught it.
    #[serde(rename = "n")]
    pub(crate) windows: u32,
}

impl Member {
    /// A healthy, working member: `worker` of `node`, its last beat and its agent's write at
    /// `at`, silent for up to 2 min, nothing else known (the base of replays and tests).
    pub(crate) fn working(node: &str, worker: &str, at: Millis) -> Member {
        // NB: the default verdict is `Healthy`, the default activity `Working`.
        let (node, worker) = (node.to_string(), worker.to_string());
        Member { node, worker, heartbeat: Some(at), silence: 120_000, at, ..Member::default() }
    }

    /// The member's id in its gang: `<node>/<worker>`.
    pub(crate) fn id(&self) -> String {
        member_id(&self.node, &self.worker)
    }
}

pub(crate) fn member_id(node: &str, worker: &str) -> String {
    format!("{node}/{worker}")
}

/// How a node record names a worker's gang: `<id>` or `<id>|<size>` (`|` is in no gang id).
pub(crate) fn tag(gang: &str, size: Option<u32>) -> String {
    size.map_or_else(|| gang.to_string(), |n| format!("{gang}|{n}"))
}

/// The gang's restart decision for an incident (`"<decided_ms>:<incident_id>"`, and
/// `"|<member id>"` when one member's restart restarts them all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    pub(crate) decided: Millis,
    pub(crate) incident: String,
    /// The one member whose restart makes the job's controller restart every member (a
    /// JobSet, a LeaderWorkerSet group: `crate::vocab::workload::Remediation::OneForAll`);
    /// `None`: every member is restarted.
    pub(crate) only: Option<String>,
}

/// The gang's shared state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GangState {
    /// The gang's incident (the collective stopped): the same timer as a worker's incident,
    /// under the gang's key.
    pub(crate) incident: Option<Incident>,
    pub(crate) decision: Option<Decision>,
    /// When the gang was last restarted (a closed incident's decision).
    pub(crate) restarted: Option<Millis>,
    /// The gang's restarts in a row that brought no member past where it stopped.
    pub(crate) fruitless: Option<Fruitless>,
}

impl Decision {
    pub(crate) fn decode(s: &str) -> Option<Decision> {
        let s = Stamp::parse(s)?;
        // `<incident>|<member>`, or the incident alone.
        let (incident, only) = s.rest.split_once('|').unzip();
        let incident = incident.unwrap_or(s.rest.as_str()).to_string();
        Some(Decision { decided: s.at, incident, only: only.map(str::to_string) })
    }
    pub(crate) fn encode(&self) -> String {
        let only = self.only.as_ref().map_or_else(String::new, |m| format!("|{m}"));
        Stamp::new(self.decided, format!("{}{only}", self.incident)).to_string()
    }
}

impl GangState {
    /// From the values of the incident, decision, restarted and fruitless keys, in that order.
    pub(crate) fn decode(values: &[Option<String>]) -> GangState {
        let at = |i: usize| values.get(i).and_then(|v| v.as_deref());
        GangState {
            incident: at(0).and_then(Incident::decode),
            decision: at(1).and_then(Decision::decode),
            restarted: at(2).and_then(|v| v.parse().ok()),
            fruitless: at(3).and_then(Fruitless::decode),
        }
    }

    /// The decision of the open incident, if it has one.
    pub(crate) fn current_decision(&self) -> Option<&Decision> {
        let inc = self.incident.as_ref()?;
        self.decision.as_ref().filter(|d| d.incident == inc.id)
    }
}

/// A gang as one agent read it this cycle.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    /// The members' entries: all of them when `full`, else this agent's own only.
    pub(crate) members: Vec<Member>,
    pub(crate) state: GangState,
    /// This agent read the whole view (it is the gang's reader this poll interval).
    pub(crate) full: bool,
}

/// The gangs as this agent read them: this cycle's views, and their runs of fruitless restarts.
#[derive(Debug, Default)]
pub(crate) struct GangReads {
    /// The views read this cycle, by gang id: a node of eight ranks reads its gang once.
    pub(crate) views: std::collections::HashMap<String, View>,
    /// The gangs' runs of fruitless restarts as this agent last read them (with the gang's
    /// state, or written at its decision). Kept across cycles: the first member this agent sees
    /// past where the gang stopped ends the run, in whatever cycle that is.
    pub(crate) runs: std::collections::BTreeMap<String, Fruitless>,
}

/// What one cycle of an agent keeps for its gangs.
#[derive(Debug, Default)]
pub(crate) struct GangCycle {
    /// Entries to write with the cycle's batch: (view shard key, member id, entry as JSON).
    pub(crate) entries: Vec<(String, String, String)>,
    /// The gangs as this agent read them (`crate::hang::restart::gang_reads`).
    pub(crate) reads: GangReads,
    /// Restarts this node's breaker still allows today, as the last batch read it.
    pub(crate) breaker_left: Option<u64>,
    /// Worker id → its gang's [`tag`], for the node record.
    pub(crate) tags: std::collections::BTreeMap<String, String>,
    /// The gang alerts this agent sent and has not resolved. Kept across cycles: resolved when
    /// the incident closes or this agent's member is healthy again.
    pub(crate) sent: Sent,
    /// The gangs whose slow episode this agent opened (and paged), by gang. This agent ends
    /// the episode and resolves the alert (a sink resolves only what its own process sent).
    pub(crate) slow: std::collections::BTreeMap<String, SlowOpened>,
}

/// The gang alerts an agent sent and has not resolved, by gang: (node, worker) as the alert
/// named them (`crate::hang::restart::pager`).
pub(crate) type Sent = std::collections::BTreeMap<String, Vec<(String, String)>>;

/// A slow episode this agent opened (`crate::hang::restart::gang_pace`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SlowOpened {
    /// The episode key's value.
    pub(crate) value: String,
    /// Where its `slow` alert was placed.
    pub(crate) node: String,
    pub(crate) worker: String,
    /// When its lease was last renewed (the key's TTL: an episode whose opener is gone lapses).
    pub(crate) renewed: Millis,
    /// Its `slow` page went out (or its claim says another process sent it): until then the
    /// opener tries again each cycle it follows the episode (a claim that got no answer).
    pub(crate) paged: bool,
}
