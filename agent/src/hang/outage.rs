//! Outages of the agent's two dependencies, the coordinator and the container runtime: each is
//! alerted once per outage (never once per cycle), logged when it ends, and shown in the
//! `*_up` gauges; after a coordinator error the loop retries sooner, with backoff.
//!
//! NB: the coordinator-down alert cannot be de-duplicated in the coordinator that is down: it is
//! sent from this memory, once per outage, with hysteresis against flapping. One failed cycle
//! alone is no outage (a command that timed out once, a failover's moment): the cycle fails
//! closed and the next is tried after a short backoff; the outage — and its alert — is a second
//! failed cycle that starts within three poll intervals (a minute at least) of the last failure,
//! whatever went through between them (a coordinator that fails every other cycle is down, not
//! blipping). NB: from the cycle's start, not its end: a failed cycle lasts its timeouts, which
//! `redis.timeout` sets and nothing bounds.

use std::time::Duration;

use tokio::time::Instant;

use crate::alerts::{Alert, AlertKind};
use crate::backoff::Backoff;
use crate::clock::Millis;
use crate::coord::CoordError;
use crate::hang::context::Context;
use crate::runtime::RuntimeError;

/// A coordinator that comes back must stay up this long before a new outage alerts again.
const REALERT_AFTER: Duration = Duration::from_secs(300);

/// The shortest time within which a second failed cycle makes an outage.
const OUTAGE_WITHIN_AT_LEAST: Duration = Duration::from_secs(60);

/// What this agent knows of its dependencies' outages.
pub(crate) struct Outages {
    coord_down: bool,
    /// When a cycle last failed at a coordinator error.
    failed_at: Option<Instant>,
    /// A failed cycle that starts within this long of the last failure makes an outage (three
    /// poll intervals — a failure, a good cycle, a failure, with the waits between — at least
    /// [`OUTAGE_WITHIN_AT_LEAST`]).
    outage_within: Duration,
    /// When the coordinator last came back (for the coordinator-down alert's hysteresis).
    up_since: Option<Instant>,
    runtime_down: bool,
    /// Since when the runtime is down, as the node's record says (the coordinator's clock).
    runtime_since: Option<Millis>,
    /// Pause before the next cycle after a coordinator error.
    backoff: Backoff,
    /// Pause before the next cycle otherwise (`poll_interval`: a reload keeps its running value).
    poll_interval: Duration,
}

impl Outages {
    /// Retries after a coordinator error start at 250 ms and back off up to `poll_interval`.
    pub fn new(poll_interval: Duration) -> Outages {
        Outages {
            coord_down: false,
            failed_at: None,
            outage_within: (poll_interval * 3).max(OUTAGE_WITHIN_AT_LEAST),
            up_since: None,
            runtime_down: false,
            runtime_since: None,
            backoff: Backoff::new(Duration::from_millis(250), poll_interval),
            poll_interval,
        }
    }

    /// The wait before the next cycle: the next backoff step after a coordinator error, the
    /// poll interval otherwise.
    pub(crate) fn next_wait(&mut self, coordinator_failed: bool) -> Duration {
        if coordinator_failed {
            self.backoff.next_delay()
        } else {
            self.poll_interval
        }
    }

    /// A whole cycle went through, writes included.
    pub(crate) fn coordinator_ok(&mut self, ctx: &Context) {
        if self.coord_down {
            tracing::info!(coordinator = %ctx.coord.describe(), "coordinator reachable again; restarts resume with the timers it kept");
            self.up_since = Some(Instant::now());
        }
        self.coord_down = false;
        self.backoff.reset();
        ctx.metrics.backends.set_coordinator_up(true);
    }

    /// The cycle that began at `started` stopped at a coordinator error: fail closed; begun
    /// within three poll intervals (a minute at least) of the last failure, an outage, alerted
    /// once.
    pub(crate) async fn coordinator_failed(
        &mut self,
        ctx: &Context,
        e: &CoordError,
        started: Instant,
    ) {
        ctx.metrics.backends.coordinator_error();
        ctx.metrics.backends.set_coordinator_up(false);
        // NB: hysteresis: an outage that flaps (up for a cycle, down again) is one outage, one
        // alert; a new alert needs the coordinator up for `REALERT_AFTER` first.
        let flapping = self.up_since.is_some_and(|t| t.elapsed() < REALERT_AFTER);
        let since = |t| started.saturating_duration_since(t);
        let again = (self.failed_at).is_some_and(|t| since(t) <= self.outage_within);
        self.failed_at = Some(Instant::now());
        if self.coord_down {
            return;
        }
        if !again {
            tracing::warn!(error = %e, "coordinator error: this cycle fails closed (no restart); the next is tried after a short backoff");
            return;
        }
        self.coord_down = true;
        if flapping {
            tracing::warn!(error = %e, "coordinator unavailable again (flapping): failing closed; no new alert");
            return;
        }
        tracing::error!(error = %e, "coordinator unavailable: failing closed, no restart until it returns");
        let a = Alert::new(AlertKind::CoordinatorDown, ctx.keys.node(), e.to_string());
        ctx.notifier.send(&a).await;
    }

    /// The runtime listed the workers.
    pub(crate) fn runtime_ok(&mut self, ctx: &Context) {
        if self.runtime_down {
            tracing::info!(runtime = %ctx.runtime.describe(), "container runtime reachable again");
        }
        (self.runtime_down, self.runtime_since) = (false, None);
        ctx.metrics.backends.set_runtime_up(true);
    }

    /// Since when the runtime is down, for the node's record: as its predecessor's record said
    /// (`shown`, for an agent started in the outage), else the first cycle's `now` that wrote
    /// it.
    pub(crate) fn runtime_down_since(&mut self, shown: Option<Millis>, now: Millis) -> Millis {
        *self.runtime_since.get_or_insert(shown.unwrap_or(now))
    }

    /// The runtime could not list the workers: alert once per outage.
    pub(crate) async fn runtime_failed(&mut self, ctx: &Context, e: &RuntimeError) {
        ctx.metrics.backends.runtime_error();
        ctx.metrics.backends.set_runtime_up(false);
        if self.runtime_down {
            return;
        }
        self.runtime_down = true;
        let detail = format!("{e}; workers cannot be listed or restarted until it returns");
        let a = Alert::new(AlertKind::RuntimeDown, ctx.keys.node(), detail);
        ctx.notifier.send(&a).await;
    }
}
