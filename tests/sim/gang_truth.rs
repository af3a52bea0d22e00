//! The gang simulation's ground truth (`super::gang`): what each gang's collective is doing, how
//! far it has got, and the restarts the harness has seen of its members — what the agents'
//! actions are judged against.

use vigil::clock::Millis;

/// What a gang's collective is doing.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Phase {
    /// Every member beats.
    Running,
    /// One member stopped at `at`; the others beat on until `until`, then stop too (a
    /// collective blocks on its straggler) — or, with `until` `None`, the straggler resumes.
    Straggling { member: usize, until: Option<Millis> },
    /// The collective stopped at `at`.
    Stopped { at: Millis },
    /// Every member was restarted; it trains again from `at` (or never: a restart that does
    /// not help).
    Booting { at: Option<Millis> },
}

pub(super) struct GangTruth {
    pub(super) phase: Phase,
    /// When a member last progressed (beat while the collective moved).
    pub(super) progressed_at: Millis,
    /// Restarts seen of each member (by node), and when each member was last restarted.
    pub(super) restarts: Vec<usize>,
    pub(super) last_restart: Vec<Option<Millis>>,
    /// A restart wave: when its first member was restarted, and how many cycles each node's
    /// agent had run then.
    pub(super) wave: Option<Millis>,
    pub(super) wave_cycles: Vec<u64>,
    /// The members an excused partial wave left out: their node's agent may still carry out
    /// the standing decision once the node is back (the restart completes late).
    pub(super) left_out: Vec<usize>,
    /// When the last member left out completed the partial restart: a new wave that begins
    /// soon after may be the one it was restarted for (`super::gang`'s check).
    pub(super) completed_at: Option<Millis>,
    /// `hung` alerts seen for this gang during the current stop, and when that stop began.
    pub(super) hung_pages: usize,
    pub(super) stopped_at: Millis,
    /// When a failover last forgot this gang's incident and decision.
    pub(super) failover_at: Millis,
    /// The collective's step: one further each tick its members beat.
    pub(super) step: u64,
    /// Where the collective stops again: a restart that brings it back to the same hang.
    pub(super) stop_at: Option<u64>,
    /// The step when the last restart wave began.
    pub(super) at_wave: u64,
    /// The decisions in a row that brought the collective no further than it was at any of
    /// them (`past`, the furthest of those steps); `passed`: it got past that since the last
    /// one. The product's run, as the harness sees it.
    pub(super) fruitless: u32,
    pub(super) past: Option<u64>,
    pub(super) passed: bool,
}

impl GangTruth {
    pub(super) fn new(now: Millis, nodes: usize, step: u64) -> GangTruth {
        GangTruth {
            phase: Phase::Running,
            progressed_at: now,
            restarts: vec![0; nodes],
            last_restart: vec![None; nodes],
            wave: None,
            wave_cycles: vec![0; nodes],
            left_out: Vec::new(),
            completed_at: None,
            hung_pages: 0,
            stopped_at: 0,
            failover_at: Millis::MIN / 2,
            step,
            stop_at: None,
            at_wave: step,
            fruitless: 0,
            past: None,
            passed: false,
        }
    }

    /// The collective moved one step.
    pub(super) fn stepped(&mut self) {
        self.step += 1;
        if self.past.is_some_and(|p| self.step > p) {
            self.passed = true;
        }
    }

    /// Whether the restarts so far forbid another (`max` 0: no limit): `max` waves in a row
    /// and the collective not past where it stopped at any of them.
    pub(super) fn fruitless_now(&self, max: u32) -> bool {
        max > 0 && self.fruitless >= max && !self.passed
    }

    /// The gang's restart of every member is decided (its `restarting` page): refused (the
    /// invariant "restarts that do not help stop") when the restarts so far forbid it.
    ///
    /// NB: counted at the decision, as the product counts its run (a decision whose restart a
    /// member's node then refused — it stood down on the decision's tick — is one the run
    /// holds: gang seed 9165, counted at the waves, read a refusal after it as wrong).
    pub(super) fn decided(&mut self, max: u32) -> Result<(), String> {
        if self.fruitless_now(max) {
            return Err(format!(
                "{} restarts of every member in a row brought no progress past step {}, and another was decided",
                self.fruitless,
                self.past.unwrap_or_default()
            ));
        }
        if self.fruitless == 0 || self.passed {
            self.fruitless = 1;
            self.past = Some(self.step);
        } else {
            self.fruitless += 1;
            self.past = self.past.max(Some(self.step));
        }
        self.passed = false;
        Ok(())
    }

    /// Every member restarted (by Vigil or by a person): the job resumes `back` steps before
    /// where it stopped (its last checkpoint).
    pub(super) fn resumed(&mut self, back: u64) {
        self.step = self.step.saturating_sub(back);
    }
}
