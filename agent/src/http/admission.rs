//! Which connections a listener holds, and which one gives way to a newcomer, so that junk that
//! connects and says nothing can never keep the kubelet's probes, Prometheus or a worker's beat
//! out (issue 41).
//!
//! NB: a plain cap (a semaphore taken before `accept`) let 200 half-open connections hold the
//! metrics port: 32 slots were held for the header timeout each, the rest queued in the kernel's
//! backlog, and `/healthz` timed out in `connect` — the agent killed by its own liveness probe.
//! Now every connection is accepted at once and counted by its peer (a TCP address; on the unix
//! socket, the peer's cgroup: its container). A peer at its own bound, or a listener at its
//! bound, makes room by closing the connection that has been *idle* the longest — one that has
//! not sent a whole request head (or sits between keep-alive requests) — never one whose
//! request is being served; only when every held connection is in a request is the newcomer
//! closed. An idle connection costs a few kilobytes, and its head must arrive within the
//! listener's header timeout anyway.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What one connection is doing now.
#[derive(Debug)]
struct Held {
    peer: String,
    /// Requests of it being served now (hyper serves one at a time on HTTP/1).
    busy: u32,
    /// Whether it ever sent a whole request head: a keep-alive connection of a real client.
    served: bool,
    /// When it last began or ended a request (or connected): the longest idle gives way first.
    last_active: Instant,
    /// Cancelled when it gives way: its task drops the connection.
    evict: CancellationToken,
}

/// The table of held connections (pure decisions on it; the clock is passed in).
#[derive(Debug, Default)]
pub(crate) struct Admission {
    held: HashMap<u64, Held>,
    next: u64,
    max: usize,
    per_peer: usize,
}

/// The answer to a newcomer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Serve it as connection `id`; `evicted` gave way to it.
    Yes { id: u64, evicted: Option<u64> },
    /// Every connection it could replace is in a request, and it would be past twice the
    /// bound: close it.
    No,
}

impl Admission {
    pub(crate) fn new(max: usize, per_peer: usize) -> Admission {
        Admission { max: max.max(1), per_peer: per_peer.max(1), ..Admission::default() }
    }

    /// A newcomer from `peer` at `now`; `evict` is what its task waits on to give way.
    ///
    /// NB: a peer at its own bound makes room among its own connections only; a full listener
    /// takes its victim from the peer holding the most (a probe's lone connection is never the
    /// one, whoever floods). When every connection it could replace is in a request, the
    /// newcomer is still served up to twice the bound (requests end within the body timeout: a
    /// burst of real scrapes must not be cut off), while the listener has room; past that it is
    /// closed.
    pub(crate) fn admit(&mut self, peer: &str, now: Instant, evict: CancellationToken) -> Admit {
        let of_peer = self.held.values().filter(|h| h.peer == peer).count();
        let held = self.held.len();
        // The connection that gives way, and whether the newcomer may be served without one.
        let (evicted, room) = if of_peer >= self.per_peer {
            (self.longest_idle(Some(peer)), of_peer < self.per_peer * 2 && held < self.max)
        } else if held >= self.max {
            (self.biggest_holder_idle(), held < self.max * 2)
        } else {
            (None, true)
        };
        if evicted.is_none() && !room {
            return Admit::No;
        }
        if let Some(h) = evicted.and_then(|id| self.held.remove(&id)) {
            h.evict.cancel();
        }
        let id = self.next;
        self.next += 1;
        let conn = Held { peer: peer.to_string(), busy: 0, served: false, last_active: now, evict };
        self.held.insert(id, conn);
        Admit::Yes { id, evicted }
    }

    /// The connection idle the longest (of `peer`, when given), one that never sent a whole
    /// head before any keep-alive connection of a real client (which may be about to reuse it:
    /// closing that one races its next request); ties by age of the id.
    fn longest_idle(&self, peer: Option<&str>) -> Option<u64> {
        self.held
            .iter()
            .filter(|(_, h)| h.busy == 0 && peer.is_none_or(|p| h.peer == p))
            .min_by_key(|(id, h)| (h.served, h.last_active, **id))
            .map(|(id, _)| *id)
    }

    /// The longest-idle connection of the peer that holds the most connections with an idle
    /// one among them.
    fn biggest_holder_idle(&self) -> Option<u64> {
        let mut count: HashMap<&str, usize> = HashMap::new();
        self.held.values().for_each(|h| *count.entry(h.peer.as_str()).or_default() += 1);
        let mut peers: Vec<(&str, usize)> = count.into_iter().collect();
        peers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        peers.into_iter().find_map(|(p, _)| self.longest_idle(Some(p)))
    }

    /// Connection `id` began (`true`) or ended a request at `now`.
    pub(crate) fn request(&mut self, id: u64, begins: bool, now: Instant) {
        if let Some(h) = self.held.get_mut(&id) {
            h.served = true;
            h.busy = if begins { h.busy + 1 } else { h.busy.saturating_sub(1) };
            h.last_active = now;
        }
    }

    /// Connection `id` is closed.
    pub(crate) fn release(&mut self, id: u64) {
        self.held.remove(&id);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

/// A held connection's handle: marks its requests, and leaves the table when dropped.
pub(crate) struct Slot {
    pub(crate) id: u64,
    pub(crate) table: Arc<Mutex<Admission>>,
}

impl Slot {
    pub(crate) fn request(&self, begins: bool) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.request(self.id, begins, Instant::now());
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).release(self.id);
    }
}

/// The service of a held connection: each request marks the connection busy while it is served.
#[derive(Clone)]
pub(crate) struct Tracked<S> {
    pub(crate) inner: S,
    pub(crate) slot: Arc<Slot>,
}

impl<S, R> hyper::service::Service<R> for Tracked<S>
where
    S: hyper::service::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures_util::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn call(&self, req: R) -> Self::Future {
        self.slot.request(true);
        let served = self.inner.call(req);
        // NB: the request ends when its future completes or is dropped (the client went away).
        let done = Served(self.slot.clone());
        Box::pin(async move {
            let _done = done;
            served.await
        })
    }
}

/// Marks its connection's request ended when dropped.
struct Served(Arc<Slot>);

impl Drop for Served {
    fn drop(&mut self) {
        self.0.request(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(t: &Instant, s: u64) -> Instant {
        *t + Duration::from_secs(s)
    }

    #[test]
    fn a_peer_at_its_bound_replaces_its_own_longest_idle_connection() {
        let t0 = Instant::now();
        let mut a = Admission::new(100, 3);
        let tokens: Vec<CancellationToken> = (0..3).map(|_| CancellationToken::new()).collect();
        for (i, tok) in tokens.iter().enumerate() {
            assert!(matches!(
                a.admit("junk", at(&t0, i as u64), tok.clone()),
                Admit::Yes { evicted: None, .. }
            ));
        }
        // Another peer is not touched by junk's bound.
        assert!(matches!(
            a.admit("probe", at(&t0, 3), CancellationToken::new()),
            Admit::Yes { evicted: None, .. }
        ));
        // Junk's fourth replaces junk's oldest idle one.
        let got = a.admit("junk", at(&t0, 4), CancellationToken::new());
        assert_eq!(got, Admit::Yes { id: 4, evicted: Some(0) });
        assert!(tokens[0].is_cancelled() && !tokens[1].is_cancelled());
        assert_eq!(a.len(), 4);
    }

    #[test]
    fn a_full_listener_takes_its_victim_from_the_biggest_holder_never_a_lone_probe() {
        let t0 = Instant::now();
        let mut a = Admission::new(4, 10);
        let probe = CancellationToken::new();
        let _ = a.admit("kubelet", t0, probe.clone());
        let junk: Vec<CancellationToken> = (0..3).map(|_| CancellationToken::new()).collect();
        for (i, j) in junk.iter().enumerate() {
            let _ = a.admit("junk", at(&t0, 1 + i as u64), j.clone());
        }
        // Full: a newcomer from a third address evicts junk's oldest, not the older probe.
        let _ = a.admit("prometheus", at(&t0, 9), CancellationToken::new());
        assert!(!probe.is_cancelled() && junk[0].is_cancelled());
        // A peer over its own bound with nothing idle is not let past it at another's cost.
        let mut b = Admission::new(100, 1);
        let Admit::Yes { id, .. } = b.admit("tenant", t0, CancellationToken::new()) else {
            panic!()
        };
        b.request(id, true, t0);
        let Admit::Yes { id: second, .. } = b.admit("tenant", t0, CancellationToken::new()) else {
            panic!("once past the bound, while the listener has room")
        };
        b.request(second, true, t0);
        assert_eq!(b.admit("tenant", t0, CancellationToken::new()), Admit::No);
    }

    #[test]
    fn junk_that_never_sent_a_head_gives_way_before_a_real_client_s_keep_alive() {
        let t0 = Instant::now();
        let mut a = Admission::new(100, 2);
        let real = CancellationToken::new();
        let Admit::Yes { id: kept, .. } = a.admit("node", t0, real.clone()) else { panic!() };
        a.request(kept, true, at(&t0, 1));
        a.request(kept, false, at(&t0, 1));
        let junk = CancellationToken::new();
        let _ = a.admit("node", at(&t0, 2), junk.clone());
        // Full for this peer: the junk goes, though the keep-alive has been idle longer.
        let _ = a.admit("node", at(&t0, 3), CancellationToken::new());
        assert!(junk.is_cancelled() && !real.is_cancelled());
    }

    #[test]
    fn a_full_listener_closes_the_longest_idle_and_never_a_request_being_served() {
        let t0 = Instant::now();
        let mut a = Admission::new(2, 10);
        let first = CancellationToken::new();
        let Admit::Yes { id: busy, .. } = a.admit("prom", t0, first.clone()) else { panic!() };
        let _ = a.admit("junk", at(&t0, 1), CancellationToken::new());
        a.request(busy, true, at(&t0, 2));
        // The listener is full: junk (idle) gives way, the scrape in flight does not.
        assert_eq!(
            a.admit("probe", at(&t0, 3), CancellationToken::new()),
            Admit::Yes { id: 2, evicted: Some(1) }
        );
        assert!(!first.is_cancelled());
        // Both held connections in requests: the newcomer is served beyond the bound, up to
        // twice it; past that it is closed.
        a.request(2, true, at(&t0, 4));
        let Admit::Yes { id: extra, evicted: None } =
            a.admit("junk", at(&t0, 5), CancellationToken::new())
        else {
            panic!("a burst of real requests is served")
        };
        a.request(extra, true, at(&t0, 5));
        let Admit::Yes { id: extra2, .. } = a.admit("junk", at(&t0, 5), CancellationToken::new())
        else {
            panic!()
        };
        a.request(extra2, true, at(&t0, 5));
        assert_eq!(a.admit("junk", at(&t0, 5), CancellationToken::new()), Admit::No);
        a.release(extra);
        a.release(extra2);
        // A request ended: that connection is idle again, and the least recently active goes.
        a.request(busy, false, at(&t0, 6));
        let Admit::Yes { id: last, evicted } =
            a.admit("junk", at(&t0, 7), CancellationToken::new())
        else {
            panic!()
        };
        assert_eq!(evicted, Some(busy));
        assert!(first.is_cancelled());
        a.release(last);
        a.release(last);
        assert_eq!(a.len(), 1);
    }
}
