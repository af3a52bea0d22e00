#!/usr/bin/env bash
# Runs every test of the workspace: unit, scenario, coordination (real Redis) and end-to-end
# (the vigil binary against real Redis and the real Docker daemon).
#
# Then it lints a live /metrics scrape with promtool and validates the rendered deploy/
# manifests (scripts/check-metrics.sh, scripts/check-deploy.sh).
#
# Does its own set-up: on a Debian/Ubuntu machine it installs what is missing (apt-get:
# redis-server, busybox-static (the e2e tests build their tiny image from it with
# `docker import`), prometheus (for promtool), spin; pip: kubernetes-validate), as root or
# through sudo. It cannot install cargo, kubectl or a Docker daemon: it says so if one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo -E "$@"
  else echo "scripts/test.sh: need root (or sudo) to run: $*" >&2; exit 1
  fi
}

# Debian packages, each with the command (or dpkg package, for busybox-static: a dynamic
# busybox does not do for a scratch image) that shows it is there.
packages=()
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || packages+=(redis-server)
if command -v dpkg-query >/dev/null; then
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' \
    || packages+=(busybox-static)
else
  [ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || packages+=(busybox-static)
fi
command -v promtool >/dev/null || packages+=(prometheus)
command -v spin >/dev/null || packages+=(spin)
if [ ${#packages[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || {
    echo "scripts/test.sh: missing ${packages[*]}, and no apt-get to install them" >&2
    exit 1
  }
  echo "scripts/test.sh: installing ${packages[*]}"
  as_root apt-get update -qq
  # NB: Debian's redis-server package also starts a Redis on 6379 as a service; the tests do not
  # use it (they start their own below).
  as_root apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi
if ! command -v kubernetes-validate >/dev/null; then
  echo "scripts/test.sh: installing kubernetes-validate"
  python3 -m pip install -q kubernetes-validate==1.37.0
  if command -v pyenv >/dev/null; then pyenv rehash; fi
  hash -r
fi
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

cargo test --workspace "$@"
bash scripts/check-metrics.sh
bash scripts/check-deploy.sh
