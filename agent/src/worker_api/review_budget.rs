//! How many TokenReviews a source the agent does not know yet may cause (issue 41): a token the
//! review cache does not hold costs the API server one review, so junk under the size bound
//! (8 KiB), each token distinct, cost one review each. Each review not answered from the cache
//! is charged to its peer's address and to the node; one that proves a pod is given back (a real
//! worker never spends anybody's budget), so only refusals — junk — use it up. Past either
//! bound the write is answered 429 with `Retry-After`, unreviewed. An address that proved a pod
//! of this node (by a token naming this node) is charged, for [`PROVEN_FOR`], to a second node
//! bucket of the same size, the proven addresses': a worker's token new to the agent (a kubelet
//! rotation, an agent restart's empty cache) is never held back by junk from strangers that
//! emptied theirs, and the node still causes at most twice its rate.
//!
//! Token buckets, pure: the clock is passed in. Peers are kept at most [`MAX_PEERS`] (the
//! fullest-refilled ones go first), so a flood from many addresses cannot grow the table.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

/// One bucket: `burst` reviews at once, refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rate {
    pub(crate) burst: f64,
    pub(crate) per_second: f64,
}

/// A peer's bucket: 10 reviews, then one every 2 s. A worker's first beats cost one review,
/// answered from the cache for `worker_api.review_cache` after that.
pub(crate) const PER_PEER: Rate = Rate { burst: 10.0, per_second: 0.5 };

/// The node's bucket, all peers together: 64 reviews at once (every rank of a 64-GPU node
/// starting with a fresh token), then 5 a second.
pub(crate) const PER_NODE: Rate = Rate { burst: 64.0, per_second: 5.0 };

/// Peers tracked at most (and addresses remembered as proven).
pub(crate) const MAX_PEERS: usize = 4096;

/// How long an address that proved a pod of this node is spared the node's bucket: as long as
/// a token that proved one is vouched for (`crate::worker_api::token_review`).
pub(crate) const PROVEN_FOR: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Bucket {
        Bucket { tokens: rate.burst, at: now }
    }

    /// The bucket at `now`, refilled since it was last charged.
    fn refilled(mut self, rate: Rate, now: Instant) -> Bucket {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * rate.per_second).min(rate.burst);
        self.at = now;
        self
    }

    /// How long until one review is allowed (zero: now).
    fn wait(&self, rate: Rate) -> Duration {
        if self.tokens >= 1.0 || rate.per_second <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((1.0 - self.tokens) / rate.per_second)
    }
}

/// The budgets of reviews a peer and the node may still cause.
#[derive(Debug)]
pub(crate) struct ReviewBudget {
    peer_rate: Rate,
    node_rate: Rate,
    peers: HashMap<IpAddr, Bucket>,
    node: Option<Bucket>,
    /// The node's bucket for the proven addresses, all together.
    proven_node: Option<Bucket>,
    /// The addresses whose review proved a pod of this node, and when it last did.
    proven: HashMap<IpAddr, Instant>,
}

/// A review taken, and which of the node's buckets paid for it (given back with it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Charge {
    proven: bool,
}

/// Why a review is not made now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Throttled {
    /// Whose bucket is empty: `"this address"` or `"this node"`.
    pub(crate) whose: &'static str,
    pub(crate) retry_after: Duration,
}

impl ReviewBudget {
    pub(crate) fn new(peer_rate: Rate, node_rate: Rate) -> ReviewBudget {
        let (peers, proven) = (HashMap::new(), HashMap::new());
        ReviewBudget { peer_rate, node_rate, peers, node: None, proven_node: None, proven }
    }

    /// Take one review for `peer` at `now`, or say how long to wait. An address that proved a
    /// pod within [`PROVEN_FOR`] pays the proven addresses' node bucket, not the strangers'.
    pub(crate) fn charge(&mut self, peer: IpAddr, now: Instant) -> Result<Charge, Throttled> {
        let (peer_rate, node_rate) = (self.peer_rate, self.node_rate);
        let proven = self
            .proven
            .get(&peer)
            .is_some_and(|at| now.saturating_duration_since(*at) < PROVEN_FOR);
        let pool = if proven { self.proven_node } else { self.node };
        let mut node =
            pool.unwrap_or_else(|| Bucket::full(node_rate, now)).refilled(node_rate, now);
        if !self.peers.contains_key(&peer) && self.peers.len() >= MAX_PEERS {
            self.forget_one(now);
        }
        let p = self.peers.entry(peer).or_insert_with(|| Bucket::full(peer_rate, now));
        *p = p.refilled(peer_rate, now);
        let verdict = if p.tokens < 1.0 {
            Err(Throttled { whose: "this address", retry_after: p.wait(peer_rate) })
        } else if node.tokens < 1.0 {
            Err(Throttled { whose: "this node", retry_after: node.wait(node_rate) })
        } else {
            p.tokens -= 1.0;
            node.tokens -= 1.0;
            Ok(Charge { proven })
        };
        if proven {
            self.proven_node = Some(node);
        } else {
            self.node = Some(node);
        }
        verdict
    }

    /// The review proved a pod: its charge is given back (real workers spend no budget).
    pub(crate) fn refund(&mut self, peer: IpAddr, charge: Charge) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.tokens = (p.tokens + 1.0).min(self.peer_rate.burst);
        }
        let pool = if charge.proven { self.proven_node.as_mut() } else { self.node.as_mut() };
        if let Some(n) = pool {
            n.tokens = (n.tokens + 1.0).min(self.node_rate.burst);
        }
    }

    /// `peer`'s review at `now` proved a pod of this node by a token naming this node: the
    /// address pays the proven addresses' node bucket for [`PROVEN_FOR`].
    pub(crate) fn prove(&mut self, peer: IpAddr, now: Instant) {
        if !self.proven.contains_key(&peer) && self.proven.len() >= MAX_PEERS {
            // The one proven longest ago goes first.
            let oldest = self.proven.iter().min_by_key(|(_, at)| **at).map(|(ip, _)| *ip);
            if let Some(ip) = oldest {
                self.proven.remove(&ip);
            }
        }
        self.proven.insert(peer, now);
    }

    /// Drop the peer whose bucket is the fullest by `now` (it has the least to remember).
    fn forget_one(&mut self, now: Instant) {
        let tokens = |b: &Bucket| b.refilled(self.peer_rate, now).tokens;
        let fullest = self.peers.iter().max_by(|a, b| tokens(a.1).total_cmp(&tokens(b.1)));
        if let Some(ip) = fullest.map(|(ip, _)| *ip) {
            self.peers.remove(&ip);
        }
    }

    #[cfg(test)]
    pub(crate) fn peers(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u32) -> IpAddr {
        IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[test]
    fn a_peer_causes_its_burst_then_one_review_per_refill() {
        let t0 = Instant::now();
        let mut b = ReviewBudget::new(PER_PEER, PER_NODE);
        let allowed = (0..100).filter(|_| b.charge(ip(1), t0).is_ok()).count();
        assert_eq!(allowed, 10);
        let err = b.charge(ip(1), t0).unwrap_err();
        assert_eq!(err.whose, "this address");
        assert_eq!(err.retry_after, Duration::from_secs(2));
        // Another address is not held back by the first one's junk.
        assert!(b.charge(ip(2), t0).is_ok());
        // 10 s later: 5 more.
        let later = t0 + Duration::from_secs(10);
        assert_eq!((0..100).filter(|_| b.charge(ip(1), later).is_ok()).count(), 5);
    }

    #[test]
    fn the_node_bounds_every_address_together() {
        let t0 = Instant::now();
        let mut b = ReviewBudget::new(PER_PEER, PER_NODE);
        let allowed = (0..1000).filter(|i| b.charge(ip(*i), t0).is_ok()).count();
        assert_eq!(allowed, 64);
        let err = b.charge(ip(5000), t0).unwrap_err();
        assert_eq!(err.whose, "this node");
        assert_eq!(err.retry_after, Duration::from_millis(200));
        assert!(b.peers() <= MAX_PEERS);
    }

    #[test]
    fn a_review_that_proves_a_pod_costs_nothing() {
        let t0 = Instant::now();
        let mut b = ReviewBudget::new(PER_PEER, PER_NODE);
        for _ in 0..1000 {
            let charge = b.charge(ip(1), t0).unwrap();
            b.refund(ip(1), charge);
        }
        assert!(b.charge(ip(1), t0).is_ok());
    }

    /// Junk from many addresses empties the strangers' node bucket; a worker's address that
    /// proved a pod still has its new token reviewed (a kubelet rotation), from the proven
    /// addresses' bucket, which bounds them all together too; a day later it is a stranger again.
    #[test]
    fn junk_that_empties_the_node_never_holds_back_a_proven_worker() {
        let t0 = Instant::now();
        let mut b = ReviewBudget::new(PER_PEER, PER_NODE);
        let charge = b.charge(ip(1), t0).unwrap();
        b.refund(ip(1), charge);
        b.prove(ip(1), t0);
        let junk = (2..1000).filter(|i| b.charge(ip(*i), t0).is_ok()).count();
        assert_eq!(junk, 64, "the node's burst");
        assert_eq!(b.charge(ip(5000), t0).unwrap_err().whose, "this node");
        // The rotated token: reviewed, from the proven bucket; given back there, the strangers'
        // bucket is not grown.
        let rotated = b.charge(ip(1), t0).expect("a proven worker's new token");
        assert_eq!(rotated, Charge { proven: true });
        b.refund(ip(1), rotated);
        assert_eq!(b.charge(ip(5000), t0).unwrap_err().whose, "this node");
        // Its own bucket still bounds it; and proven addresses together, the proven bucket.
        assert_eq!((0..100).filter(|_| b.charge(ip(1), t0).is_ok()).count(), 10);
        for i in 2000..2100 {
            b.prove(ip(i), t0);
        }
        let proven = (2000..2100).filter(|i| b.charge(ip(*i), t0).is_ok()).count();
        assert_eq!(proven, 64 - 10, "the proven addresses' burst, less ip 1's");
        let day = t0 + PROVEN_FOR + Duration::from_secs(20);
        let junk = (2..1000).filter(|i| b.charge(ip(*i), day).is_ok()).count();
        assert!(junk > 0);
        while b.charge(ip(6000), day).is_ok() {}
        assert_eq!(b.charge(ip(1), day).unwrap_err().whose, "this node", "proven no more");
    }

    #[test]
    fn the_table_of_peers_is_bounded() {
        let t0 = Instant::now();
        let mut b = ReviewBudget::new(PER_PEER, Rate { burst: 1e9, per_second: 0.0 });
        for i in 0..(MAX_PEERS as u32 + 500) {
            let _ = b.charge(ip(i), t0);
        }
        assert_eq!(b.peers(), MAX_PEERS);
    }
}
