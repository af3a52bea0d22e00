//! The decision trail as the engine writes it: who an entry is about ([`About`]) and the memory
//! that keeps a skip repeated every cycle out of the trail ([`Journal::note`] with `once`).

use std::collections::HashSet;

use crate::clock::Millis;
use crate::coord::CoordError;
use crate::hang::policy::Verdict;
use crate::trail::{Code, Trail};

/// Who a trail entry is about: the worker, its verdict, the incident, and whether the entry is
/// written once per incident.
#[derive(Debug, Clone, Copy)]
pub(crate) struct About<'a> {
    pub(crate) worker: &'a str,
    pub(crate) verdict: Verdict,
    pub(crate) incident: Option<&'a str>,
    pub(crate) once: bool,
}

impl<'a> About<'a> {
    pub(crate) fn worker(worker: &'a str, verdict: Verdict) -> Self {
        About { worker, verdict, incident: None, once: false }
    }
    pub(crate) fn incident(self, id: &'a str) -> Self {
        About { incident: Some(id), ..self }
    }
    pub(crate) fn once(self) -> Self {
        About { once: true, ..self }
    }
}

/// The trail and the entries already written once for an incident.
pub(crate) struct Journal {
    pub(crate) trail: Trail,
    noted: HashSet<String>,
}

impl Journal {
    pub fn new(trail: Trail) -> Journal {
        Journal { trail, noted: HashSet::new() }
    }

    /// Append a decision to the trail, log it and count it. With `about.once`, the same
    /// decision for the same incident is written only the first time (skips repeat every cycle
    /// otherwise).
    pub(crate) async fn note(
        &mut self,
        at: Millis,
        about: About<'_>,
        code: Code,
        detail: String,
    ) -> Result<(), CoordError> {
        let key = format!("{}|{}|{}", about.worker, code.as_str(), about.incident.unwrap_or("-"));
        if about.once && self.noted.contains(&key) {
            return Ok(());
        }
        let verdict = about.verdict.as_str();
        self.trail.record(at, about.worker, verdict, code, detail, about.incident).await?;
        if about.once {
            // Remembered only once stored: an entry lost to an outage is written again.
            if self.noted.len() > 10_000 {
                self.noted.clear();
            }
            self.noted.insert(key);
        }
        Ok(())
    }
}
