//! The integration suites: the agent's parts and whole agents in-process, against real Redis (standalone, Cluster, Sentinel), a real Alertmanager and the faithful fakes of tests/common (metadata server, Kubernetes API, NVML, PodResources) over real HTTP and gRPC; and the `vigil` binary where a suite runs the CLI.
//!
//! One test binary for several suites (issue 28): each suite is a module, run alone with
//! `cargo test --test integration <module>::`.

mod common;

mod alertmanager;
mod controllers;
mod coordination;
mod dra;
mod fail_slow;
mod gang;
mod gang_checkpoint;
mod gke;
mod gpu;
mod gpu_agent;
mod gpu_lifecycle;
mod idle;
mod kube;
mod kube_workloads;
mod maintenance;
mod metadata;
mod node_checks;
mod redis_acl;
mod scenarios;
mod secrets;
mod tpu;
mod webhooks;
