#!/usr/bin/env bash
# Prints how soon a hang of a 1 s-step training job is confirmed and how many false suspects a
# healthy one draws in a simulated day, under the fixed policy.stale_after and under the silence
# learned from the worker's rhythm (policy.learned), at poll intervals of 15 s, 5 s and 2 s: step
# traces replayed through the real verdict in simulated time. A figure, not a pass/fail test (the
# goal itself is held by the tests of agent/src/hang/replay.rs). Usage: [HANGS] (default 200).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet --release -p vigil --features bench --example rhythm -- "${1:-200}"
