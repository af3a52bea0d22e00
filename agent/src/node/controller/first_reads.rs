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
use crate::vocab::stand_down::{awaiting, SharedFacts};

/// What has been read since start, and until when restarts wait for the rest.
pub(super) struct FirstReads {
    metadata: bool,
    node: bool,
    deadline: Instant,
    /// The wait is over (read, or given up): nothing more to say or write.
    over: bool,
}

/// How the wait ended, to say once.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum WaitEnded {
    /// Both read: restarts no longer wait.
    Read,
    /// `metadata.first_read_wait` ran out with this still unread.
    GaveUp(&'static str),
}

impl FirstReads {
    /// From what is read at `now` already, waiting at most `wait` for the rest.
    pub(super) fn new(metadata: bool, node: bool, wait: Duration, now: Instant) -> FirstReads {
        FirstReads {
            metadata,
            node,
            deadline: now + wait,
            over: false,
        }
    }

    /// What is read already, before the controller marks the channels seen: an answer in, or a
    /// closed channel (no watcher, no Node source), is a first read done.
    pub(super) fn at_start(
        rx: &watch::Receiver<RawMetadata>,
        node_rx: Option<&NodeInfoRx>,
        wait: Duration,
        now: Instant,
    ) -> FirstReads {
        let node = node_rx.is_none_or(|r| r.has_changed().is_err() || r.borrow().is_some());
        FirstReads::new(rx.has_changed().unwrap_or(true), node, wait, now)
    }

    /// Tell the restart path (`facts`) what it still waits for at `now` (`node_gone`: the Node
    /// source closed, nothing more to wait for from it), and say once how the wait ended.
    pub(super) fn publish(&mut self, facts: &SharedFacts, node_gone: bool, now: Instant) {
        if self.over {
            return;
        }
        if node_gone {
            self.node_read();
        }
        let (left, ended) = self.settle(now);
        {
            let mut f = facts.write().unwrap_or_else(|p| p.into_inner());
            if f.awaiting != left {
                f.awaiting = left;
            }
        }
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

    /// The metadata server answered, or its watcher is off.
    pub(super) fn metadata_read(&mut self) {
        self.metadata = true;
    }

    /// The Node was read, or its source is gone.
    pub(super) fn node_read(&mut self) {
        self.node = true;
    }

    /// What restarts still wait for at `now` (the value of `NodeFacts::awaiting`), and how the
    /// wait ended when it ended with this call. Once over, always `(None, None)`.
    pub(super) fn settle(&mut self, now: Instant) -> (Option<&'static str>, Option<WaitEnded>) {
        if self.over {
            return (None, None);
        }
        match awaiting(self.metadata, self.node) {
            None => {
                self.over = true;
                (None, Some(WaitEnded::Read))
            }
            Some(what) if now >= self.deadline => {
                self.over = true;
                (None, Some(WaitEnded::GaveUp(what)))
            }
            waiting => (waiting, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every order of the two reads and the deadline: restarts wait while anything is unread
    /// and the deadline has not passed; the end is said exactly once, and then nothing waits.
    #[test]
    fn restarts_wait_for_both_reads_or_the_deadline_and_the_end_is_said_once() {
        let t0 = Instant::now();
        let wait = Duration::from_secs(30);
        for (metadata, node) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut r = FirstReads::new(metadata, node, wait, t0);
            let (first, ended) = r.settle(t0);
            assert_eq!(first, awaiting(metadata, node));
            assert_eq!(ended.is_some(), metadata && node);
            r.metadata_read();
            let (left, ended) = r.settle(t0 + Duration::from_secs(1));
            match (metadata, node) {
                (true, true) => {
                    assert_eq!((left, ended), (None, None), "said once");
                    continue;
                }
                (false, true) => {
                    assert_eq!((left, ended), (None, Some(WaitEnded::Read)));
                    continue;
                }
                _ => assert_eq!((left, ended), (awaiting(true, false), None)),
            }
            let late = t0 + wait;
            let (left, ended) = r.settle(late);
            assert_eq!(left, None, "the deadline ends the wait");
            assert_eq!(
                ended,
                Some(WaitEnded::GaveUp(awaiting(true, false).unwrap()))
            );
            r.node_read();
            assert_eq!(r.settle(late), (None, None), "said once");
        }
    }

    /// The Node read last ends the wait before the deadline.
    #[test]
    fn the_last_read_ends_the_wait() {
        let t0 = Instant::now();
        let mut r = FirstReads::new(true, false, Duration::from_secs(30), t0);
        assert!(r.settle(t0).0.unwrap().starts_with("the Node"));
        r.node_read();
        assert_eq!(r.settle(t0), (None, Some(WaitEnded::Read)));
    }
}
