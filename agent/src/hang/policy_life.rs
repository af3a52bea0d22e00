//! The life of one worker's incident, in one type: [`Stage`]. What the worker's shared marks say
//! it is now ([`stage`]), and which stage may follow which ([`follows`]: one step of the
//! protocol), so the life of a hang reads in one place:
//!
//! quiet → suspect (a stale heartbeat seen once) → confirmed (the incident timer runs) → due
//! (persistence satisfied) → deciding (a pass holds the node lock) → restarting (the claim
//! written, the command in flight) → booting (the restart done, the new incarnation not beating
//! yet) → recovered (beating again; the restart remembered for `escalate_after`) or escalated
//! (still broken after it: a person paged once). Side branches: backing off (a failed restart's
//! backoff holds a due restart), an incident that recovers before its restart, and every stage
//! back to quiet (the data says the worker is fine, or the marks expired or were lost in a
//! failover).
//!
//! A gang's incident (one for a whole distributed job) lives the same life in the same type,
//! without the stages its members' own agents hold (suspect, backing off, deciding, booting):
//! confirmed → due → restarting (its decision stands while each member restarts, over several
//! cycles) → recovered (every member beat since) or escalated. `crate::hang::policy_gang::stage`
//! decodes it from the gang's shared state; [`moves_on`] holds both tables (by restart
//! [`Unit`]), [`follows`] reads them.
//!
//! Pure: the marks are decoded by `crate::hang::marks`, `now` is an argument. The stage is what
//! `vigil_worker_incident_stage` exports for each worker; `vigil policy` prints the tables.

use crate::clock::Millis;
use crate::config::PolicyConfig;
use crate::hang::model::{Incident, Marks};
use crate::hang::policy::{Effect, Verdict};
use crate::hang::policy_due::{restart_due, retry_open};
use crate::hang::policy_pipeline::Unit;
use strum::{IntoStaticStr, VariantArray};

/// Where a worker's incident stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "kebab-case")]
pub(crate) enum Stage {
    /// Nothing open.
    Quiet,
    /// A stale heartbeat seen once; the confirming observation has not come.
    Suspect,
    /// Confirmed hung (or errored): the incident timer runs; its restart is not due yet.
    Confirmed,
    /// The restart is due (`restart_delay` past the incident's start) and nothing holds it.
    Due,
    /// Due, but a failed restart's backoff holds the next try.
    BackingOff,
    /// Due, and the node lock is held: a pass on this node is deciding (this worker's, or
    /// another worker's: one restart at a time on a node).
    Deciding,
    /// Our restart is claimed (the cooldown marker written before the command) and not yet
    /// verified: the command is in flight, or its instance died mid-command.
    Restarting,
    /// A restart is done (ours verified, or someone else's seen) and the new incarnation has not
    /// beaten since: the cooldown's "this is me".
    Booting,
    /// Beating again after our restart; the restart is remembered while `escalate_after` runs.
    Recovered,
    /// Still broken `escalate_after` after our restart: a person was paged.
    Escalated,
}

/// What a worker's cooldown marker says of its restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// No marker, or one whose booting is over.
    None,
    /// A claim whose restart is not verified (no `:done`).
    InFlight,
    /// A verified restart (`:done`) or someone else's (`:external`).
    Done,
}

impl Stage {
    pub(crate) const ALL: &'static [Stage] = <Stage as strum::VariantArray>::VARIANTS;

    /// The stages of `unit`'s life.
    pub(crate) fn of(unit: Unit) -> &'static [Stage] {
        use Stage::*;
        match unit {
            Unit::Worker => Stage::ALL,
            // A gang's incident: its members' agents hold the other stages for each member.
            Unit::Gang => &[Quiet, Confirmed, Due, Restarting, Recovered, Escalated],
        }
    }

    /// A pass runs the restart pipeline from this stage: the restart is due and nothing holds
    /// it (`deciding`: another pass holds the node lock — the pipeline's lock step refuses, and
    /// says so in the trail). The engine asks the life, not the marks.
    pub(crate) fn runs_pipeline(self) -> bool {
        matches!(self, Stage::Due | Stage::Deciding)
    }
}
as_str!(pub(crate) Stage);

/// The stage the marks say, as a cycle reads them. `incident`: the incident to judge —
/// `marks.incident` as read, or the one the cycle's bookkeeping left (opened now, or another
/// agent's found by SET NX). `(claim, locked)`: what the cooldown marker says of its restart
/// (while `marks.cooldown` stands), and whether the node lock is held. `v`: the cycle's verdict
/// (whose restart wait makes an incident due).
pub(crate) fn stage(
    marks: &Marks,
    incident: Option<&Incident>,
    (claim, locked): (Claim, bool),
    v: Verdict,
    now: Millis,
    cfg: &PolicyConfig,
) -> Stage {
    if marks.cooldown {
        return match claim {
            Claim::InFlight => Stage::Restarting,
            Claim::Done | Claim::None => Stage::Booting,
        };
    }
    if let Some(inc) = incident {
        return match (restart_due(v, inc.started, now, cfg), retry_open(marks, now)) {
            (false, _) => Stage::Confirmed,
            (true, false) => Stage::BackingOff,
            (true, true) if locked => Stage::Deciding,
            (true, true) => Stage::Due,
        };
    }
    match (marks.restarted_at.is_some(), marks.escalated, marks.suspect.is_some()) {
        (true, true, _) => Stage::Escalated,
        (_, _, true) => Stage::Suspect,
        (true, _, _) => Stage::Recovered,
        _ => Stage::Quiet,
    }
}

/// The marks as a cycle's bookkeeping effects leave them (the sighting, the timer, the
/// restart's memory and its escalation): the stage a cycle exports is the one it leaves, not the
/// one it read. The restart pipeline's own marks (`ConsiderRestart`) are the next cycle's to
/// read: a cycle that restarts exports `due` (or `deciding`), the next one `booting`.
pub(crate) fn project(marks: &Marks, effects: &[Effect], now: Millis) -> Marks {
    let mut m = marks.clone();
    for e in effects {
        match e {
            Effect::RecordSuspect { heartbeat } => m.suspect = Some((*heartbeat, now)),
            Effect::ClearSuspect => m.suspect = None,
            Effect::ClearIncident(_) => m.incident = None,
            Effect::ForgetRestart => (m.restarted_at, m.escalated) = (None, false),
            Effect::OpenIncident if m.incident.is_none() => {
                // SET NX: an incident another agent opened first stands with its own start.
                m.incident = Some(Incident { started: now, id: String::new() });
            }
            Effect::Escalate => m.escalated = true,
            _ => {}
        }
    }
    m
}

/// Whether `to` may follow `from` in one step of the protocol (staying is always one), as a
/// reader of the marks sees it: a pass on this node runs lock → claim → command → verify in one
/// cycle, so a due incident's next stage is usually `booting` (`deciding` and `restarting` show
/// while a pass is in flight, or when its instance died mid-command); anyone else's restart
/// (an operator's, kubelet's) marks any stage `booting`; an errored worker's incident is due at
/// once. Besides what every stage may do, the table of the life: [`moves_on`].
pub(crate) fn follows(unit: Unit, from: Stage, to: Stage) -> bool {
    let own = |s: Stage| Stage::of(unit).contains(&s);
    // Staying; back to quiet (the data says it is fine, or the marks expired or were lost in a
    // failover); a worker's restart done: ours (from a due incident) or anyone else's (from any
    // stage).
    let always = from == to || to == Stage::Quiet || (unit == Unit::Worker && to == Stage::Booting);
    own(from) && own(to) && (always || moves_on(unit, from).contains(&to))
}

/// The table of the life: the stages `from` moves on to in one step of `unit`'s protocol,
/// besides those [`follows`] allows every stage (staying, quiet, a worker's `booting`). A gang's,
/// as the gang's reader sees its state each cycle: its restart runs over several cycles (each
/// member's agent restarts its own, under its node's lock), so `restarting` is seen, and
/// `recovered` follows it without a `booting` of the gang's own.
fn moves_on(unit: Unit, from: Stage) -> &'static [Stage] {
    use Stage::*;
    match (unit, from) {
        // A stale sighting, an incident another agent confirmed, an error due at once.
        (Unit::Worker, Quiet) => &[Suspect, Confirmed, Due],
        // Confirmed by a second observation (an error's incident is due at once).
        (Unit::Worker, Suspect) => &[Confirmed, Due],
        // Persistence satisfied (held at once by a failed restart's backoff, when one runs).
        (Unit::Worker, Confirmed) => &[Due, BackingOff],
        // A pass takes the node lock and claims the restart; a failed restart backs off.
        (Unit::Worker, Due | BackingOff | Deciding) => &[Due, BackingOff, Deciding, Restarting],
        // Failed: the claim released, the incident due (or backing off) again, or judged by
        // an agent that has not confirmed it.
        (Unit::Worker, Restarting) => &[Due, BackingOff, Confirmed],
        // The first beat (recovered); still broken `escalate_after` later (escalated); a new
        // hang of the new incarnation.
        (Unit::Worker, Booting) => &[Recovered, Escalated, Suspect, Confirmed, Due],
        // Broken again after our restart: paged (escalated), or a new incident.
        (Unit::Worker, Recovered) => &[Escalated, Suspect, Confirmed, Due],
        // A new incident of the still-broken worker.
        (Unit::Worker, Escalated) => &[Suspect, Confirmed, Due],
        // The collective stopped: the incident opened (due at once on learned evidence).
        (Unit::Gang, Quiet) => &[Confirmed, Due],
        // Persistence satisfied.
        (Unit::Gang, Confirmed) => &[Due],
        // Decided under the gang's lock; or the learned evidence it was due on lost (a member's
        // agent lost its rule): the fixed rule's wait.
        (Unit::Gang, Due) => &[Restarting, Confirmed],
        // Every member beat since the decision (recovered); none progresses `escalate_after`
        // after it (escalated); the cooldown over with the gang still stopped: the incident
        // closes and the next opens in the same cycle.
        (Unit::Gang, Restarting) => &[Escalated, Recovered, Confirmed, Due],
        // A member moving again for a while; every member beat since; the cooldown over.
        (Unit::Gang, Escalated) => &[Restarting, Recovered, Confirmed, Due],
        // A new incident, "again" while `cooldown + escalate_after` runs from the restart.
        (Unit::Gang, Recovered) => &[Confirmed, Due],
        (Unit::Gang, Suspect | BackingOff | Deciding | Booting) => &[],
    }
}

/// The life as `vigil policy` prints it: each of `unit`'s stages and the stages it moves on to
/// (besides quiet, which every stage may return to), from [`follows`].
pub(crate) fn table(unit: Unit) -> Vec<(Stage, Vec<Stage>)> {
    let stages = Stage::of(unit);
    let moves = |from, to| to != from && to != Stage::Quiet && follows(unit, from, to);
    let onward = |from: Stage| stages.iter().copied().filter(|&to| moves(from, to)).collect();
    stages.iter().map(|&from| (from, onward(from))).collect()
}

#[cfg(test)]
#[path = "policy_life_tests.rs"]
mod tests;
