#!/usr/bin/env bash
# Installs what building and testing Vigil need, when it is missing (Debian/Ubuntu, as root or
# through sudo): protobuf-compiler (the CRI protos are compiled at build time), redis-server,
# busybox-static (the e2e tests build their tiny images from it), prometheus (promtool), spin,
# containerd, runc and containernetworking-plugins (the CRI tests run a private containerd, some
# pods on a bridge pod network), podman (the Podman tests run a
# private `podman system service`); pip: kubernetes-validate.
# Used by scripts/test.sh, scripts/run.sh and .ci/run; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo -E "$@"
  else echo "scripts/setup.sh: need root (or sudo) to run: $*" >&2; exit 1
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
command -v protoc >/dev/null || packages+=(protobuf-compiler)
command -v containerd >/dev/null || packages+=(containerd)
command -v runc >/dev/null || packages+=(runc)
command -v podman >/dev/null || packages+=(podman)
# The CRI tests' pod network (a bridge per private containerd).
[ -x /usr/lib/cni/bridge ] || packages+=(containernetworking-plugins)
if [ ${#packages[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || {
    echo "scripts/setup.sh: missing ${packages[*]}, and no apt-get to install them" >&2
    exit 1
  }
  echo "scripts/setup.sh: installing ${packages[*]}"
  as_root apt-get update -qq
  # NB: Debian's redis-server package also starts a Redis on 6379 as a service; the tests do not
  # use it (they start their own below).
  as_root apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi
if ! command -v kubernetes-validate >/dev/null; then
  echo "scripts/setup.sh: installing kubernetes-validate"
  python3 -m pip install -q kubernetes-validate==1.37.0
  if command -v pyenv >/dev/null; then pyenv rehash; fi
  hash -r
fi
