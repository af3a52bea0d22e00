#!/usr/bin/env bash
# Builds and runs the Dockerfile's runtime stage on a machine with no container registry (this
# project's machines). Two stand-ins, everything else verbatim:
# - the distroless base (gcr.io/distroless/cc-debian12) is replaced by a Debian bookworm rootfs
#   from debootstrap with CA certificates: the same glibc, libgcc and certificates, plus a shell
#   and coreutils that distroless lacks (the checks below use `id`);
# - the build stage is replaced by the release binary built here with the same command
#   (`cargo build --release --locked -p vigil --bin vigil`, stripped by [profile.release]),
#   copied to the path the runtime stage copies from.
# Every runtime-stage line of the Dockerfile is used verbatim after its FROM. Because the stand-in
# has a shell and distroless does not, the runtime stage must have no RUN line (checked).
# Not part of the test command (it needs a release build).
set -euo pipefail
cd "$(dirname "$0")/.."
base=vigil-base:bookworm-cc
tag=${TAG:-vigil:check}
cargo build --release --locked -p vigil --bin vigil
if command -v readelf >/dev/null && readelf -S target/release/vigil | grep -q '\.symtab'; then
  echo "check-image: target/release/vigil is not stripped ([profile.release] strip = true?)" >&2
  exit 1
fi
if ! docker image inspect "$base" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
  root=$(mktemp -d)
  debootstrap --variant=minbase --include=ca-certificates bookworm "$root" \
    http://deb.debian.org/debian >/dev/null
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
runtime = lines[froms[1]:]
assert "distroless" in runtime[0], "the runtime stage is expected on a distroless base: " + runtime[0]
runs = [l for l in runtime if l.startswith("RUN ")]
assert not runs, "the distroless runtime stage has no shell to RUN: %r" % runs
copies = [l.split() for l in runtime if l.startswith("COPY --from=build ")]
assert len(copies) == 1 and len(copies[0]) == 4, "expected one COPY --from=build SRC DST: %r" % copies
binary = copies[0][2]
build = ["FROM %s AS build" % base, "COPY vigil %s" % binary]
runtime[0] = "FROM %s" % base
open(dst, "w").write("\n".join(build + runtime) + "\n")
PY
docker build -q -t "$tag" "$ctx" >/dev/null
echo "check-image: built $tag ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"
docker run --rm "$tag" --version
[ "$(docker image inspect -f '{{.Config.User}}' "$tag")" = "65532:65532" ] || { echo "check-image: USER is not 65532:65532" >&2; exit 1; }
[ "$(docker run --rm --entrypoint /usr/bin/id "$tag" -u)" = "65532" ] || { echo "check-image: not running as 65532" >&2; exit 1; }
docker run --rm "$tag" demo --pace 0ms | tail -3
labels=$(docker image inspect -f '{{json .Config.Labels}}' "$tag")
echo "$labels"
for l in title description licenses; do
  grep -q "\"org.opencontainers.image.$l\"" <<<"$labels" || { echo "check-image: no OCI label $l" >&2; exit 1; }
done
echo "check-image: ok"
