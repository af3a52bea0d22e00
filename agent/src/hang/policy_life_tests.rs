//! The life's tables and decoding, exhaustively and walked cycle by cycle.

use super::*;
use crate::hang::model::{Incident, Retry};

const MIN: Millis = 60_000;

fn cfg() -> PolicyConfig {
    PolicyConfig::default()
}

fn incident(started: Millis) -> Option<Incident> {
    Some(Incident { started, id: "inc-1".into() })
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
    let at = |m: &Marks, claim: Claim, locked: bool| {
        stage(m, m.incident.as_ref(), (claim, locked), hung, now, &c)
    };
    let mut m = Marks::default();
    assert_eq!(at(&m, Claim::None, false), Stage::Quiet);
    m.suspect = Some((now - 3 * MIN, now - MIN));
    assert_eq!(at(&m, Claim::None, false), Stage::Suspect);
    m.incident = incident(now - MIN);
    assert_eq!(at(&m, Claim::None, false), Stage::Confirmed, "restart_delay is 3 min");
    m.incident = incident(now - 3 * MIN);
    assert_eq!(at(&m, Claim::None, false), Stage::Due);
    assert_eq!(at(&m, Claim::None, true), Stage::Deciding);
    m.retry = Some(Retry { incident: "inc-1".into(), failures: 1, not_before: now + MIN });
    assert_eq!(at(&m, Claim::None, true), Stage::BackingOff);
    m.retry = None;
    m.cooldown = true;
    assert_eq!(at(&m, Claim::InFlight, true), Stage::Restarting);
    m = Marks { cooldown: true, restarted_at: Some(now - MIN), ..Marks::default() };
    assert_eq!(at(&m, Claim::Done, false), Stage::Booting);
    m.cooldown = false;
    assert_eq!(at(&m, Claim::None, false), Stage::Recovered);
    m.escalated = true;
    assert_eq!(at(&m, Claim::None, false), Stage::Escalated);
    // An errored worker's incident is due at once.
    let errored = Marks { incident: incident(now), ..Marks::default() };
    let by = |v| stage(&errored, errored.incident.as_ref(), (Claim::None, false), v, now, &c);
    assert_eq!(by(Verdict::Errored), Stage::Due);
    // An incident this agent does not confirm (another one did) waits as confirmed.
    assert_eq!(by(Verdict::Suspect), Stage::Confirmed);
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
        let s = stage(&marks, marks.incident.as_ref(), (Claim::None, false), v, now, &c);
        let last = *seen.last().unwrap();
        assert!(follows(Unit::Worker, last, s), "t={t}s: {last:?} -> {s:?} ({effects:?})");
        if s != last {
            seen.push(s);
        }
    }
    assert_eq!(seen, [Stage::Quiet, Stage::Suspect, Stage::Confirmed, Stage::Due]);
}

/// Exhaustively: the life's main line is a path of single steps; a claim (`restarting`) and
/// a pass in flight (`deciding`) follow only a due incident; a page for a restart that did
/// not help (`escalated`) follows only our restart; nothing before `due` moves to a claim.
#[test]
fn the_table_of_the_life_holds_its_shape() {
    use Stage::*;
    let line =
        [Quiet, Suspect, Confirmed, Due, Deciding, Restarting, Booting, Recovered, Escalated];
    for pair in line.windows(2) {
        assert!(follows(Unit::Worker, pair[0], pair[1]), "{:?} -> {:?}", pair[0], pair[1]);
    }
    assert!(follows(Unit::Worker, Due, Booting), "a pass runs whole within a cycle");
    let due = |s: Stage| matches!(s, Due | BackingOff | Deciding);
    for &from in Stage::ALL {
        assert!(
            follows(Unit::Worker, from, from) && follows(Unit::Worker, from, Quiet),
            "{from:?}"
        );
        assert!(follows(Unit::Worker, from, Booting), "anyone's restart: {from:?}");
        for &to in Stage::ALL {
            if from == to || !follows(Unit::Worker, from, to) {
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
            assert!(!follows(Unit::Worker, from, to), "{from:?} -> {to:?}");
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
    let verdicts = [Verdict::Hung, Verdict::Errored, Verdict::Suspect, Verdict::Healthy];
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
                let s = stage(&marks, Some(&inc), (claim, locked), v, now, &c);
                let old =
                    !cooldown && retry_open(&marks, now) && restart_due(v, inc.started, now, &c);
                assert_eq!(
                    s.runs_pipeline(),
                    old,
                    "age {age} backoff {backoff:?} cooldown {cooldown} locked {locked} {v:?} {claim:?}: {s:?}"
                );
            }
        }
    }
    let running: Vec<Stage> = Stage::ALL.iter().copied().filter(|s| s.runs_pipeline()).collect();
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

/// docs/how-it-decides.md's tables of the life are these tables: the worker's, then (under "A
/// gang's incident") the gang's, their stages in this order, each with exactly the stages
/// `follows` lets it move on to.
#[test]
fn the_documented_life_is_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/how-it-decides.md");
    let text = std::fs::read_to_string(path).expect("docs/how-it-decides.md");
    let section = text
        .split("## The life of an incident")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the section");
    let (worker, gang) = section.split_once("### A gang's incident").expect("the gang's part");
    assert_eq!(documented(worker), coded(Unit::Worker));
    assert_eq!(documented(gang), coded(Unit::Gang));
}

type Rows = Vec<(String, Vec<String>)>;

/// The rows of a markdown table of the life: each stage, and the stages its last cell names.
fn documented(text: &str) -> Rows {
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
    };
    text.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            let stage = ticked(cells[1]).remove(0);
            let mut to = ticked(cells[3]);
            to.sort();
            to.dedup();
            (stage, to)
        })
        .collect()
}

fn coded(unit: Unit) -> Rows {
    table(unit)
        .into_iter()
        .map(|(from, to)| {
            let mut to: Vec<String> = to.iter().map(|s| s.as_str().to_string()).collect();
            to.sort();
            (from.as_str().to_string(), to)
        })
        .collect()
}

/// Exhaustively: the gang's life takes only its own stages; its main line is a path of single
/// steps; `restarting` follows only `due` (a decision is taken only when the restart is due) or
/// `escalated` (the same decision, a member moving again for a while);
/// `escalated` follows only a standing decision; `recovered` only a decision; nothing before
/// `due` moves to a decision; and every gang step the worker's table also has says the same
/// thing where both see it (a new incident, every stage back to quiet).
#[test]
fn the_gang_table_of_the_life_holds_its_shape() {
    use Stage::*;
    let gang = Unit::Gang;
    for pair in [Quiet, Confirmed, Due, Restarting, Escalated, Recovered].windows(2) {
        assert!(follows(gang, pair[0], pair[1]), "{:?} -> {:?}", pair[0], pair[1]);
    }
    assert!(follows(gang, Restarting, Recovered), "every member beat since");
    for &from in Stage::ALL {
        let own = Stage::of(gang).contains(&from);
        assert_eq!(follows(gang, from, from), own, "{from:?}");
        assert_eq!(follows(gang, from, Quiet), own, "{from:?}");
        for &to in Stage::ALL {
            if from == to || !follows(gang, from, to) {
                continue;
            }
            assert!(own && Stage::of(gang).contains(&to), "{from:?} -> {to:?}");
            if to == Restarting {
                assert!(matches!(from, Due | Escalated), "{from:?} -> restarting");
            }
            if to == Escalated {
                assert_eq!(from, Restarting, "escalated only from a standing decision");
            }
            if to == Recovered {
                assert!(matches!(from, Restarting | Escalated), "{from:?} -> recovered");
            }
        }
    }
    for from in [Quiet, Confirmed, Recovered] {
        for to in [Restarting, Escalated] {
            assert!(!follows(gang, from, to), "{from:?} -> {to:?}");
        }
    }
    for to in [Confirmed, Due] {
        assert!(follows(Unit::Worker, Quiet, to) && follows(gang, Quiet, to));
        assert!(follows(Unit::Worker, Recovered, to) && follows(gang, Recovered, to));
    }
}
