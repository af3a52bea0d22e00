//! Shared test support: fakes for the deterministic scenarios, the in-process wiring of the agent
//! and the maintenance controller, helpers that start or find the real services (Redis, Docker,
//! a private containerd or Podman) for the integration and end-to-end suites, and the end-to-end
//! rig for the `vigil` binary.

#![allow(dead_code)]

pub mod containerd;
pub mod e2e;
pub mod fake_gpu;
pub mod fake_kube;
pub mod fake_metadata;
pub mod fake_podresources;
pub mod fakes;
pub mod fleet;
pub mod podman;
pub mod real;
pub mod redis_ha;
pub mod wiring;

/// Whether the Prometheus text `text` holds the sample line `sample` (`"vigil_runtime_up 1"`), a
/// whole line. NB: not `text.contains(..)`: the HELP of a 0/1 gauge reads
/// `# HELP vigil_runtime_up 1 when ...`, so `contains("vigil_runtime_up 1")` held whatever the value.
pub fn has_sample(text: &str, sample: &str) -> bool {
    text.lines().any(|l| l == sample)
}
