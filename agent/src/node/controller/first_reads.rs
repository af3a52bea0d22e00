//! Restarts wait for the agent's first reads of its node. At start-up the node's facts say "no
//! maintenance" only because nothing was read yet; an incident an earlier incarnation opened can
//! be due at the very first cycle, and a restart then would run in the middle of a host
//! maintenance or a drain the agent simply has not heard of. So the restart path stands down
//! until the metadata server has answered (or is off) and the Node was read (or there is none to
//! read), for at most `metadata.first_read_wait`: a source that never answers must not keep a
//! hung worker waiting for ever (the wait ending is said once, with what was not read).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::node::info::NodeInfoRx;
use crate::vocab::maintenance::RawMetadata;
use crate::vocab::stand_down::{unread, NodeFacts, SharedFacts, Unread};

/// The facts of an agent that has just started: both sources still to be read, for at most
/// `wait`.
pub fn facts_at_start(wait: Duration) -> SharedFacts {
    let facts = NodeFacts {
        unread: unread(false, false).map(|what| Unread { what, until: Instant::now() + wait }),
        ..NodeFacts::default()
    };
    std::sync::Arc::new(std::sync::RwLock::new(facts))
}

/// Until when restarts wait for the first reads; `None` once the wait is over (read, or given
/// up): nothing more to say or write.
pub(super) struct FirstReads {
    deadline: Option<Instant>,
}

/// How the wait ended, to say once.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum WaitEnded {
    /// Both read: restarts no longer wait.
    Read,
    /// `metadata.first_read_wait` ran out with this still unread.
    GaveUp(&'static str),
}

/// Whether the metadata source's start-up read is over: its watcher is off (the channel
/// closed, or none is left), or it says so (`RawMetadata::settled`). A state, not a change: a
/// value that came before the controller looked is as read as one that comes after.
fn metadata_read(rx: Option<&watch::Receiver<RawMetadata>>) -> bool {
    rx.is_none_or(|r| r.has_changed().is_err() || r.borrow().settled)
}

/// Whether the Node was read: there is no Node source (or it closed), or it holds a Node.
fn node_read(rx: Option<&NodeInfoRx>) -> bool {
    rx.is_none_or(|r| r.has_changed().is_err() || r.borrow().is_some())
}

impl FirstReads {
    /// The wait `facts` started with (`facts_at_start`), or one of `wait` from `now`.
    pub(super) fn of(facts: &SharedFacts, wait: Duration, now: Instant) -> FirstReads {
        let f = facts.read().unwrap_or_else(|p| p.into_inner());
        FirstReads { deadline: Some(f.unread.map_or(now + wait, |u| u.until)) }
    }

    /// Tell the restart path (`facts`) what it still waits for at `now`, from what the metadata
    /// channel (`None`: it closed) and the Node source hold, and say once how the wait ended
    /// (nothing to look at once the wait is over).
    pub(super) fn observe(
        &mut self,
        facts: &SharedFacts,
        rx: Option<&watch::Receiver<RawMetadata>>,
        node_rx: Option<&NodeInfoRx>,
        now: Instant,
    ) {
        let Some(deadline) = self.deadline else { return };
        let (left, ended) = self.settle(metadata_read(rx), node_read(node_rx), now);
        let left = left.map(|what| Unread { what, until: deadline });
        facts.write().unwrap_or_else(|p| p.into_inner()).unread = left;
        match ended {
            Some(WaitEnded::Read) => {
                tracing::info!("the node's maintenance state and Node read: restarts may run")
            }
            Some(WaitEnded::GaveUp(what)) => tracing::warn!(
                "restarts no longer wait for {what}: not read within metadata.first_read_wait"
            ),
            None => {}
        }
    }

    /// What restarts still wait for at `now`, given what is read, and how the wait ended when
    /// it ended with this call. Once over, always `(None, None)`.
    pub(super) fn settle(
        &mut self,
        metadata: bool,
        node: bool,
        now: Instant,
    ) -> (Option<&'static str>, Option<WaitEnded>) {
        let Some(deadline) = self.deadline else { return (None, None) };
        let ended = match unread(metadata, node) {
            None => WaitEnded::Read,
            Some(what) if now >= deadline => WaitEnded::GaveUp(what),
            waiting => return (waiting, None),
        };
        self.deadline = None;
        (None, Some(ended))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waiting until `deadline` at the latest.
    fn until(deadline: Instant) -> FirstReads {
        FirstReads { deadline: Some(deadline) }
    }

    /// Every combination of the two reads, before and at the deadline: restarts wait while
    /// anything is unread and the deadline has not passed; the end is said exactly once, and
    /// then nothing waits.
    #[test]
    fn restarts_wait_for_both_reads_or_the_deadline_and_the_end_is_said_once() {
        let t0 = Instant::now();
        let wait = Duration::from_secs(30);
        for (metadata, node) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut r = until(t0 + wait);
            let (left, ended) = r.settle(metadata, node, t0);
            assert_eq!(left, unread(metadata, node));
            assert_eq!(ended.is_some(), metadata && node);
            if metadata && node {
                assert_eq!(r.settle(false, false, t0), (None, None), "said once");
                continue;
            }
            let (left, ended) = r.settle(metadata, node, t0 + wait);
            assert_eq!(left, None, "the deadline ends the wait");
            let what = unread(metadata, node).unwrap();
            assert_eq!(ended, Some(WaitEnded::GaveUp(what)));
            assert_eq!(r.settle(true, true, t0 + wait), (None, None), "said once");
        }
    }

    /// The last read ends the wait before the deadline.
    #[test]
    fn the_last_read_ends_the_wait() {
        let t0 = Instant::now();
        let mut r = until(t0 + Duration::from_secs(30));
        assert!(r.settle(true, false, t0).0.unwrap().starts_with("the Node"));
        assert_eq!(r.settle(true, true, t0), (None, Some(WaitEnded::Read)));
    }

    /// What the controller publishes carries the deadline, and the facts stop waiting at it
    /// even if nothing clears them (a controller that died): the bound holds where it is read.
    #[test]
    fn the_facts_stop_waiting_at_the_deadline_whatever_the_controller_does() {
        let facts = facts_at_start(Duration::from_secs(30));
        let t0 = Instant::now();
        let mut r = FirstReads::of(&facts, Duration::from_secs(99), t0);
        // The metadata read, the Node not yet (its source is up, and holds none).
        let (_watcher, rx) =
            watch::channel(RawMetadata { settled: true, ..RawMetadata::default() });
        let (_source, node_rx) = crate::node::info::channel();
        r.observe(&facts, Some(&rx), Some(&node_rx), t0);
        let f = facts.read().unwrap().clone();
        let u = f.unread.expect("the Node is awaited");
        assert!(u.what.starts_with("the Node"));
        assert!(u.until <= t0 + Duration::from_secs(30), "the start's bound, not a new one");
        assert_eq!(f.unread_at(t0), Some(u.what));
        assert_eq!(f.unread_at(u.until), None);
    }

    /// A metadata channel is read when its watcher says the start-up read is over, or is gone;
    /// a value alone (the default, or a notice not yet settled) is not a read.
    #[test]
    fn the_metadata_is_read_when_settled_or_off() {
        let (tx, rx) = watch::channel(RawMetadata::default());
        assert!(!metadata_read(Some(&rx)));
        tx.send_modify(|r| r.preempted = Some(false));
        assert!(!metadata_read(Some(&rx)), "one key answered, not all");
        tx.send_modify(|r| r.settled = true);
        assert!(metadata_read(Some(&rx)));
        let (tx, rx) = watch::channel(RawMetadata::default());
        drop(tx);
        assert!(metadata_read(Some(&rx)), "no watcher");
        let (tx, rx) = crate::node::info::channel();
        assert!(!node_read(Some(&rx)));
        assert!(node_read(None));
        tx.send_replace(Some(crate::vocab::node_info::NodeInfo::default()));
        assert!(node_read(Some(&rx)));
    }
}
