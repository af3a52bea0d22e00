#!/usr/bin/env bash
# Prints how soon a gang that slows down is found slow (gang.pace at its defaults, 5 s poll),
# how often the rank that slows it is named (with compute times published, with only the GPU
# signal, with neither) and how many slow episodes a healthy job draws over simulated days:
# step traces of an 8-rank job replayed through the real pace verdict and suspect rule in
# simulated time (vigil::hang::replay_pace). A figure, not a pass/fail test (the goals are held
# by the tests of agent/src/hang/replay_pace.rs). Usage: [RUNS] (default 200). A debug build:
# the replay is light.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet -p vigil --features demo,bench --example pace -- "${1:-200}"
