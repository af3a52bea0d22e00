//! A worker's marks in the coordinator, named in one place: which keys the one-round-trip read
//! of a worker asks for and in which order, how their values decode into [`Marks`], and the
//! formats of the marks the restart path writes (the restart claim, the retry record). Adding a
//! mark is an edit here, not in three places in step.

use std::time::Duration;

use crate::clock::{Millis, Stamp};
use crate::coord::{Coordinator, Keys, Result, WorkerKeys, WorkerRead};
use crate::hang::model::{Episode, Fruitless, Incident, Marks, Retry};
use crate::hang::model_rhythm::History;
use crate::hang::policy_life::Claim;
use crate::runtime::container::Container;
use strum::VariantArray;

/// TTL of the per-worker marks: long enough to outlive any incident.
pub(crate) const MARK_TTL: Duration = Duration::from_secs(24 * 3600);

/// TTL of a run of fruitless restarts: the breaker allows a few restarts a day, so a run may
/// span days; a week without a restart forgets it.
pub(crate) const FRUITLESS_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Appended to the restart claim once the restart is verified (see [`claim`]).
pub(crate) const DONE: &str = ":done";

/// The marks that one read of a worker returns, in order: NB the enum's declaration order is
/// the read order (`Slot::VARIANTS`, and a slot's index is its discriminant); the episodes, one
/// key each, follow. The order is the codec's alone: [`worker_keys`] and [`decode`] are built
/// from this one list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::VariantArray)]
enum Slot {
    Suspect,
    Incident,
    ErrorSince,
    Progress,
    Cooldown,
    Restarted,
    Escalated,
    Incarnation,
    Lock,
    Fruitless,
    Rhythm,
    GangLine,
    Retry,
}

impl Slot {
    fn key(self, k: &Keys, worker: &str) -> String {
        match self {
            Slot::Suspect => k.suspect(worker),
            Slot::Incident => k.incident(worker),
            Slot::ErrorSince => k.error_since(worker),
            Slot::Progress => k.progress(worker),
            Slot::Cooldown => k.cooldown(worker),
            Slot::Restarted => k.restarted(worker),
            Slot::Escalated => k.escalated(worker),
            Slot::Incarnation => k.incarnation(worker),
            Slot::Lock => k.lock(),
            Slot::Fruitless => k.fruitless(worker),
            Slot::Rhythm => k.rhythm(worker),
            Slot::GangLine => k.gang_line(worker),
            Slot::Retry => k.retry(worker),
        }
    }
}

/// The keys a worker's verdict reads besides its record, in one round trip: its marks, its
/// incarnation, the node lock, the retry record and the episodes. Public for the fleet
/// benchmark, which replays exactly this read.
pub fn worker_keys(k: &Keys, worker: &str) -> Vec<String> {
    let episodes = Episode::VARIANTS.iter().map(|e| k.episode(worker, e.as_str()));
    Slot::VARIANTS.iter().map(|s| s.key(k, worker)).chain(episodes).collect()
}

/// What one worker's read asks for: its record and its marks (the cycle's read of its node asks
/// this of every unambiguous worker, in one round trip: `crate::cycle::agent`).
pub fn worker_read_keys(k: &Keys, worker: &str) -> WorkerKeys {
    WorkerKeys { record: k.status(worker), keys: worker_keys(k, worker) }
}

/// The clock, the record and every mark of one worker, in one round trip (a worker read again
/// on its own: see `crate::cycle::agent`).
pub(crate) async fn read(coord: &dyn Coordinator, k: &Keys, worker: &str) -> Result<WorkerRead> {
    coord.read_worker(&k.status(worker), &worker_keys(k, worker)).await
}

/// A worker's read, decoded.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Decoded {
    pub(crate) marks: Marks,
    /// The container incarnation last recorded for the worker.
    pub(crate) incarnation: Option<String>,
    /// The cooldown marker or restart claim, as written.
    pub(crate) cooldown: Option<String>,
    /// Whether the node lock is held (by anyone).
    pub(crate) locked: bool,
}

impl Decoded {
    /// What the cooldown marker says of the restart it marks (`crate::hang::policy_life`).
    pub(crate) fn claim(&self) -> Claim {
        let Some(m) = self.cooldown.as_deref() else { return Claim::None };
        // A claim names the incarnation it restarts (`<ms>:<incident>:<incarnation>`); observe
        // mode's would-restart marker (`<ms>:<incident>`) names none: nothing is in flight.
        let claims = Stamp::parse(m).is_some_and(|s| s.rest.contains(':'));
        match booted_after(m) {
            None if claims => Claim::InFlight,
            _ => Claim::Done,
        }
    }
}

/// Decode the values of a [`worker_keys`] read.
pub(crate) fn decode(v: &[Option<String>]) -> Decoded {
    let get = |s: Slot| v.get(s as usize).cloned().flatten();
    let episodes = Episode::VARIANTS.iter().zip(v.iter().skip(Slot::VARIANTS.len()));
    let episodes = episodes.filter(|(_, value)| value.is_some()).map(|(e, _)| *e).collect();
    let marks = Marks {
        suspect: get(Slot::Suspect).and_then(|s| {
            let s = Stamp::parse(&s)?;
            Some((s.at, s.rest.parse().ok()?))
        }),
        incident: get(Slot::Incident).and_then(|s| Incident::decode(&s)),
        error_since: get(Slot::ErrorSince).and_then(|s| s.parse().ok()),
        progress: get(Slot::Progress).and_then(|s| Stamp::parse(&s)).map(|s| (s.rest, s.at)),
        cooldown: get(Slot::Cooldown).is_some(),
        restarted_at: get(Slot::Restarted).and_then(|s| s.parse().ok()),
        escalated: get(Slot::Escalated).is_some(),
        episodes,
        retry: get(Slot::Retry).and_then(|s| parse_retry(&s)),
        fruitless: get(Slot::Fruitless).and_then(|s| Fruitless::decode(&s)),
        rhythm: get(Slot::Rhythm).and_then(|s| History::decode(&s)),
        gang_line: get(Slot::GangLine).and_then(|s| s.parse().ok()),
    };
    let (incarnation, cooldown) = (get(Slot::Incarnation), get(Slot::Cooldown));
    Decoded { marks, incarnation, cooldown, locked: get(Slot::Lock).is_some() }
}

/// The retry record: `"<incident_id>:<failures>:<not_before_ms>"`.
pub(crate) fn encode_retry(r: &Retry) -> String {
    format!("{}:{}:{}", r.incident, r.failures, r.not_before)
}

fn parse_retry(s: &str) -> Option<Retry> {
    let mut parts = s.splitn(3, ':');
    let incident = parts.next()?.to_string();
    let (failures, not_before) = (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
    Some(Retry { incident, failures, not_before })
}

/// The key of an incarnation: the container id and its start time.
pub(crate) fn incarnation(c: &Container) -> String {
    format!("{}:{}", c.id, c.started_at)
}

/// The restart claim (and, with [`DONE`] appended, the cooldown marker) of a restart of `c` for
/// incident `incident`: `"<ms>:<incident>:<incarnation>"`. The incarnation restarted is in it,
/// so the next incarnation is known to be ours.
pub(crate) fn claim(now: Millis, incident: &str, c: &Container) -> String {
    Stamp::new(now, format!("{incident}:{}", incarnation(c))).to_string()
}

/// Someone else's restart, as its cooldown marker says: `"<ms>:external"`.
pub(crate) const EXTERNAL: &str = ":external";

/// The time after which a heartbeat can only come from the restarted worker's new incarnation:
/// the first field of a finished cooldown marker — when our restart was verified (a new
/// incarnation running, the old one gone) or when someone else's was seen. `None` for a claim
/// whose restart is still in flight (no [`DONE`]): it never ends early.
pub(crate) fn booted_after(marker: &str) -> Option<Millis> {
    if !(marker.ends_with(DONE) || marker.ends_with(EXTERNAL)) {
        return None;
    }
    Stamp::parse(marker).map(|s| s.at)
}

/// The incident a restart claim was made for.
pub(crate) fn claimed_incident(marker: &str) -> Option<&str> {
    marker.split(':').nth(1).filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_marker_says_when_its_restart_was_verified_or_seen() {
        let c = Container {
            id: "c1".into(),
            started_at: "2026-12-02T07:00:00.123Z".into(),
            ..Container::default()
        };
        let ours = format!("{}{DONE}", claim(700, "inc-1", &c));
        assert_eq!(booted_after(&ours), Some(700));
        assert_eq!(booted_after(&format!("900{EXTERNAL}")), Some(900));
        // A claim whose restart is in flight (no `:done`), or junk, never ends a boot.
        assert_eq!(booted_after(&claim(700, "inc-1", &c)), None);
        assert_eq!(booted_after("x:external"), None);
        assert_eq!(booted_after(""), None);
    }

    #[test]
    fn every_mark_decodes_from_its_own_slot() {
        let k = Keys::new("p", "n");
        let keys = worker_keys(&k, "w");
        let value = |key: &str| -> Option<String> {
            Some(match key {
                _ if key == k.suspect("w") => "100:200".into(),
                _ if key == k.incident("w") => "300:inc-1".into(),
                _ if key == k.error_since("w") => "400".into(),
                _ if key == k.progress("w") => "500:step-9".into(),
                _ if key == k.cooldown("w") => "600:inc-1:c1:t0".into(),
                _ if key == k.restarted("w") => "700".into(),
                _ if key == k.escalated("w") => "1".into(),
                _ if key == k.incarnation("w") => "c1:t0".into(),
                _ if key == k.lock() => "token".into(),
                _ if key == k.retry("w") => "inc-1:2:800".into(),
                _ if key == k.rhythm("w") => "900|1000|8:3".into(),
                _ if key == k.gang_line("w") => "950".into(),
                _ if key == k.episode("w", Episode::VARIANTS[0].as_str()) => "1".into(),
                _ => return None,
            })
        };
        let values: Vec<_> = keys.iter().map(|key| value(key)).collect();
        let d = decode(&values);
        let m = &d.marks;
        assert_eq!(m.suspect, Some((100, 200)));
        assert_eq!(m.incident.as_ref().map(|i| i.id.as_str()), Some("inc-1"));
        assert_eq!(m.error_since, Some(400));
        assert_eq!(m.progress, Some(("step-9".into(), 500)));
        assert!(m.cooldown && m.escalated);
        assert_eq!(m.restarted_at, Some(700));
        assert_eq!(m.gang_line, Some(950));
        assert_eq!(m.episodes, vec![Episode::VARIANTS[0]]);
        let r = m.retry.as_ref().unwrap();
        assert_eq!((r.incident.as_str(), r.failures, r.not_before), ("inc-1", 2, 800));
        assert_eq!(encode_retry(r), "inc-1:2:800");
        let h = m.rhythm.as_ref().unwrap();
        assert_eq!((h.since, h.total(), h.encode()), (900, 3, "900|1000|8:3".into()));
        assert_eq!(d.incarnation.as_deref(), Some("c1:t0"));
        assert_eq!(d.cooldown.as_deref(), Some("600:inc-1:c1:t0"));
        assert!(d.locked);
        assert_eq!(decode(&[]), Decoded::default());
    }

    #[test]
    fn a_marker_says_whether_its_restart_is_in_flight() {
        let c = Container {
            id: "c1".into(),
            started_at: "2026-12-01T00:00:00Z".into(),
            ..Container::default()
        };
        let with = |m: Option<String>| Decoded { cooldown: m, ..Decoded::default() };
        assert_eq!(with(None).claim(), Claim::None);
        assert_eq!(with(Some(claim(7, "inc-1", &c))).claim(), Claim::InFlight);
        let done = format!("{}{DONE}", claim(7, "inc-1", &c));
        assert_eq!(with(Some(done)).claim(), Claim::Done);
        assert_eq!(with(Some(format!("7{EXTERNAL}"))).claim(), Claim::Done);
        // Observe mode's would-restart: nothing in flight, booting for the cooldown.
        assert_eq!(with(Some("7:inc-1".into())).claim(), Claim::Done);
    }

    #[test]
    fn a_claim_names_its_incident_and_incarnation() {
        let c = Container {
            id: "c1".into(),
            started_at: "2026-12-01T00:00:00Z".into(),
            ..Container::default()
        };
        let marker = claim(42, "inc-7", &c);
        assert_eq!(marker, "42:inc-7:c1:2026-12-01T00:00:00Z");
        assert_eq!(claimed_incident(&marker), Some("inc-7"));
        assert!(marker.ends_with(&format!(":{}", incarnation(&c))));
    }
}
