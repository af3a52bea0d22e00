//! What operators read: Prometheus metrics, the read-only HTTP server (`/metrics`, `/healthz`,
//! `/readyz`), the worker write API on its own authenticated listener, the loop's liveness, the
//! decision trail and the fleet view.

pub mod fleet;
pub mod health;
pub mod listen;
pub mod metrics;
pub mod server;
pub mod trail;
pub mod worker_api;
