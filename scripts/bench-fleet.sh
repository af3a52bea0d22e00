#!/usr/bin/env bash
# A fleet simulation against one real redis-server: NODES simulated nodes x WORKERS workers, each
# replaying a healthy agent's cycle through the agent's own Redis coordinator code, at the
# default poll (15 s) and at 5 s. Prints Redis CPU, round-trip latency p50/p99/p99.9 and late
# cycles. Release build (the load generator must not be the bottleneck).
# With a fourth argument `gang`: at the default poll, without a gang, with a gang of 1,000 nodes
# (each node's ranks in the gang's sharded view), and with that gang hung (every member node
# reading the whole view each cycle).
# Usage: [NODES] [WORKERS] [SECONDS] [gang]   (default 10000 8 30)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || bash scripts/setup.sh
cargo run --quiet --release --example fleet -- "${1:-10000}" "${2:-8}" "${3:-30}" ${4:-}
