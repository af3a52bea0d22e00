//! Alert de-duplication: a shared key per incident and kind decides who sends an alert (the
//! first observer, with SET NX). Separate from the node lock on purpose (design rule 2): the
//! gate stops duplicate notifications, the lock duplicate commands.
//!
//! A claim is made for a lease first (the node lock's TTL, which covers an alert's delivery) and
//! given its full TTL only once the alert went out ([`AlertGate::settle`], at the end of the
//! cycle): an instance that dies between the claim and the send leaves a claim that expires, and
//! another instance alerts. Without the lease a breaker's alert claimed just before a SIGTERM was
//! never sent that day (simulation seed 5068879).

use indexmap::IndexMap;
use std::time::Duration;

use crate::alerts::Alert;
use crate::clock::{Millis, Stamp};
use crate::coord::{CoordError, Coordinator};

/// The most claims (and owed alerts) a gate remembers: a coordinator down for long leaves the
/// rest to the next observer.
const REMEMBERED: usize = 1_000;

/// An alert owed: sent once its claim is won, while `stands` (key, value) still holds.
#[derive(Debug, Clone)]
pub(crate) struct Owed {
    pub(crate) alert: Alert,
    /// Its claim's TTL.
    pub(crate) ttl: Duration,
    /// When it was owed.
    pub(crate) since: Millis,
    /// What it announces, as a key and the value it holds while it stands (a gang's decision).
    pub(crate) stands: (String, String),
}

/// The claims of one agent instance, with the ones whose answer was lost. NB: kept in the order
/// they were taken (a HashMap's order differs per process: a seeded simulation run did not
/// repeat, its claims retried in another order).
#[derive(Default)]
pub(crate) struct AlertGate {
    /// Written into each claim: who took it.
    instance: String,
    /// Claims whose SET NX got no answer: key → the value we tried, and when the key it may
    /// have set expires (after that, nothing is there to read back: forgotten when room is
    /// needed).
    unanswered: IndexMap<String, (String, Millis)>,
    /// Claims won on a lease, whose alert has gone out since: key → (value, full TTL).
    won: IndexMap<String, (String, Duration)>,
    /// Alerts whose claim got no answer, of a step that never runs again (a gang's decision is
    /// announced once), by claim key. Tried again once a cycle ([`AlertGate::owed`]) until the
    /// claim answers, while what it announces stands, for at most the claim's TTL. Other pages
    /// are not owed: their step runs again next cycle and pages then.
    owed: IndexMap<String, Owed>,
}

impl AlertGate {
    pub fn new(instance: &str) -> AlertGate {
        AlertGate { instance: instance.to_string(), ..Default::default() }
    }

    /// Take the right to send the alert behind the de-duplication `key` (SET NX: the first
    /// observer alerts), held for `lease` until [`AlertGate::settle`] gives it `ttl`. NB: a SET
    /// whose reply was lost may have been applied, and then nobody would ever send the alert;
    /// the value tried is remembered, and the next attempt that finds exactly that value there
    /// knows it won. At least once, never "never": a crash in between leaves a claim that
    /// expires with its lease.
    pub(crate) async fn claim(
        &mut self,
        coord: &dyn Coordinator,
        key: &str,
        now: Millis,
        ttl: Duration,
        lease: Duration,
    ) -> Result<bool, CoordError> {
        let held = lease.min(ttl);
        let until = now + crate::clock::ms(held);
        let tried = self.unanswered.shift_remove(key);
        let retry = tried.is_some();
        // NB: a retry writes the value it tried before, and a shorter TTL does not shorten what
        // that write may hold.
        let (value, until) = match tried {
            Some((value, before)) => (value, until.max(before)),
            None => (Stamp::new(now, &self.instance).to_string(), until),
        };
        // A retry not taken may have won with its lost write: read back what is there.
        let answer = match coord.set_nx(key, &value, held).await {
            Ok(false) if retry => coord.get(key).await.map(|v| v.as_ref() == Some(&value)),
            answer => answer,
        };
        let won = match answer {
            Ok(won) => won,
            Err(e) => {
                self.unanswered_claim(key, value, until, now);
                return Err(e);
            }
        };
        if won && lease < ttl && self.won.len() < REMEMBERED {
            self.won.insert(key.to_string(), (value, ttl));
        }
        Ok(won)
    }

    /// Remember a claim whose answer was lost, until the key it may have set expires. NB: when
    /// full, the claims whose key expired are forgotten first — a gate that only ever filled up
    /// (a claim of an incident that closed is never tried again) would end up remembering none,
    /// and a lost answer whose write landed would then hold its page back until that write
    /// expires.
    fn unanswered_claim(&mut self, key: &str, value: String, until: Millis, now: Millis) {
        if self.unanswered.len() >= REMEMBERED {
            self.unanswered.retain(|_, (_, at)| *at > now);
        }
        if self.unanswered.len() < REMEMBERED {
            self.unanswered.insert(key.to_string(), (value, until));
        }
    }

    /// The alert of claim `key` got no answer: it is owed, and tried again by
    /// [`AlertGate::owed`].
    pub(crate) fn owe(&mut self, key: &str, owed: Owed) {
        if self.owed.len() < REMEMBERED {
            self.owed.insert(key.to_string(), owed);
        }
    }

    /// The owed alerts whose claim is won now, to send (their claims settle with the cycle's).
    /// One whose claim is another's now, or whose announcement no longer stands, is owed no
    /// more; one whose read or claim still gets no answer stays owed.
    pub(crate) async fn owed(
        &mut self,
        coord: &dyn Coordinator,
        now: Millis,
        lease: Duration,
    ) -> Vec<Alert> {
        let mut due = Vec::new();
        // NB: older than its claim's TTL, it would announce what is long over.
        let old: Vec<String> = (self.owed.iter())
            .filter(|(_, o)| now - o.since >= crate::clock::ms(o.ttl))
            .map(|(k, _)| k.clone())
            .collect();
        for key in old {
            self.forget(&key);
        }
        let keys: Vec<String> = self.owed.keys().cloned().collect();
        for key in keys {
            let Some(o) = self.owed.get(&key) else { continue };
            let ((at, holds), ttl) = (o.stands.clone(), o.ttl);
            // NB: what it announces is over (closed by any agent): owed no more. One whose
            // read or claim fails stays owed; the others are tried all the same.
            match coord.get(&at).await {
                Ok(v) if v.as_deref() == Some(holds.as_str()) => {}
                Ok(_) => {
                    self.forget(&key);
                    continue;
                }
                Err(_) => continue,
            }
            let Ok(won) = self.claim(coord, &key, now, ttl, lease).await else { continue };
            let owed = self.owed.shift_remove(&key);
            if won {
                due.extend(owed.map(|o| o.alert));
            }
        }
        due
    }

    /// An owed alert given up: its claim, never tried again, is not remembered either.
    fn forget(&mut self, key: &str) {
        self.owed.shift_remove(key);
        self.unanswered.shift_remove(key);
    }

    /// The alerts of the claims won this cycle have gone out: the claims still ours get their
    /// full TTL. A claim released since (a failed restart frees its `restart` claim for the
    /// retry) stays released. One that cannot be written now is tried again next cycle (should
    /// its lease run out first, another instance may alert again: at least once).
    pub(crate) async fn settle(&mut self, coord: &dyn Coordinator) {
        if self.won.is_empty() {
            return;
        }
        let keys: Vec<String> = self.won.keys().cloned().collect();
        let Ok(values) = coord.get_many(&keys).await else { return };
        for (key, value) in keys.into_iter().zip(values) {
            let Some((ours, ttl)) = self.won.shift_remove(&key) else { continue };
            if value.as_deref() != Some(ours.as_str()) {
                continue;
            }
            if coord.set(&key, &ours, ttl).await.is_err() {
                self.won.insert(key, (ours, ttl));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::FakeClock;
    use crate::coord::memory::MemoryCoordinator;

    const DAY: Duration = Duration::from_secs(86_400);
    const LEASE: Duration = Duration::from_secs(180);

    fn store() -> (FakeClock, Box<dyn Coordinator>) {
        let clock = FakeClock::at(1_000_000);
        let coord = Box::new(MemoryCoordinator::new(Arc::new(clock.clone())));
        (clock, coord)
    }

    #[tokio::test]
    async fn a_claim_whose_alert_never_went_out_expires_with_its_lease() {
        let (clock, coord) = store();
        let mut a = AlertGate::new("a");
        let mut b = AlertGate::new("b");
        assert!(a.claim(&*coord, "k", 0, DAY, LEASE).await.unwrap());
        // `a` stops before its alert went out (no settle): `b` waits out the lease, then alerts.
        drop(a);
        assert!(!b.claim(&*coord, "k", 0, DAY, LEASE).await.unwrap());
        clock.advance(LEASE + Duration::from_secs(1));
        assert!(b.claim(&*coord, "k", 0, DAY, LEASE).await.unwrap());
    }

    #[tokio::test]
    async fn a_settled_claim_holds_for_its_full_ttl() {
        let (clock, coord) = store();
        let mut a = AlertGate::new("a");
        let mut b = AlertGate::new("b");
        assert!(a.claim(&*coord, "k", 0, DAY, LEASE).await.unwrap());
        a.settle(&*coord).await;
        clock.advance(LEASE * 10);
        assert!(!b.claim(&*coord, "k", 0, DAY, LEASE).await.unwrap());
        clock.advance(DAY);
        assert!(b.claim(&*coord, "k", 0, DAY, LEASE).await.unwrap());
    }

    #[tokio::test]
    async fn a_claim_released_before_settling_stays_released() {
        let (_clock, coord) = store();
        let mut a = AlertGate::new("a");
        assert!(a.claim(&*coord, "k", 0, DAY, LEASE).await.unwrap());
        coord.del(&["k".to_string()]).await.unwrap();
        a.settle(&*coord).await;
        assert!(AlertGate::new("b").claim(&*coord, "k", 0, DAY, LEASE).await.unwrap());
    }

    /// An alert whose claim got no answer is owed: the next cycle's try wins the claim and sends
    /// it, once; not one whose claim another instance took meanwhile, whose announcement no
    /// longer stands, or older than its claim's TTL.
    #[tokio::test]
    async fn an_alert_whose_claim_got_no_answer_is_owed_and_sent_once() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // The next SET NX gets no answer (and does not land) while `armed`.
        let armed = Arc::new(AtomicBool::new(true));
        let blip = armed.clone();
        let coord = crate::coord::memory::Failing {
            inner: MemoryCoordinator::new(Arc::new(FakeClock::at(1_000_000))),
            fails: Box::new(move |r| {
                matches!(r, crate::coord::Request::SetNx { .. })
                    && blip.swap(false, Ordering::SeqCst)
            }),
        };
        (&coord as &dyn Coordinator).set("decision", "d1", DAY).await.unwrap();
        let owed = |since| Owed {
            alert: Alert::new(crate::alerts::AlertKind::Restarting, "gpu-1", "restarting"),
            ttl: DAY,
            since,
            stands: ("decision".to_string(), "d1".to_string()),
        };
        let mut a = AlertGate::new("a");
        assert!(a.claim(&coord, "k", 0, DAY, LEASE).await.is_err());
        a.owe("k", owed(0));
        assert_eq!(a.owed(&coord, 0, LEASE).await.len(), 1, "won now: sent");
        assert!(a.owed(&coord, 0, LEASE).await.is_empty(), "once");
        // Another instance's claim stands: owed no more, not sent here.
        armed.store(true, Ordering::SeqCst);
        assert!(a.claim(&coord, "k2", 0, DAY, LEASE).await.is_err());
        a.owe("k2", owed(0));
        let mut b = AlertGate::new("b");
        assert!(b.claim(&coord, "k2", 0, DAY, LEASE).await.unwrap());
        assert!(a.owed(&coord, 0, LEASE).await.is_empty());
        assert!(a.owed.is_empty());
        // Older than its claim's TTL (its decision still standing), or what it announces is
        // over: not sent.
        a.owe("k4", owed(-crate::clock::ms(DAY)));
        assert!(a.owed(&coord, 0, LEASE).await.is_empty());
        assert!(a.owed.is_empty(), "aged out");
        armed.store(true, Ordering::SeqCst);
        assert!(a.claim(&coord, "k3", 0, DAY, LEASE).await.is_err());
        a.owe("k3", owed(0));
        (&coord as &dyn Coordinator).set("decision", "d2", DAY).await.unwrap();
        assert!(a.owed(&coord, 0, LEASE).await.is_empty());
        assert!(a.owed.is_empty());
        assert!(a.unanswered.is_empty(), "given up: not remembered either");
    }

    /// A gate full of claims whose answer was lost, all of keys long expired (incidents that
    /// closed: never tried again), still remembers the next one, and reads it back as won.
    #[tokio::test]
    async fn a_gate_full_of_expired_unanswered_claims_still_remembers_the_next() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // Every SET NX fails unanswered while `down`; `landed`: the next lands, its answer lost.
        let down = Arc::new(AtomicBool::new(true));
        let landed = Arc::new(AtomicBool::new(false));
        let clock = FakeClock::at(1_000_000);
        let (d, l) = (down.clone(), landed.clone());
        let coord = crate::coord::memory::Failing {
            inner: MemoryCoordinator::new(Arc::new(clock.clone())),
            fails: Box::new(move |r| {
                let set_nx = matches!(r, crate::coord::Request::SetNx { .. });
                set_nx && (d.load(Ordering::SeqCst) || l.swap(false, Ordering::SeqCst))
            }),
        };
        let mut a = AlertGate::new("a");
        for i in 0..REMEMBERED - 1 {
            let key = format!("closed-{i}");
            assert!(a.claim(&coord, &key, 0, DAY, LEASE).await.is_err());
        }
        let later = crate::clock::ms(LEASE) + 1;
        clock.advance(LEASE + Duration::from_millis(1));
        // One not expired yet: kept.
        assert!(a.claim(&coord, "open", later, DAY, LEASE).await.is_err());
        assert_eq!(a.unanswered.len(), REMEMBERED);
        down.store(false, Ordering::SeqCst);
        // The write lands and its answer is lost: the claim is ours, if remembered.
        let value = Stamp::new(later, "a").to_string();
        let inner: &dyn Coordinator = &coord.inner;
        inner.set("k", &value, LEASE).await.unwrap();
        landed.store(true, Ordering::SeqCst);
        assert!(a.claim(&coord, "k", later, DAY, LEASE).await.is_err());
        assert!(a.claim(&coord, "k", later, DAY, LEASE).await.unwrap(), "read back: ours");
        assert_eq!(a.unanswered.len(), 1, "the expired ones forgotten");
        assert!(a.unanswered.contains_key("open"), "the one still held kept");
    }

    #[tokio::test]
    async fn a_claim_shorter_than_the_lease_needs_no_settling() {
        let (clock, coord) = store();
        let mut a = AlertGate::new("a");
        let short = Duration::from_secs(60);
        assert!(a.claim(&*coord, "k", 0, short, LEASE).await.unwrap());
        assert!(a.won.is_empty());
        clock.advance(short + Duration::from_secs(1));
        assert!(AlertGate::new("b").claim(&*coord, "k", 0, short, LEASE).await.unwrap());
    }
}
