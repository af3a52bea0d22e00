#!/usr/bin/env bash
# Prints what a healthy node costs Redis per cycle for 1, 8 and 32 workers: round trips (counted
# at the client: each coordinator call is one exchange) and commands (counted by Redis itself,
# INFO commandstats), through the real agent and Redis coordinator against a private
# redis-server. Counts do not depend on the build profile, so this uses the test build.
# Usage: [CYCLES] (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || bash scripts/setup.sh
cargo run --quiet --example redis_trips -- "${1:-5}"
