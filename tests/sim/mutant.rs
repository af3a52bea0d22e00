//! Known-bad variants of the restart path, for the harness's own test: the harness must be able
//! to fail, so `tests/simulation.rs` plants each of these and shows it caught by the invariant it
//! breaks.
//!
//! The agent knows nothing of them: a mutant is a lie the gate (`gate.rs`) tells one agent
//! instance — an answer of the coordinator or of the runtime that makes the real restart path
//! act as the buggy one would. The ground truth (`truth.rs`) is kept from what really happened,
//! never from the lie.

use std::collections::HashMap;
use std::sync::Mutex;

use vigil::clock::Millis;
use vigil::runtime::Container;

/// One planted bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    /// No revalidation of the record and marks right before the command: once the instance
    /// holds the node lock, its reads of them return what it read before (its decision-time
    /// view).
    NoRevalidation,
    /// No compare-and-restart: once the instance holds the node lock, an inspect returns the
    /// container as the instance saw it before, until its restart command.
    NoCompare,
    /// No node lock: a SET NX of the lock held by another is answered "taken", and the TTL
    /// check of it a full TTL.
    NoLock,
    /// The breaker's refusal is ignored: a refused capped increment of the breaker is answered
    /// "taken" (the count stays as the refusal left it), and its count reads empty.
    BreakerIgnored,
    /// A failed restart is retried without waiting out its backoff: the worker's retry record
    /// reads as absent.
    NoRetryBackoff,
    /// A restarted worker's booting ends without its first beat: a finished cooldown marker
    /// reads as written at time 0, so any heartbeat at all is "after the restart" (and the
    /// compare-and-delete of that marker is given the real one).
    BootEndsAtOnce,
    /// Restarts that did not help are forgotten: a worker's fruitless-restart run reads as
    /// absent.
    FruitlessForgotten,
    /// A learned restart before its persistence (issue 46): a worker's incident timer reads as
    /// started a minute earlier, so its restart is due as soon as it is confirmed (and the
    /// compare-and-delete of that timer is given the real one).
    LearnedTooSoon,
    /// A restart from a rhythm learned in one process only (issue 46): a worker's rhythm the
    /// coordinator does not hold reads as the one this instance last wrote.
    RhythmFromMemory,
}

impl Mutant {
    pub const ALL: [Mutant; 9] = [
        Mutant::NoRevalidation,
        Mutant::NoCompare,
        Mutant::NoLock,
        Mutant::BreakerIgnored,
        Mutant::NoRetryBackoff,
        Mutant::BootEndsAtOnce,
        Mutant::FruitlessForgotten,
        Mutant::LearnedTooSoon,
        Mutant::RhythmFromMemory,
    ];

    /// Whether it is planted in a world that restarts on learned rhythms (`learned.rs`).
    pub fn learned(self) -> bool {
        matches!(self, Mutant::LearnedTooSoon | Mutant::RhythmFromMemory)
    }

    /// The mutant of that name (`VIGIL_SIM_MUTANT`).
    pub fn named(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| format!("{m:?}") == name.trim())
    }
}

/// The lies told to one agent instance (nothing when no mutant is planted), and what they need
/// to remember of its earlier answers. Each method takes the real answer and returns the one
/// the instance gets, with what the lie was, for the trace.
pub struct Lies {
    mutant: Option<Mutant>,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// Between the instance's taking the node lock and its releasing it (or its restart
    /// command): the answers come from what it saw before.
    stale: bool,
    /// The last answers before the lock: string keys, hashes, containers.
    strings: HashMap<String, Option<String>>,
    /// Cooldown markers as told (time 0) → as written.
    markers: HashMap<String, String>,
    hashes: HashMap<String, HashMap<String, String>>,
    containers: HashMap<String, Container>,
    /// The rhythms this instance wrote, by key.
    rhythms: HashMap<String, String>,
}

/// An answer, and the lie told when it is not the real one.
pub type Told<T> = (T, Option<String>);

impl Lies {
    pub fn new(mutant: Option<Mutant>) -> Lies {
        Lies { mutant, seen: Mutex::new(Seen::default()) }
    }

    fn is(&self, m: Mutant) -> bool {
        self.mutant == Some(m)
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A SET NX; `lock`: of this node's lock.
    pub fn set_nx<E>(&self, lock: bool, real: Result<bool, E>) -> Told<Result<bool, E>> {
        if !lock {
            return (real, None);
        }
        let (answer, lie) = match real {
            Ok(false) if self.is(Mutant::NoLock) => {
                (Ok(true), Some("the lock is another's; answered taken".into()))
            }
            r => (r, None),
        };
        self.seen().stale = matches!(answer, Ok(true));
        (answer, lie)
    }

    /// The TTL left of a key if the caller owns it; `lock`: this node's lock, `full` its TTL.
    pub fn owner_ttl<E>(
        &self,
        lock: bool,
        full: Millis,
        real: Result<Option<Millis>, E>,
    ) -> Told<Result<Option<Millis>, E>> {
        if !(lock && self.is(Mutant::NoLock)) {
            return (real, None);
        }
        let lie = match &real {
            Ok(Some(_)) => None,
            Ok(None) => Some("the lock is not ours; answered a full TTL".into()),
            Err(_) => Some("the TTL check failed; answered a full TTL".into()),
        };
        (Ok(Some(full)), lie)
    }

    /// A compare-and-renew; `lock`: of this node's lock (right before the command).
    pub fn renew_if_owner<E>(&self, lock: bool, real: Result<bool, E>) -> Told<Result<bool, E>> {
        if !(lock && self.is(Mutant::NoLock)) {
            return (real, None);
        }
        let lie = match &real {
            Ok(true) => None,
            Ok(false) => Some("the lock is not ours; answered renewed".into()),
            Err(_) => Some("the renewal failed; answered renewed".into()),
        };
        (Ok(true), lie)
    }

    /// A compare-and-delete; `lock`: of this node's lock (the pass is over). The token the
    /// store is given: a marker told at time 0 is compared as it was written.
    pub fn del_if_owner(&self, lock: bool, token: &str) -> String {
        if lock {
            self.seen().stale = false;
        }
        self.seen().markers.get(token).cloned().unwrap_or_else(|| token.to_string())
    }

    /// A capped increment; `breaker`: of this node's breaker.
    pub fn incr_capped<E>(
        &self,
        breaker: bool,
        cap: u64,
        real: Result<Option<u64>, E>,
    ) -> Told<Result<Option<u64>, E>> {
        match real {
            Ok(None) if breaker && self.is(Mutant::BreakerIgnored) => {
                (Ok(Some(cap + 1)), Some("the breaker refused; answered taken".into()))
            }
            r => (r, None),
        }
    }

    /// A counter read (an op of a batch); `breaker`: of this node's breaker, whose cap is
    /// `cap`.
    pub fn counter<E>(
        &self,
        breaker: bool,
        cap: u64,
        real: Result<u64, E>,
    ) -> Told<Result<u64, E>> {
        match real {
            Ok(n) if breaker && self.is(Mutant::BreakerIgnored) => {
                let lie = (n >= cap).then(|| format!("the breaker is at {n}; answered 0"));
                (Ok(0), lie)
            }
            r => (r, None),
        }
    }

    /// A hash read.
    pub fn hgetall<E>(
        &self,
        key: &str,
        real: Result<HashMap<String, String>, E>,
    ) -> Told<Result<HashMap<String, String>, E>> {
        if !self.is(Mutant::NoRevalidation) {
            return (real, None);
        }
        let mut seen = self.seen();
        if !seen.stale {
            if let Ok(h) = &real {
                seen.hashes.insert(key.to_string(), h.clone());
            }
            return (real, None);
        }
        match seen.hashes.get(key) {
            Some(before) => {
                let lie = (!matches!(&real, Ok(h) if h == before))
                    .then(|| format!("answered {key} as read before the lock"));
                (Ok(before.clone()), lie)
            }
            None => (real, None),
        }
    }

    /// A read of several string keys; `retry`: which of them are a worker's retry record.
    pub fn get_many<E>(
        &self,
        keys: &[String],
        retry: impl Fn(&str) -> bool,
        cooldown: impl Fn(&str) -> bool,
        real: Result<Vec<Option<String>>, E>,
    ) -> Told<Result<Vec<Option<String>>, E>> {
        match self.mutant {
            Some(Mutant::BootEndsAtOnce) => match real {
                Ok(mut values) => {
                    let mut lie = None;
                    for (k, v) in keys.iter().zip(values.iter_mut()) {
                        let Some(marker) = v.as_ref().filter(|_| cooldown(k)) else {
                            continue;
                        };
                        let finished = marker.ends_with(":done") || marker.ends_with(":external");
                        let Some((_, rest)) = marker.split_once(':').filter(|_| finished) else {
                            continue;
                        };
                        let told = format!("0:{rest}");
                        self.seen().markers.insert(told.clone(), marker.clone());
                        lie = Some(format!("answered {k} as written at time 0"));
                        *v = Some(told);
                    }
                    (Ok(values), lie)
                }
                r => (r, None),
            },
            Some(Mutant::FruitlessForgotten) => match real {
                Ok(mut values) => {
                    let mut lie = None;
                    for (k, v) in keys.iter().zip(values.iter_mut()) {
                        if k.ends_with(":fruitless") && v.is_some() {
                            *v = None;
                            lie = Some(format!("answered {k} absent"));
                        }
                    }
                    (Ok(values), lie)
                }
                r => (r, None),
            },
            Some(Mutant::NoRetryBackoff) => match real {
                Ok(mut values) => {
                    let mut lie = None;
                    for (k, v) in keys.iter().zip(values.iter_mut()) {
                        if retry(k) && v.is_some() {
                            *v = None;
                            lie = Some(format!("answered {k} absent"));
                        }
                    }
                    (Ok(values), lie)
                }
                r => (r, None),
            },
            Some(Mutant::LearnedTooSoon) => match real {
                Ok(mut values) => {
                    let mut lie = None;
                    for (k, v) in keys.iter().zip(values.iter_mut()) {
                        let Some(real) = v.as_ref().filter(|_| k.ends_with(":incident")) else {
                            continue;
                        };
                        let Some((at, rest)) = real.split_once(':') else {
                            continue;
                        };
                        let Ok(at) = at.parse::<Millis>() else {
                            continue;
                        };
                        let told = format!("{}:{rest}", at - 60_000);
                        self.seen().markers.insert(told.clone(), real.clone());
                        lie = Some(format!("answered {k} as started a minute earlier"));
                        *v = Some(told);
                    }
                    (Ok(values), lie)
                }
                r => (r, None),
            },
            Some(Mutant::RhythmFromMemory) => match real {
                Ok(mut values) => {
                    let mut lie = None;
                    let seen = self.seen();
                    for (k, v) in keys.iter().zip(values.iter_mut()) {
                        if let (None, Some(mine)) = (v.as_ref(), seen.rhythms.get(k)) {
                            lie = Some(format!("answered {k} as this instance last wrote it"));
                            *v = Some(mine.clone());
                        }
                    }
                    (Ok(values), lie)
                }
                r => (r, None),
            },
            Some(Mutant::NoRevalidation) => {
                let mut seen = self.seen();
                if !seen.stale {
                    if let Ok(values) = &real {
                        for (k, v) in keys.iter().zip(values) {
                            seen.strings.insert(k.clone(), v.clone());
                        }
                    }
                    return (real, None);
                }
                let before: Option<Vec<Option<String>>> =
                    keys.iter().map(|k| seen.strings.get(k).cloned()).collect();
                match before {
                    Some(values) => {
                        let lie = (!matches!(&real, Ok(v) if *v == values))
                            .then(|| "answered the marks as read before the lock".to_string());
                        (Ok(values), lie)
                    }
                    None => (real, None),
                }
            }
            _ => (real, None),
        }
    }

    /// A write of this instance's batch.
    pub fn wrote(&self, key: &str, value: &str) {
        if self.is(Mutant::RhythmFromMemory) && key.ends_with(":rhythm") {
            self.seen().rhythms.insert(key.to_string(), value.to_string());
        }
    }

    /// The runtime's list of workers.
    pub fn listed(&self, real: &[Container]) {
        if !self.is(Mutant::NoCompare) {
            return;
        }
        let mut seen = self.seen();
        if !seen.stale {
            for c in real {
                seen.containers.insert(c.id.clone(), c.clone());
            }
        }
    }

    /// An inspect of container `id`.
    pub fn inspect<E>(
        &self,
        id: &str,
        real: Result<Option<Container>, E>,
    ) -> Told<Result<Option<Container>, E>> {
        if !self.is(Mutant::NoCompare) {
            return (real, None);
        }
        let mut seen = self.seen();
        if !seen.stale {
            if let Ok(Some(c)) = &real {
                seen.containers.insert(id.to_string(), c.clone());
            }
            return (real, None);
        }
        match seen.containers.get(id) {
            Some(before) => {
                let lie = (!matches!(&real, Ok(Some(c)) if c == before)).then(|| {
                    format!("answered {id} as seen before the lock ({})", before.started_at)
                });
                (Ok(Some(before.clone())), lie)
            }
            None => (real, None),
        }
    }

    /// A restart command: the pass is at its end.
    pub fn commanded(&self) {
        self.seen().stale = false;
    }
}
