//! What operators read: Prometheus metrics, the HTTP server (`/metrics`, `/healthz`, `/readyz`
//! and the local status API), the loop's liveness, the decision trail and the fleet view.

pub mod fleet;
pub mod health;
pub mod metrics;
pub mod server;
pub mod trail;
