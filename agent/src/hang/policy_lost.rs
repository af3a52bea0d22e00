//! Time lost to an incident that ended in a restart (pure): from the worker's last beat (or the
//! start of its error) to the first beat of the incarnation the restart started, in four phases
//! that add up to the whole:
//!
//! - detection: the last beat → the verdict (the hang confirmed, the incident opened);
//! - decision: the verdict → the restart command (`restart_delay`, the lock, the caps);
//! - restart: the command → the new incarnation seen running (the stop grace, the start);
//! - recovery: the new incarnation → its first beat (imports, a checkpoint's restore).
//!
//! The first two are the cause's (`hang`, or `error` for a worker in state `error`), the last
//! two the restart's. They are counted as soon as each is known: the first three when the
//! restart is verified, the recovery at the first beat (`crate::hang::restart`).

use crate::clock::Millis;

/// When each step of an incident happened (coordinator clock), as kept from the restart's
/// verification to the first beat in `P:{N}:worker:W:lost`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IncidentTimes {
    /// The last beat (a hang) or the start of the error.
    pub(crate) since: Millis,
    /// The incident opened: the verdict.
    pub(crate) verdict: Millis,
    /// The restart command.
    pub(crate) command: Millis,
    /// The new incarnation seen running.
    pub(crate) incarnation: Millis,
    /// The incident's id: only its own first beat completes it.
    pub(crate) incident: String,
}

/// The four phases (ms), each at least zero, adding up to [`Phases::total`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Phases {
    pub(crate) detection: Millis,
    pub(crate) decision: Millis,
    pub(crate) restart: Millis,
    pub(crate) recovery: Millis,
}

impl IncidentTimes {
    /// `since:verdict:command:incarnation:incident` (an incident id has no `:`).
    pub(crate) fn encode(&self) -> String {
        let IncidentTimes { since, verdict, command, incarnation, incident } = self;
        format!("{since}:{verdict}:{command}:{incarnation}:{incident}")
    }

    pub(crate) fn decode(text: &str) -> Option<IncidentTimes> {
        let mut p = text.splitn(5, ':');
        let mut n = || p.next()?.parse::<Millis>().ok();
        let (since, verdict, command, incarnation) = (n()?, n()?, n()?, n()?);
        let incident = p.next().filter(|i| !i.is_empty() && !i.contains(':'))?;
        Some(IncidentTimes { since, verdict, command, incarnation, incident: incident.to_string() })
    }

    /// The phases up to the first beat at `first`. Each step is taken no earlier than the one
    /// before it (clocks of different readers can disagree by a few milliseconds), so the phases
    /// never go negative and always add up to `first - since`.
    pub(crate) fn phases(&self, first: Millis) -> Phases {
        let verdict = self.verdict.max(self.since);
        let command = self.command.max(verdict);
        let incarnation = self.incarnation.max(command);
        let first = first.max(incarnation);
        Phases {
            detection: verdict - self.since,
            decision: command - verdict,
            restart: incarnation - command,
            recovery: first - incarnation,
        }
    }
}

impl Phases {
    pub(crate) fn total(&self) -> Millis {
        self.detection + self.decision + self.restart + self.recovery
    }

    /// For the trail and `vigil explain`: `lost 4m12s = detection 2m10s + decision 3m + restart
    /// 12s + recovery 30s`.
    pub(crate) fn describe(&self) -> String {
        let [total, detection, decision, restart, recovery] =
            [self.total(), self.detection, self.decision, self.restart, self.recovery].map(exact);
        format!("lost {total} = detection {detection} (last beat → verdict) + decision {decision} (→ restart command) + restart {restart} (→ new incarnation) + recovery {recovery} (→ first beat)")
    }
}

/// A maintenance or a preemption, from its notice: the time it lost is the notice → the end of
/// the checkpoint round it started (acknowledged or cut short) → its end (the event over, or
/// the node going away).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interrupted {
    /// `maintenance` or `preemption`.
    pub(crate) cause: &'static str,
    pub(crate) notice: Millis,
    /// When its checkpoint round ended, if one ran.
    pub(crate) checkpoint: Option<Millis>,
}

impl Interrupted {
    /// The time lost when it ends at `end` (`how`: "it ended", "the node is going away"), and
    /// the trail's line.
    pub(crate) fn ended(&self, end: Millis, how: &str) -> (Millis, String) {
        let end = end.max(self.notice);
        let total = end - self.notice;
        let steps = match self.checkpoint.map(|c| c.clamp(self.notice, end)) {
            Some(c) => format!("checkpoint {} + → end {}", exact(c - self.notice), exact(end - c)),
            None => "end, no checkpoint round".to_string(),
        };
        (total, format!("{}: lost {} = notice → {steps} ({how})", self.cause, exact(total)))
    }
}

/// A duration to a tenth of a second, so the phases visibly add up: `850ms`, `12.5s`,
/// `5m 52.5s`, `3m`, `1h 2m 3s`.
pub(crate) fn exact(ms: Millis) -> String {
    let ms = ms.max(0);
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let tenths = (ms + 50) / 100;
    let (h, m, t) = (tenths / 36_000, tenths / 600 % 60, tenths % 600);
    let parts = [
        (h > 0).then(|| format!("{h}h")),
        (m > 0).then(|| format!("{m}m")),
        (t > 0).then(|| match (t / 10, t % 10) {
            (s, 0) => format!("{s}s"),
            (s, d) => format!("{s}.{d}s"),
        }),
    ];
    parts.into_iter().flatten().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phases_add_up_to_the_whole_and_never_go_negative() {
        let t = IncidentTimes {
            since: 1_000,
            verdict: 131_000,
            command: 311_000,
            incarnation: 323_500,
            incident: "i-1".into(),
        };
        let p = t.phases(353_500);
        assert_eq!(
            (p.detection, p.decision, p.restart, p.recovery),
            (130_000, 180_000, 12_500, 30_000)
        );
        assert_eq!(p.total(), 352_500);
        // A reader's clock a little behind another's: no phase below zero, the sum still holds.
        let skewed = IncidentTimes { incarnation: 310_990, ..t.clone() };
        let p = skewed.phases(311_500);
        assert_eq!((p.restart, p.recovery), (0, 500));
        assert_eq!(p.total(), 311_500 - 1_000);
        assert_eq!(t.phases(0).total(), 322_500, "a first beat before: none");
    }

    #[test]
    fn times_round_trip_and_garbage_is_none() {
        let t = IncidentTimes {
            since: 1,
            verdict: 2,
            command: 3,
            incarnation: 4,
            incident: "1800000000000-ab12".into(),
        };
        assert_eq!(IncidentTimes::decode(&t.encode()), Some(t));
        for bad in ["", "1:2:3:4", "1:2:3:4:", "1:2:3:4:a:b", "a:2:3:4:i", "1::3:4:i"] {
            assert_eq!(IncidentTimes::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_interruption_loses_the_notice_to_its_end() {
        let i = Interrupted { cause: "preemption", notice: 10_000, checkpoint: Some(22_500) };
        assert_eq!(
            i.ended(110_000, "the node is going away"),
            (
                100_000,
                "preemption: lost 1m 40s = notice → checkpoint 12.5s + → end 1m 27.5s (the node is going away)".to_string()
            )
        );
        let none = Interrupted { checkpoint: None, ..i };
        assert_eq!(none.ended(5_000, "it ended").0, 0, "never negative");
        assert!(none.ended(20_000, "it ended").1.contains("no checkpoint round"));
    }

    #[test]
    fn durations_read_to_a_tenth() {
        for (ms, want) in [
            (850, "850ms"),
            (12_500, "12.5s"),
            (180_000, "3m"),
            (352_500, "5m 52.5s"),
            (3_723_000, "1h 2m 3s"),
        ] {
            assert_eq!(exact(ms), want);
        }
    }

    #[test]
    fn the_description_names_every_phase() {
        let p = Phases { detection: 130_000, decision: 180_000, restart: 12_500, recovery: 30_000 };
        assert_eq!(
            p.describe(),
            "lost 5m 52.5s = detection 2m 10s (last beat → verdict) + decision 3m (→ restart command) + restart 12.5s (→ new incarnation) + recovery 30s (→ first beat)"
        );
    }
}
