#!/usr/bin/env bash
# The seeded simulation of the restart protocol (tests/simulation.rs, docs/safety.md).
#
#   bash scripts/simulate.sh                   # 10,000 seeds (CI's test command runs 1,200)
#   VIGIL_SIM_SEEDS=200000 bash scripts/simulate.sh
#   VIGIL_SIM_FIRST_SEED=1000000 VIGIL_SIM_SEEDS=50000 bash scripts/simulate.sh
#   VIGIL_SIM_SEED=1234 bash scripts/simulate.sh   # replay one seed, whole trace printed
#   VIGIL_SIM_MUTANT=NoCompare VIGIL_SIM_SEED=7 bash scripts/simulate.sh   # replay with a mutant
#
#   VIGIL_SIM_GANG_SEEDS=5000 bash scripts/simulate.sh gang   # the gang simulation's seeds
#   VIGIL_SIM_LEARNED_SEEDS=20000 bash scripts/simulate.sh learned   # worlds restarting on learned rhythms
#   VIGIL_SIM_LEARNED=1 VIGIL_SIM_SEED=7 bash scripts/simulate.sh     # replay one of those
#
# A failing seed prints the invariant it broke, the last steps, and the command that replays it.
# Release-built (a second build profile, built once: the sweep then runs about ten times faster
# than the test build); SIM_PROFILE=dev uses the test build instead.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=(--release)
[ "${SIM_PROFILE:-release}" = dev ] && profile=()
export VIGIL_SIM_SEEDS="${VIGIL_SIM_SEEDS:-10000}"
test=seeded_fleet_simulation_keeps_every_invariant
[ "${1:-}" = gang ] && test=seeded_gang_simulation_keeps_every_invariant
if [ "${1:-}" = learned ]; then
  export VIGIL_SIM_LEARNED_SEEDS="${VIGIL_SIM_LEARNED_SEEDS:-10000}"
  test=seeded_simulation_with_learned_restarts_keeps_every_invariant
fi
exec cargo test "${profile[@]}" --test simulation -- "$test" --exact --nocapture
