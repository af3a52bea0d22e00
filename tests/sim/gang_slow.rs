//! Gang `ml/c` of the gang simulation (issue 45, fail-slow; docs/safety.md "A gang that slows
//! down"): a job that never stops but now and then runs slow — one member's node clocked down
//! for a while, every member beating and progressing at the slowest one's pace. Its own random
//! stream, so the other gangs' seeds play as before. With `gang.pace` on in every agent, the
//! harness checks after every cycle:
//!
//! - **no slow page without a slowdown**: a `slow` page for a gang comes only while it truly
//!   runs slow (or within a window or two of its end: the verdict is a window behind) — never
//!   for a gang that stops and restarts (`ml/a`, `ml/b`), never for jitter;
//! - **the slow member named**: when the job publishes each rank's compute time, the page names
//!   the member that slows it (unless that member's node was faulted since: its entry is stale);
//! - **never a restart for slowness**: no member of a job that only runs slow is restarted;
//! - **one page per slowdown**: an agent that crashes and comes back (its opener's among them)
//!   pages it no second time — unless a node stood down during it (a member held past the
//!   episode's lease lets it lapse, and the gang, still slow, is paged again).

use vigil::alerts::{Alert, AlertKind};
use vigil::clock::Millis;

use super::rng::Rng;

/// The slow gang: its id and its index among the simulation's gangs (worker `rank-g2`).
pub(super) const SLOW_GANG: &str = "ml/c";
pub(super) const SLOW_INDEX: usize = 2;

/// Steps a tick (15 s) at the job's pace: two a second.
const STEPS_PER_TICK: u64 = 30;
/// A rank's compute time before each collective at the job's pace, ms.
const COMPUTE_MS: u64 = 400;
/// How late after a slowdown ends a page may still come: the verdict closes a window
/// (`gang.pace.window`, 30 s) after the slowdown's end, and an agent may skip a cycle or two.
const PAGE_LAG: Millis = 150_000;

/// One member slowed: from `since` to `until`, at `pct` % of the job's pace.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slowdown {
    pub(super) member: usize,
    pub(super) pct: u64,
    pub(super) since: Millis,
    pub(super) until: Millis,
}

pub(super) struct SlowGang {
    /// Whether this seed runs it (one seed in three: the gangs that stop and restart are the
    /// costly part of a seed, and CI runs them in every one).
    pub(super) on: bool,
    rng: Rng,
    started: Millis,
    pub(super) step: u64,
    pub(super) slow: Option<Slowdown>,
    /// The last slowdown that ended.
    last: Option<Slowdown>,
    /// The job publishes each rank's compute time (`compute_ms`): the evidence that names it.
    pub(super) evidence: bool,
}

/// What the slow gang's run showed (totals in `GangStats`).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct SlowSeen {
    pub(super) pages: u64,
    pub(super) named: u64,
    /// The slowdown the last page was for (its start) and how many pages it had.
    pub(super) per: Option<(Millis, u64)>,
}

impl SlowGang {
    pub(super) fn new(seed: u64, now: Millis) -> SlowGang {
        let mut rng = Rng::new(seed ^ 0x5107_d0d0_5107_d0d0);
        let evidence = rng.below(3) != 0;
        SlowGang {
            on: seed.is_multiple_of(3),
            rng,
            started: now,
            step: 90_000,
            slow: None,
            last: None,
            evidence,
        }
    }

    /// This tick's events: a slowdown begins (once the job has run 20 minutes, long enough to
    /// learn its pace, and 10 after the last) or ends. A line for the trace when one does.
    pub(super) fn events(&mut self, now: Millis) -> Option<String> {
        if !self.on {
            return None;
        }
        if let Some(s) = self.slow.filter(|s| now >= s.until) {
            self.slow = None;
            self.last = Some(s);
            return Some(format!("gang c: member {} back at the job's pace", s.member));
        }
        let settled = now - self.started > 20 * 60_000
            && self.last.is_none_or(|l| now - l.until > 10 * 60_000);
        if self.slow.is_some() || !settled || self.rng.below(60) != 0 {
            return None;
        }
        let s = Slowdown {
            member: self.rng.below(super::gang::NODES as u64) as usize,
            pct: [50, 65, 75][self.rng.below(3) as usize],
            since: now,
            until: now + (8 + self.rng.below(22) as Millis) * 60_000,
        };
        self.slow = Some(s);
        Some(format!(
            "gang c: member {} slows the job to {} % for {} min (compute_ms published: {})",
            s.member,
            s.pct,
            (s.until - s.since) / 60_000,
            self.evidence
        ))
    }

    /// While the job runs slow, now and then (a tick in 40, from its own stream): the agent
    /// that opened its slow episode crashes and comes back — an opener restarted in the
    /// middle of an episode, which takes it back rather than page it twice.
    pub(super) fn opener_crashes(&mut self) -> bool {
        self.slow.is_some() && self.rng.below(40) == 0
    }

    /// The job's steps this tick (its slowest member's pace, with a little jitter), and each
    /// member's compute time when the job publishes it: the slow member computes longer, the
    /// others wait for it at the collective.
    pub(super) fn tick(&mut self, members: usize) -> Vec<Option<u64>> {
        let pct = self.slow.map_or(100, |s| s.pct);
        let jitter = self.rng.below(5);
        self.step += STEPS_PER_TICK * pct / 100 + jitter - 2;
        (0..members)
            .map(|m| {
                let c = match self.slow {
                    Some(s) if s.member == m => COMPUTE_MS * 100 / s.pct,
                    _ => COMPUTE_MS,
                };
                let noise = self.rng.below(21);
                self.evidence.then_some(c + noise - 10)
            })
            .collect()
    }

    /// A `slow` page (any gang's) against the truth. `faulted(n, since)`: node `n`'s agent was
    /// faulted (crashed, stood down, the coordinator gone) since `since`; `held(since)`: a node
    /// stood down at some time since `since`.
    pub(super) fn judge_page(
        &self,
        a: &Alert,
        now: Millis,
        (faulted, held): (impl Fn(usize, Millis) -> bool, impl Fn(Millis) -> bool),
        seen: &mut SlowSeen,
    ) -> Result<(), (&'static str, String)> {
        if a.kind != AlertKind::Slow {
            return Ok(());
        }
        let gang = a.gang.as_deref().unwrap_or_default();
        let late = self.last.filter(|l| now - l.until <= PAGE_LAG);
        let truth = match (gang == SLOW_GANG, self.slow.or(late)) {
            (true, Some(s)) => s,
            _ => {
                return Err((
                    "no slow page without a slowdown",
                    format!("gang {gang} paged slow but runs at its pace: {}", a.detail),
                ))
            }
        };
        seen.pages += 1;
        let count = match seen.per {
            Some((at, n)) if at == truth.since => n + 1,
            _ => 1,
        };
        seen.per = Some((truth.since, count));
        if count > 1 && !held(truth.since) {
            return Err((
                "one page per slowdown",
                format!(
                    "gang c: the slowdown of member {} paged {count} times, no node stood down: {}",
                    truth.member, a.detail
                ),
            ));
        }
        let named = format!("on node gpu-{}:", truth.member);
        if a.detail.contains(&named) {
            seen.named += 1;
            return Ok(());
        }
        // NB: a wrong name is wrong whatever happened; nobody named is excused when the slow
        // member's entry may be stale (its node's agent faulted since the slowdown began).
        let wrong = a.detail.contains("the member it waits for is");
        if wrong || (self.evidence && !faulted(truth.member, truth.since)) {
            return Err((
                "the slow member named",
                format!(
                    "gang c: member {} computes longer and published it, but the page names another or nobody: {}",
                    truth.member, a.detail
                ),
            ));
        }
        Ok(())
    }
}
