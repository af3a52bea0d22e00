#!/usr/bin/env bash
# The seeded simulation of the restart protocol (tests/simulation.rs, docs/safety.md).
#
#   bash scripts/simulate.sh                   # 10,000 seeds (what CI runs)
#   VIGIL_SIM_SEEDS=200000 bash scripts/simulate.sh
#   VIGIL_SIM_FIRST_SEED=1000000 VIGIL_SIM_SEEDS=50000 bash scripts/simulate.sh
#   VIGIL_SIM_SEED=1234 bash scripts/simulate.sh   # replay one seed, whole trace printed
#   VIGIL_SIM_MUTANT=NoCompare VIGIL_SIM_SEED=7 bash scripts/simulate.sh   # replay with a mutant
#
# A failing seed prints the invariant it broke, the last steps, and the command that replays it.
# Uses the test build (no second build profile).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --test simulation -- seeded_fleet_simulation_keeps_every_invariant --nocapture
