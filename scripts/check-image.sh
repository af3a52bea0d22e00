#!/usr/bin/env bash
# Builds and runs the Dockerfile's runtime stage on a machine with no container registry (this
# project's machines): a Debian bookworm rootfs from debootstrap stands in for
# debian:bookworm-slim, and the build stage is replaced by the release binary built here with
# the same command (`cargo build --release --locked -p vigil`). Every runtime-stage line of the
# Dockerfile is used verbatim. Not part of the test command (it needs a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
base=vigil-base:bookworm
tag=${TAG:-vigil:check}
cargo build --release --locked -p vigil
if ! docker image inspect "$base" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
  root=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
  tar -C "$root" -c . | docker import - "$base" >/dev/null
  rm -rf "$root"
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp target/release/vigil "$ctx/vigil"
python3 - "$base" Dockerfile "$ctx/Dockerfile" <<'PY'
import sys
base, src, dst = sys.argv[1:]
lines = open(src).read().splitlines()
froms = [i for i, l in enumerate(lines) if l.startswith("FROM ")]
assert len(froms) == 2, "expected a build stage and a runtime stage"
build = ["FROM %s AS build" % base, "COPY vigil /src/target/release/vigil"]
runtime = lines[froms[1]:]
runtime[0] = "FROM %s" % base
open(dst, "w").write("\n".join(build + runtime) + "\n")
PY
docker build -q -t "$tag" "$ctx" >/dev/null
echo "check-image: built $tag ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"
docker run --rm "$tag" --version
[ "$(docker run --rm --entrypoint /usr/bin/id "$tag" -u)" = "65532" ] || { echo "check-image: not running as 65532" >&2; exit 1; }
docker run --rm "$tag" demo --pace 0ms | tail -3
docker image inspect -f '{{json .Config.Labels}}' "$tag"
echo "check-image: ok"
