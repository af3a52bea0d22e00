#!/usr/bin/env bash
# Issue 46, end to end: four `vigil run` agents (one Redis, the real Docker daemon, the production
# defaults with `[policy.learned] restarts = true`), one rank each of a job that beats every second
# for a few minutes and then stops as a collective. Prints, for each rank, the time from the last
# beat to its restart and to its first beat after it (the fixed rule's figure beside it).
#
#   bash scripts/e2e-learned-gang.sh            # learns for 180 s, then the hang
#   VIGIL_E2E_LEARN_S=120 bash scripts/e2e-learned-gang.sh
#
# Needs what the test command needs (Docker, redis-server, busybox-static: scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --locked --test end_to_end -- \
  e2e_learned::a_gang_with_a_learned_rhythm_is_restarted_within_a_minute_of_its_last_beat \
  --exact --ignored --nocapture
