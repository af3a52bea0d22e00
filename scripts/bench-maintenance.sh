#!/usr/bin/env bash
# Prints the latency from a metadata change (a preemption notice) to the Node patch and to the
# checkpoint request (a first notice, and a preemption landing inside a host-maintenance checkpoint
# round), through the real watcher, controller and Kubernetes adapter against the
# fake metadata and API servers. A figure, not a pass/fail test. Usage: [ITERATIONS] (default 20).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet --release --example maintenance_latency -- "${1:-20}"
