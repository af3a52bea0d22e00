#!/usr/bin/env bash
# Runs every test of the workspace: unit, scenario, coordination (real Redis) and end-to-end
# (the vigil binary against real Redis and the real Docker daemon).
#
# Then it lints a live /metrics scrape with promtool, validates the rendered deploy/ manifests
# and the worker manifests of deploy/examples (scripts/check-metrics.sh, scripts/check-deploy.sh,
# scripts/check-examples.sh), renders and lints the Helm chart with real Helm and checks it is the
# overlays (scripts/check-helm.sh), checks the alert rules, their promtool tests, the dashboard and the
# monitoring components (scripts/check-monitoring.sh), and runs the Python client's suite
# (clients/python/tests: pytest against the `vigil` binary just built, a Redis of its own and the
# Docker daemon); and it builds the agent without the default `demo` feature.
#
# Does its own set-up (scripts/setup.sh): on a Debian/Ubuntu machine it installs what is missing,
# as root or through sudo. It cannot install cargo, kubectl or a Docker daemon: it says so if one
# is missing. The CRI tests start their own private containerd (tests/common/containerd.rs), the
# Podman tests their own `podman system service` (tests/common/podman.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

# NB: the suites wait on real processes far more than they compute (a full run used about one of
# the two cores), so they run side by side: the Python tools install while the Rust build runs,
# then the Rust tests run in one pool (cargo-nextest, .config/nextest.toml) beside the check
# scripts and the Python suite (pytest-xdist), each of those into a log printed whole when it
# ends. Without cargo-nextest, with arguments (passed to `cargo test`), or with
# VIGIL_TEST_SERIAL=1, everything runs one after the other as `cargo test` would.
serial=
if [ "$#" -gt 0 ] || [ -n "${VIGIL_TEST_SERIAL:-}" ] || ! command -v cargo-nextest >/dev/null; then
  serial=1
fi
logs=$(mktemp -d)
redis_dir=$(mktemp -d)
port=
cleanup() {
  [ -z "$port" ] || redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$redis_dir" "$logs"
}
trap cleanup EXIT

bash scripts/setup.sh system
for tool in cargo kubectl docker; do
  command -v "$tool" >/dev/null || {
    echo "scripts/test.sh: $tool is missing (cargo from rustup; kubectl ships with this machine image; docker from your distribution)" >&2
    exit 1
  }
done
docker info >/dev/null || { echo "scripts/test.sh: the Docker daemon does not answer" >&2; exit 1; }

# Redis on a free port, private to this run.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --dir "$redis_dir" --save "" --appendonly no \
  --daemonize yes --pidfile "$redis_dir/redis.pid" --logfile "$redis_dir/redis.log"
for _ in $(seq 1 50); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
export VIGIL_TEST_REDIS_URL="redis://127.0.0.1:$port"
echo "scripts/test.sh: redis on $VIGIL_TEST_REDIS_URL"

# The Python tools (kubernetes-validate, helm-python-sdk, pytest, JAX, ...) go into the
# repository's .venv, beside the build unless serial.
if [ -n "$serial" ]; then
  bash scripts/setup.sh python
else
  bash scripts/setup.sh python >"$logs/setup.log" 2>&1 &
  setup=$!
fi
# --locked: the README's `cargo install --locked --path agent` needs Cargo.lock current. (Not the
# install itself: without the tests' tokio `test-util` feature it rebuilt half the dependency tree,
# a minute of CI, for the same binary; the guide's test runs `scripts/run.sh` with this build's.)
checks=(model metrics deploy helm examples monitoring)
export PATH="$PWD/.venv/bin:$PATH"
if [ -n "$serial" ]; then
  cargo test --workspace --locked "$@"
  for check in "${checks[@]}"; do bash "scripts/check-$check.sh"; done
  # The binary `cargo test` built above (the integration tests build it).
  VIGIL_BIN="$PWD/target/debug/vigil" python -m pytest clients/python/tests -q
  # The agent without the `demo` feature builds too (not for a run narrowed by arguments).
  [ "$#" -gt 0 ] || cargo test --locked --no-run -q -p vigil --no-default-features --lib --bins
  exit 0
fi
cargo test --workspace --locked --no-run
echo "scripts/test.sh: built at ${SECONDS}s"
wait "$setup" || { cat "$logs/setup.log" >&2; echo "scripts/test.sh: scripts/setup.sh python failed" >&2; exit 1; }
cat "$logs/setup.log"
# nextest's view of the build, taken now, so that its run below invokes no cargo: cargo's lock
# is the next job's while the tests run.
cargo nextest list --workspace --locked --list-type binaries-only --message-format json \
  >"$logs/binaries.json"
cargo metadata --format-version 1 --locked --filter-platform "$(rustc -vV | sed -n 's/^host: //p')" \
  >"$logs/cargo-metadata.json"
status=0
# nextest runs no doc tests: the library's (none today) run here, before cargo's lock is taken.
cargo test --workspace --locked --doc -q || status=1
declare -A jobs=()
# The agent without the `demo` feature (no simulated runtime, no recording sinks) builds too —
# under .ci/run, linted, as its flags say. Its dependencies are the build's above, so only the
# agent is compiled again (a minute or two of one core), beside the tests at the lowest
# priority: on whatever CPU they leave, ahead of them only when they are done. (The tests keep
# both cores busy most of the time, so this saves half a minute, not the minute and a half it
# took after them.) Its artifacts are its own (other feature hashes; test harnesses are never
# copied to target/debug), so the `vigil` the tests run is untouched.
nice -n 19 cargo test --locked --no-run -q -p vigil --no-default-features --lib --bins \
  >"$logs/nodemo.log" 2>&1 &
jobs[nodemo]=$!
(for check in "${checks[@]}"; do bash "scripts/check-$check.sh" || exit 1; done) >"$logs/checks.log" 2>&1 &
jobs[checks]=$!
# The binary built above (the integration tests build it).
VIGIL_BIN="$PWD/target/debug/vigil" python -m pytest clients/python/tests -q -n 4 >"$logs/python.log" 2>&1 &
jobs[python]=$!
cargo nextest run --binaries-metadata "$logs/binaries.json" \
  --cargo-metadata "$logs/cargo-metadata.json" || status=1
echo "scripts/test.sh: the Rust tests ended at ${SECONDS}s"
for name in checks python nodemo; do
  wait "${jobs[$name]}" || { status=1; echo "scripts/test.sh: the $name failed (log below)" >&2; }
  echo "---- $name (ended by ${SECONDS}s) ----"
  cat "$logs/$name.log"
done
exit "$status"
