//! Maintenance data: the raw values of the GCE metadata keys Vigil watches, the node's
//! maintenance state derived from them (`crate::maintenance::policy::derive`), and a checkpoint
//! drill's result (`crate::maintenance::drill` measures it, `crate::metrics` exports it).

use serde::{Deserialize, Serialize};
use strum::{IntoStaticStr, VariantArray};

use crate::clock::Millis;

/// The value of `instance/maintenance-event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum MaintenanceEvent {
    /// No event.
    None,
    /// A live migration starts within 60 s.
    MigrateOnHostMaintenance,
    /// The VM is stopped for maintenance within 60 s.
    TerminateOnHostMaintenance,
}

impl MaintenanceEvent {
    /// The documented values only: an unknown one must not be mistaken for `NONE` (a false
    /// "all clear") nor for an event.
    pub(crate) fn parse(value: &str) -> Option<MaintenanceEvent> {
        Self::VARIANTS.iter().copied().find(|e| e.as_str() == value.trim())
    }
}

as_str!(pub MaintenanceEvent);

/// `maintenance_status` of a scheduled event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UpcomingStatus {
    /// Scheduled, not started.
    #[default]
    Pending,
    /// The window is open.
    Ongoing,
}

/// The kind of interruption, as GKE's `interruption_count` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub enum Interruption {
    Preemption,
    HostMaintenance,
}

/// Raw values of the watched keys, as last read successfully. `None` = not read yet / absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawMetadata {
    /// `instance/maintenance-event`.
    pub maintenance_event: Option<MaintenanceEvent>,
    /// `instance/upcoming-maintenance`, parsed; `None` when nothing is scheduled.
    pub upcoming: Option<UpcomingMaintenance>,
    /// `instance/preempted`: `TRUE` / `FALSE`.
    pub preempted: Option<bool>,
    /// The watcher's start-up read is over: every key answered once (or said it is absent, or
    /// refused), or the server could not be reached at all (not on GCE). Until then the values
    /// above are not "no maintenance" but "not read yet": restarts wait
    /// (`node::controller::first_reads`).
    pub settled: bool,
}

/// A scheduled maintenance event, from `instance/upcoming-maintenance`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpcomingMaintenance {
    /// e.g. `SCHEDULED`, `UNSCHEDULED`.
    pub maintenance_type: Option<String>,
    /// `PENDING` or `ONGOING`.
    pub status: UpcomingStatus,
    /// Whether the event can be started early by the customer (opportunistic maintenance).
    pub can_reschedule: bool,
    /// RFC 3339 window start/end as the server sent them.
    pub window_start: Option<String>,
    pub window_end: Option<String>,
    /// Latest time the window may be moved to (`latest_window_start_time`), when given.
    pub latest_window_start: Option<String>,
    /// `maintenance_reasons`, e.g. `PLANNED_UPDATE`, `FAILURE_GPU`; empty when not given.
    pub reasons: Vec<String>,
}

/// The node's maintenance phase, derived purely from [`RawMetadata`]. Declared, and so
/// ordered, from the mildest to the worst (none < pending < ongoing < terminating).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, IntoStaticStr, VariantArray,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Phase {
    /// Nothing scheduled, nothing happening.
    #[default]
    None,
    /// An event is scheduled (`upcoming-maintenance` PENDING); there is time to plan.
    Pending,
    /// The maintenance window is open or a live migration is imminent; workers may stall.
    Ongoing,
    /// The VM is about to stop (termination notice or preemption): checkpoint now.
    Terminating,
}

/// Where a maintenance signal came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub enum Source {
    /// The Compute Engine metadata server (`maintenance-event`, `upcoming-maintenance`,
    /// `preempted`).
    Metadata,
    /// GKE's labels and taint on the Node (`cloud.google.com/scheduled-maintenance-time`,
    /// `cloud.google.com/active-node-maintenance`, `cloud.google.com/impending-node-termination`).
    NodeLabels,
}

as_str!(pub Interruption, Phase, Source);

/// What the agent acts on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MaintenanceState {
    /// The phase the agent acts on (labels, taint, checkpoints, restart pause).
    pub phase: Phase,
    /// Window of the scheduled event, RFC 3339 as the server sent it; `None` when none.
    pub window_start: Option<String>,
    pub window_end: Option<String>,
    /// The scheduled event may be started early (opportunistic maintenance).
    pub can_reschedule: bool,
    /// Machine-readable reasons, e.g. `preempted`, `terminate-on-host-maintenance`,
    /// `migrate-on-host-maintenance`, `upcoming-pending`, `upcoming-ongoing`.
    pub reasons: Vec<&'static str>,
    /// Interruption type for counters, when the phase interrupts the workers.
    pub interruption: Option<Interruption>,
    /// The sources that report a phase other than `none`, metadata first; empty when none does.
    pub sources: Vec<Source>,
}

impl MaintenanceState {
    /// The sources as one word for the record and `vigil status`: `metadata`, `node-labels`,
    /// `metadata+node-labels`, or empty.
    pub(crate) fn sources_str(&self) -> String {
        self.sources.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("+")
    }
}

/// A drill's result, as `vigil drill checkpoint` prints it and the drilling node exports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct DrillResult {
    /// `gang:<id>`, `worker:<node>/<worker>` or `node:<node>`.
    pub(crate) target: String,
    /// When the drill ran (ms).
    pub(crate) at: Millis,
    pub(crate) asked: usize,
    pub(crate) acked: usize,
    /// Seconds to the acknowledgements: the median and the last (every member's, when all acked;
    /// the drill's whole wait otherwise).
    pub(crate) p50: f64,
    pub(crate) all: f64,
    /// The budgets it was measured against (seconds) and whether every ack came within each.
    pub(crate) preemption_budget: f64,
    pub(crate) maintenance_budget: f64,
    pub(crate) fits_preemption: bool,
    pub(crate) fits_maintenance: bool,
    /// The members that did not acknowledge within the drill.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) missing: Vec<String>,
}
