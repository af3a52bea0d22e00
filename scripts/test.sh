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
# Docker daemon).
#
# Does its own set-up (scripts/setup.sh): on a Debian/Ubuntu machine it installs what is missing,
# as root or through sudo. It cannot install cargo, kubectl or a Docker daemon: it says so if one
# is missing. The CRI tests start their own private containerd (tests/common/containerd.rs), the
# Podman tests their own `podman system service` (tests/common/podman.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

bash scripts/setup.sh
# The Python tools (kubernetes-validate, pytest, ...) live in the repository's .venv.
export PATH="$PWD/.venv/bin:$PATH"
for tool in cargo kubectl docker kubernetes-validate; do
  command -v "$tool" >/dev/null || {
    echo "scripts/test.sh: $tool is missing (cargo from rustup; kubectl ships with this machine image; docker from your distribution)" >&2
    exit 1
  }
done
docker info >/dev/null || { echo "scripts/test.sh: the Docker daemon does not answer" >&2; exit 1; }

# Redis on a free port, private to this run.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
cleanup() {
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 1 50); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
export VIGIL_TEST_REDIS_URL="redis://127.0.0.1:$port"
echo "scripts/test.sh: redis on $VIGIL_TEST_REDIS_URL"

# --locked: the README's `cargo install --locked --path agent` needs Cargo.lock current. (Not the
# install itself: without the tests' tokio `test-util` feature it rebuilt half the dependency tree,
# a minute of CI, for the same binary; the guide's test runs `scripts/run.sh` with this build's.)
cargo test --workspace --locked "$@"
bash scripts/check-model.sh
bash scripts/check-metrics.sh
bash scripts/check-deploy.sh
bash scripts/check-helm.sh
bash scripts/check-examples.sh
bash scripts/check-monitoring.sh
# The binary `cargo test` built above (the integration tests build it).
VIGIL_BIN="$PWD/target/debug/vigil" python -m pytest clients/python/tests -q
