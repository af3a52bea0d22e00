//! The end-to-end suites: the `vigil` binary (and the agent in-process where a test needs its parts) against the real Docker daemon, a private containerd with its CRI plugin and a private Podman service, with workers that hang the way real ones do.
//!
//! One test binary for several suites (issue 28): each suite is a module, run alone with
//! `cargo test --test end_to_end <module>::`.

mod common;

mod cri;
mod e2e;
mod e2e_cri;
mod e2e_gang;
mod e2e_jobset;
mod e2e_kubelet;
mod e2e_learned;
mod e2e_lws;
mod e2e_maintenance;
mod e2e_tenancy;
mod podman;
