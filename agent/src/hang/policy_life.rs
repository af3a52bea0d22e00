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
//! Pure: the marks are decoded by `crate::hang::marks`, `now` is an argument. The stage is what
//! `vigil_worker_incident_stage` exports for each worker; `vigil policy` prints the table.

use crate::clock::Millis;
use crate::config::PolicyConfig;
use crate::hang::model::{Incident, Marks};
use crate::hang::policy::{Effect, Verdict};
use crate::hang::policy_due::{restart_due, retry_open};

/// Where a worker's incident stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    pub(crate) const ALL: [Stage; 10] = [
        Stage::Quiet,
        Stage::Suspect,
        Stage::Confirmed,
        Stage::Due,
        Stage::BackingOff,
        Stage::Deciding,
        Stage::Restarting,
        Stage::Booting,
        Stage::Recovered,
        Stage::Escalated,
    ];

    /// A pass runs the restart pipeline from this stage: the restart is due and nothing holds
    /// it (`deciding`: another pass holds the node lock — the pipeline's lock step refuses, and
    /// says so in the trail). The engine asks the life, not the marks.
    pub(crate) fn runs_pipeline(self) -> bool {
        matches!(self, Stage::Due | Stage::Deciding)
    }

    /// Stable name for metric labels and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Stage::Quiet => "quiet",
            Stage::Suspect => "suspect",
            Stage::Confirmed => "confirmed",
            Stage::Due => "due",
            Stage::BackingOff => "backing-off",
            Stage::Deciding => "deciding",
            Stage::Restarting => "restarting",
            Stage::Booting => "booting",
            Stage::Recovered => "recovered",
            Stage::Escalated => "escalated",
        }
    }
}

/// The stage the marks say, as a cycle reads them: `claim` from the cooldown marker (while
/// `marks.cooldown` stands), `locked` whether the node lock is held, `v` the cycle's verdict
/// (whose restart wait makes an incident due).
pub(crate) fn stage(
    marks: &Marks,
    claim: Claim,
    locked: bool,
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
    if let Some(inc) = &marks.incident {
        return match (
            restart_due(v, inc.started, now, cfg),
            retry_open(marks, now),
        ) {
            (false, _) => Stage::Confirmed,
            (true, false) => Stage::BackingOff,
            (true, true) if locked => Stage::Deciding,
            (true, true) => Stage::Due,
        };
    }
    if marks.escalated && marks.restarted_at.is_some() {
        return Stage::Escalated;
    }
    if marks.suspect.is_some() {
        return Stage::Suspect;
    }
    if marks.restarted_at.is_some() {
        return Stage::Recovered;
    }
    Stage::Quiet
}

/// The stage of `incident` as the cycle acts on it: the marks it read, with the incident its
/// bookkeeping left (the one it read, opened now, or another agent's its SET NX found).
pub(crate) fn acting(
    marks: &Marks,
    incident: &Incident,
    (claim, locked): (Claim, bool),
    v: Verdict,
    now: Millis,
    cfg: &PolicyConfig,
) -> Stage {
    let m = Marks {
        incident: Some(incident.clone()),
        ..marks.clone()
    };
    stage(&m, claim, locked, v, now, cfg)
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
            Effect::ForgetRestart => {
                m.restarted_at = None;
                m.escalated = false;
            }
            Effect::OpenIncident if m.incident.is_none() => {
                // SET NX: an incident another agent opened first stands with its own start.
                m.incident = Some(Incident {
                    started: now,
                    id: String::new(),
                });
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
/// once. The table of the life: each arm says which stages a stage moves on to.
pub(crate) fn follows(from: Stage, to: Stage) -> bool {
    use Stage::*;
    if from == to || to == Quiet {
        // The data says it is fine, or the marks expired or were lost in a failover.
        return true;
    }
    if to == Booting {
        // A restart done: ours (from a due incident) or anyone else's (from any stage).
        return true;
    }
    match from {
        // A stale sighting, an incident another agent confirmed, an error due at once.
        Quiet => matches!(to, Suspect | Confirmed | Due),
        // Confirmed by a second observation (an error's incident is due at once).
        Suspect => matches!(to, Confirmed | Due),
        // Persistence satisfied (held at once by a failed restart's backoff, when one runs).
        Confirmed => matches!(to, Due | BackingOff),
        // A pass takes the node lock and claims the restart; a failed restart backs off.
        Due | BackingOff | Deciding => matches!(to, Due | BackingOff | Deciding | Restarting),
        // Failed: the claim released, the incident due (or backing off) again, or judged by
        // an agent that has not confirmed it.
        Restarting => matches!(to, Due | BackingOff | Confirmed),
        // The first beat (recovered); still broken `escalate_after` later (escalated); a new
        // hang of the new incarnation.
        Booting => matches!(to, Recovered | Escalated | Suspect | Confirmed | Due),
        // Broken again after our restart: paged (escalated), or a new incident.
        Recovered => matches!(to, Escalated | Suspect | Confirmed | Due),
        // A new incident of the still-broken worker.
        Escalated => matches!(to, Suspect | Confirmed | Due),
    }
}

/// The life as `vigil policy` prints it: each stage and the stages it moves on to (besides
/// quiet, which every stage may return to), from [`follows`].
pub(crate) fn table() -> Vec<(Stage, Vec<Stage>)> {
    Stage::ALL
        .iter()
        .map(|&from| {
            let to = Stage::ALL
                .into_iter()
                .filter(|&to| to != from && to != Stage::Quiet && follows(from, to))
                .collect();
            (from, to)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hang::model::{Incident, Retry};

    const MIN: Millis = 60_000;

    fn cfg() -> PolicyConfig {
        PolicyConfig::default()
    }

    fn incident(started: Millis) -> Option<Incident> {
        Some(Incident {
            started,
            id: "inc-1".into(),
        })
    }

    #[test]
    fn every_stage_has_a_name_of_its_own() {
        let names: std::collections::BTreeSet<_> = Stage::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names.len(), Stage::ALL.len());
    }

    /// The life of one hang, mark by mark, as the protocol writes them.
    #[test]
    fn the_marks_decode_into_the_stage_of_the_life() {
        let c = cfg();
        let now = 100 * MIN;
        let hung = Verdict::Hung;
        let at = |m: &Marks, claim: Claim, locked: bool| stage(m, claim, locked, hung, now, &c);
        let mut m = Marks::default();
        assert_eq!(at(&m, Claim::None, false), Stage::Quiet);
        m.suspect = Some((now - 3 * MIN, now - MIN));
        assert_eq!(at(&m, Claim::None, false), Stage::Suspect);
        m.incident = incident(now - MIN);
        assert_eq!(
            at(&m, Claim::None, false),
            Stage::Confirmed,
            "restart_delay is 3 min"
        );
        m.incident = incident(now - 3 * MIN);
        assert_eq!(at(&m, Claim::None, false), Stage::Due);
        assert_eq!(at(&m, Claim::None, true), Stage::Deciding);
        m.retry = Some(Retry {
            incident: "inc-1".into(),
            failures: 1,
            not_before: now + MIN,
        });
        assert_eq!(at(&m, Claim::None, true), Stage::BackingOff);
        m.retry = None;
        m.cooldown = true;
        assert_eq!(at(&m, Claim::InFlight, true), Stage::Restarting);
        m = Marks {
            cooldown: true,
            restarted_at: Some(now - MIN),
            ..Marks::default()
        };
        assert_eq!(at(&m, Claim::Done, false), Stage::Booting);
        m.cooldown = false;
        assert_eq!(at(&m, Claim::None, false), Stage::Recovered);
        m.escalated = true;
        assert_eq!(at(&m, Claim::None, false), Stage::Escalated);
        // An errored worker's incident is due at once.
        let errored = Marks {
            incident: incident(now),
            ..Marks::default()
        };
        assert_eq!(
            stage(&errored, Claim::None, false, Verdict::Errored, now, &c),
            Stage::Due
        );
        // An incident this agent does not confirm (another one did) waits as confirmed.
        assert_eq!(
            stage(&errored, Claim::None, false, Verdict::Suspect, now, &c),
            Stage::Confirmed
        );
    }

    /// A hang walked through the real verdict and plan, one cycle at a time: the stage each
    /// cycle leaves is the life's next step, never a jump the table does not allow.
    #[test]
    fn a_hang_walked_through_the_plan_moves_one_step_at_a_time() {
        use crate::hang::model::WorkerStatus;
        use crate::hang::policy::{plan, verdict, NodeContext};
        let c = cfg();
        let status = WorkerStatus::processing(Some(0));
        let mut marks = Marks::default();
        let mut seen = vec![Stage::Quiet];
        for t in (0..=400).step_by(15) {
            let now = t * 1000;
            let v = verdict(Some(&status), &marks, NodeContext::default(), now, &c);
            let effects = plan(v, Some(&status), &marks, now, &c);
            marks = project(&marks, &effects, now);
            let s = stage(&marks, Claim::None, false, v, now, &c);
            let last = *seen.last().unwrap();
            assert!(follows(last, s), "t={t}s: {last:?} -> {s:?} ({effects:?})");
            if s != last {
                seen.push(s);
            }
        }
        assert_eq!(
            seen,
            [Stage::Quiet, Stage::Suspect, Stage::Confirmed, Stage::Due]
        );
    }

    /// Exhaustively: the life's main line is a path of single steps; a claim (`restarting`) and
    /// a pass in flight (`deciding`) follow only a due incident; a page for a restart that did
    /// not help (`escalated`) follows only our restart; nothing before `due` moves to a claim.
    #[test]
    fn the_table_of_the_life_holds_its_shape() {
        use Stage::*;
        let line = [
            Quiet, Suspect, Confirmed, Due, Deciding, Restarting, Booting, Recovered, Escalated,
        ];
        for pair in line.windows(2) {
            assert!(follows(pair[0], pair[1]), "{:?} -> {:?}", pair[0], pair[1]);
        }
        assert!(follows(Due, Booting), "a pass runs whole within a cycle");
        let due = |s: Stage| matches!(s, Due | BackingOff | Deciding);
        for from in Stage::ALL {
            assert!(follows(from, from) && follows(from, Quiet), "{from:?}");
            assert!(follows(from, Booting), "anyone's restart: {from:?}");
            for to in Stage::ALL {
                if from == to || !follows(from, to) {
                    continue;
                }
                if matches!(to, Restarting | Deciding) {
                    assert!(due(from), "{from:?} -> {to:?}");
                }
                if to == Escalated {
                    assert!(matches!(from, Booting | Recovered), "{from:?} -> escalated");
                }
                if to == Recovered {
                    assert_eq!(from, Booting, "recovered only from booting");
                }
            }
        }
        for from in [Quiet, Suspect, Confirmed] {
            for to in [Deciding, Restarting] {
                assert!(!follows(from, to), "{from:?} -> {to:?}");
            }
        }
    }

    /// Exhaustively over the marks a cycle acts on (the incident's age, a failed restart's
    /// backoff, the cooldown, the node lock, the verdict): the pipeline runs exactly when the
    /// restart is due by the incident's age and no backoff holds it — the rule the engine read
    /// from the marks before it asked the life.
    #[test]
    fn the_pipeline_runs_when_the_life_says_due_and_only_then() {
        let c = cfg();
        let now = 100 * MIN;
        let verdicts = [
            Verdict::Hung,
            Verdict::Errored,
            Verdict::Suspect,
            Verdict::Healthy,
        ];
        let claims = [Claim::None, Claim::InFlight, Claim::Done];
        for age in [0, MIN, 3 * MIN - 1, 3 * MIN, 10 * MIN] {
            for backoff in [None, Some(now - 1), Some(now + MIN)] {
                for (cooldown, locked, v, claim) in combinations(&verdicts, &claims) {
                    let marks = Marks {
                        cooldown,
                        retry: backoff.map(|not_before| Retry {
                            incident: "inc-1".into(),
                            failures: 1,
                            not_before,
                        }),
                        ..Marks::default()
                    };
                    let inc = incident(now - age).unwrap();
                    let s = acting(&marks, &inc, (claim, locked), v, now, &c);
                    let old = !cooldown
                        && retry_open(&marks, now)
                        && restart_due(v, inc.started, now, &c);
                    assert_eq!(
                        s.runs_pipeline(),
                        old,
                        "age {age} backoff {backoff:?} cooldown {cooldown} locked {locked} {v:?} {claim:?}: {s:?}"
                    );
                }
            }
        }
        let running: Vec<Stage> = Stage::ALL
            .into_iter()
            .filter(|s| s.runs_pipeline())
            .collect();
        assert_eq!(running, [Stage::Due, Stage::Deciding]);
    }

    /// (cooldown, locked, verdict, claim) for every combination.
    fn combinations(verdicts: &[Verdict], claims: &[Claim]) -> Vec<(bool, bool, Verdict, Claim)> {
        let mut out = Vec::new();
        for cooldown in [false, true] {
            for locked in [false, true] {
                for &v in verdicts {
                    for &claim in claims {
                        out.push((cooldown, locked, v, claim));
                    }
                }
            }
        }
        out
    }

    /// docs/how-it-decides.md's table of the life is this table: its stages in this order, each
    /// with exactly the stages `follows` lets it move on to.
    #[test]
    fn the_documented_life_is_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/how-it-decides.md");
        let text = std::fs::read_to_string(path).expect("docs/how-it-decides.md");
        let section = text
            .split("## The life of an incident")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("the section");
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let rows: Vec<(String, Vec<String>)> = section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').collect();
                let stage = ticked(cells[1]).remove(0);
                let mut to = ticked(cells[3]);
                to.sort();
                to.dedup();
                (stage, to)
            })
            .collect();
        let code: Vec<(String, Vec<String>)> = table()
            .into_iter()
            .map(|(from, to)| {
                let mut to: Vec<String> = to.iter().map(|s| s.as_str().to_string()).collect();
                to.sort();
                (from.as_str().to_string(), to)
            })
            .collect();
        assert_eq!(rows, code);
    }
}
