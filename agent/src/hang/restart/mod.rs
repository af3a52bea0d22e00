//! The restart path: carries out the policy's effects for one worker against the coordinator,
//! the runtime and the alert sinks, with every safeguard of the brief, in the brief's order:
//!
//! 1. persistence before action — the incident timer lives in the coordinator (SET NX);
//! 2. per-node lock (a lease with a random token, compare-and-delete release);
//! 3. revalidation right before the command, lock TTL check, compare-and-restart;
//! 4. one breaker per node per UTC day, incremented immediately before the command;
//! 5. escalation page once if still broken after `escalate_after`;
//! 6. cooldown marker written before the command;
//! 7. all durations from the coordinator's clock;
//! 8. a failed restart releases the dedup key and pages at once, then backs off;
//!
//! plus the fleet-wide budget, fail-closed behaviour and the decision trail. The decisions are
//! the policy's: the verdict and the plan (`crate::hang::policy`), the pipeline's order and what
//! a stopped pass gives back (`crate::hang::policy_pipeline`, one state machine), the caps'
//! (`crate::coord::caps`); the coordination primitives are `crate::coord`'s (lease, caps, marks).
//! This module only executes them.
//!
//! [`RestartPath`] is one worker's evaluation, built by the agent from the shared [`Context`]
//! and what the evaluation needs of the agent (the trail, alert de-duplication, the node's
//! state, the cycle's gang reads, what it learned of the worker). Each part of the work that
//! needs less is its own object, handed only what it takes:
//!
//! | object | what it does | what it takes |
//! |---|---|---|
//! | `pipeline::Pipeline` | one pass of the restart pipeline for a worker's incident (`before_command`, `limits`, `command`) | the incident (`Act`), context, pager, trail, node watch, `Judge` |
//! | `gang_decision::GangDecider` | a gang's one decision | context, pager, trail, gang reads |
//! | `gang_pace::PaceWatch` | a gang member's pace, its slow episode | context, pager, the member's pace, the episodes it opened |
//! | `pager::Pager` | every page's one way out | context, alert gate, the gang alerts sent |
//! | `rhythm::Judge` | the rules a worker is judged by (pure) | the policy, what was learned of its rhythm |
//!
//! Map: `evaluate` (one worker's evaluation, top to bottom: what it stands on, verdict and plan,
//! the stage exported, the effects carried out), `incident` (timers, alerts, episodes,
//! incarnations), `pipeline` (the state machine's one loop: decide → lock → logs → revalidate →
//! caps → claim → recheck → lock check → command → verify), `before_command` (its steps up to
//! the command), `limits` (breaker and budget), `command` (the command, its verification,
//! failure, the claim), each sending its own pages, `pager`, `pages` (the worker's pages outside the pipeline; the
//! gang's are `gang_pages`), `gang` (a member judged with its gang), `gang_reads` (a gang read
//! once a cycle), `gang_decision`, `gang_pace` and `gang_pace_kept` (what outlives an agent),
//! `rhythm` (what a look learns, and the `Judge`).

mod before_command;
mod command;
mod evaluate;
mod gang;
mod gang_decision;
mod gang_pace;
mod gang_pace_kept;
mod gang_pages;
mod gang_reads;
mod incident;
mod limits;
mod pager;
mod pages;
mod pipeline;
mod rhythm;

use crate::alerts::gate::AlertGate;
use crate::clock::Millis;
use crate::hang::context::Context;
use crate::hang::journal::{About, Journal};
use crate::hang::model::{Gang, Incident, Marks, WorkerStatus};
use crate::hang::policy::{NodeContext, Verdict};
use crate::hang::policy_life::Claim;
use crate::hang::policy_pipeline::Skip;
use crate::hang::stand_down::NodeWatch;
use crate::runtime::container::Container;
use crate::trail::Code;

pub use crate::hang::marks::worker_read_keys;

impl Skip {
    /// The trail's code for this skip.
    fn code(self) -> Code {
        match self {
            Skip::LockHeld => Code::SkippedLockHeld,
            Skip::BreakerOpen => Code::SkippedBreakerOpen,
            Skip::BudgetExhausted => Code::SkippedBudgetExhausted,
            Skip::LockExpiring => Code::SkippedLockExpiring,
            Skip::ContainerChanged => Code::SkippedContainerChanged,
            Skip::NotRunning => Code::SkippedNotRunning,
            Skip::Cancelled(_) => Code::CancelledRecovered,
            Skip::NodeState => Code::CancelledNodeState,
            Skip::LogsFailed => Code::AbortedLogsFailed,
            Skip::NotRestartable => Code::SkippedNotRestartable,
            Skip::RetryPending => Code::SkippedRetryPending,
            Skip::AlertOnly => Code::SkippedAlertOnly,
            Skip::Fruitless => Code::SkippedFruitless,
            Skip::Blocked => Code::GangBlocked,
            Skip::Decided => Code::GangDecided,
        }
    }
}

/// The worker under evaluation and what this cycle read about it.
pub(crate) struct Case<'a> {
    pub(crate) c: &'a Container,
    pub(crate) v: Verdict,
    pub(crate) status: Option<&'a WorkerStatus>,
    pub(crate) marks: &'a Marks,
    /// Why the record could not be read, when it exists but is not a readable hash.
    pub(crate) invalid: Option<&'a str>,
    /// What the cooldown marker said of a restart, and whether the node lock was held, as the
    /// cycle read them: with the marks, the incident's stage (`crate::hang::policy_life`).
    pub(crate) held: (Claim, bool),
    /// The coordinator's clock as the cycle read the worker: the time of its evaluation's steps.
    pub(crate) now: Millis,
}

impl Case<'_> {
    fn worker(&self) -> &str {
        &self.c.worker
    }
    fn about(&self) -> About<'_> {
        About::worker(&self.c.worker, self.v)
    }
    /// Its restarts belong to someone else, by its container's label or its own record.
    fn alert_only(&self) -> bool {
        self.c.alert_only || self.status.is_some_and(|s| s.alert_only)
    }
    /// Its gang, when it is a member of one.
    fn gang(&self) -> Option<&Gang> {
        self.status?.gang.as_ref()
    }
}

/// An incident the restart path acts on.
struct Act<'a> {
    case: &'a Case<'a>,
    inc: &'a Incident,
    /// When the broken condition began.
    since: Millis,
    /// Whose decision the pass carries out, and so what it still owes. `None`: the worker's own
    /// incident decides its restart: the pass judges the worker's run of fruitless restarts,
    /// takes the fleet's unit beside the node's breaker, and sends the `restarting` page (a
    /// gang's are the gang's: a count left on a member would follow its worker id into its next,
    /// unrelated job). `Some`: a gang member carries out its gang's decision: the gang judged
    /// its run, took the fleet's unit and paged once for all its members, and the pass reads
    /// the decision again at the last moment to check that it still stands.
    order: Option<&'a GangOrder>,
}

/// What a gang member's restart carries: the gang's decision (revalidated at the last moment).
/// It takes this node's breaker only: the fleet unit was the gang's (`Caps::fleet`).
struct GangOrder {
    gang: String,
    decision: crate::hang::model_gang::Decision,
}

impl Act<'_> {
    fn about(&self) -> About<'_> {
        self.case.about().incident(&self.inc.id)
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// One worker's evaluation: the shared context, and what it needs of the agent for this pass.
pub(crate) struct RestartPath<'a> {
    pub(crate) ctx: &'a Context,
    pub(crate) journal: &'a mut Journal,
    pub(crate) alerts: &'a mut AlertGate,
    /// Shutdown, maintenance and GPU state, read again right before the command.
    pub(crate) watch: &'a NodeWatch,
    /// The node's state for this worker, at the start of the evaluation.
    pub(crate) node: NodeContext,
    /// Evidence lines (e.g. a recent XID on the worker's GPU) for its alerts.
    pub(crate) gpu_evidence: &'a [String],
    /// Marks to write with the cycle's batch (progress, rhythm; an incarnation's TTL).
    pub(crate) deferred: &'a mut Vec<crate::coord::Op>,
    /// What the agent keeps for its gangs: the cycle's entries, reads (the runs kept across
    /// cycles) and breaker reading, the gang alerts it sent, the slow episodes it opened.
    pub(crate) gangs: &'a mut crate::hang::model_gang::GangCycle,
    /// What this agent has learned of the worker's rhythm (`crate::hang::policy_rhythm`).
    pub(crate) rhythm: &'a mut crate::hang::policy_rhythm::Rhythm,
    /// What the node shows that slows the worker down (its GPUs' slowdowns, low clocks, link and
    /// ECC rises and XIDs; the host's pressure and CPU steal).
    pub(crate) slow_signals: &'a [String],
    /// Of those, one its workload cannot cause (`crate::accel::gpu::policy_slow::machine_slow`,
    /// the hypervisor's steal): only that lets a slow gang's taint evict (`NoExecute`).
    pub(crate) machine_slow: bool,
    /// What this agent has measured of the worker's pace (`crate::hang::policy_pace`).
    pub(crate) pace: &'a mut crate::hang::policy_pace::Pace,
}
