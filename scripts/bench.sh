#!/usr/bin/env bash
# Every figure of the README's "Performance" section, in one run (figures, not pass/fail):
#   (a) Redis round trips and commands per cycle for 1, 8 and 32 workers  (bench-redis.sh)
#   (b) idle RSS, CPU and threads of the release binary with 8 workers    (bench-idle.sh)
#   (c) notice -> Node patched -> checkpoint requested, 100 notices, release (bench-maintenance.sh)
#   (d) 10,000 nodes x 8 workers against one redis-server at 15 s and 5 s (bench-fleet.sh)
# Takes about 20 minutes on a 2-core machine (most of it (c) and the release build).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== (a) Redis cost per cycle"; bash scripts/bench-redis.sh
echo "== (b) idle footprint";       bash scripts/bench-idle.sh "${BENCH_IDLE_SECONDS:-180}"
echo "== (c) notice latency";       bash scripts/bench-maintenance.sh 100
echo "== (d) fleet";                bash scripts/bench-fleet.sh 10000 8 30
