//! Known-bad variants of the restart path, for the seeded simulation's own test: the harness must
//! be able to fail, so `tests/simulation.rs` plants each of these and shows it caught.
//!
//! Only a build with the `sim-mutants` feature (the test suite's, through the dev-dependency on
//! this crate) can plant one (`Agent::plant`); a release build has no way to.

/// One planted bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "sim-mutants"), allow(dead_code))]
pub enum Mutant {
    /// No revalidation of the record and marks right before the command.
    NoRevalidation,
    /// No compare-and-restart: the decided incarnation is not inspected again.
    NoCompare,
    /// No node lock: the SET NX's answer and the TTL check before the command are ignored.
    NoLock,
    /// The breaker's refusal is ignored (the unit is still counted).
    BreakerIgnored,
    /// A failed restart is retried at the next cycle, without waiting out its backoff.
    NoRetryBackoff,
}
