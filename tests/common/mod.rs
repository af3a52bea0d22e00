//! Shared test support: fakes for the deterministic scenarios, and helpers that start or find the
//! real services (Redis, Docker) for the integration and end-to-end suites.

#![allow(dead_code)]

pub mod fake_gpu;
pub mod fake_kube;
pub mod fake_metadata;
pub mod fakes;
pub mod real;
