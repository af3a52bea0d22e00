//! What operators read: Prometheus metrics, the read-only HTTP server (`/metrics`, `/healthz`,
//! `/readyz`), the worker write API on its own authenticated listener, the loop's liveness, the
//! decision trail and the fleet view.

pub mod fleet;
pub mod health;
pub(crate) mod listen;
pub mod metrics;
pub(crate) mod server;
pub mod trail;
pub(crate) mod worker_api;
