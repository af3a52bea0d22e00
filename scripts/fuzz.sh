#!/usr/bin/env bash
# Bounded fuzzing of the parsers (agent/src/fuzz.rs): the config loader, worker records, the
# metadata values and upcoming-maintenance JSON, CRI log lines and status API bodies, each from
# its committed corpus (agent/fuzz-corpus/) plus random input. The test command runs 2,000 cases
# per target; this runs more:
#
#   bash scripts/fuzz.sh            # 100,000 cases per target
#   VIGIL_FUZZ_CASES=1000000 bash scripts/fuzz.sh
#
# A failing input is shrunk, printed, and kept in agent/proptest-regressions/ (commit it: it is
# replayed first on every later run).
set -euo pipefail
cd "$(dirname "$0")/.."
VIGIL_FUZZ_CASES="${VIGIL_FUZZ_CASES:-100000}" exec cargo test --lib fuzz:: -- --nocapture
