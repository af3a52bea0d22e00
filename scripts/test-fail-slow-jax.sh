#!/usr/bin/env bash
# Fail-slow with real processes (issue 45): the two-process JAX job of
# clients/python/tests/test_fail_slow.py, run alone (a timing measure: CI's concurrent load swings
# under it). Needs the debug binary (cargo build) and .venv (scripts/setup.sh python).
set -euo pipefail
cd "$(dirname "$0")/.."
cd clients/python
VIGIL_PACE_JAX=1 VIGIL_BIN="$PWD/../../target/debug/vigil" PYTHONPATH=src \
  ../../.venv/bin/python -m pytest tests/test_fail_slow.py -q "$@"
