#!/usr/bin/env bash
# Installs what building and testing Vigil need, when it is missing (Debian/Ubuntu, as root or
# through sudo): protobuf-compiler (the CRI protos are compiled at build time), redis-server,
# busybox-static (the e2e tests build their tiny images from it), prometheus (promtool),
# prometheus-alertmanager (tests/alertmanager.rs posts alerts to a real one), spin,
# containerd, runc and containernetworking-plugins (the CRI tests run a private containerd, some
# pods on a bridge pod network), podman (the Podman tests run a private `podman system service`),
# jq, python3-venv; then the Python tools in a virtual environment of the repository, .venv (never
# the system pip, which Debian and Ubuntu refuse): kubernetes-validate, helm-python-sdk (real Helm
# for scripts/check-helm.sh), PyYAML, jsonschema,
# pytest, redis (scripts/requirements.txt), the client clients/python (editable), and JAX + Orbax
# for the training-loop test (scripts/requirements-ml.txt).
# Used by scripts/test.sh, scripts/run.sh and .ci/run; safe to run again.
#
#   bash scripts/setup.sh          # both parts
#   bash scripts/setup.sh system   # the Debian packages only (what the build needs among them)
#   bash scripts/setup.sh python   # the virtual environment only (scripts/test.sh fills it
#                                  # while the Rust build runs)
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo -E "$@"
  else echo "scripts/setup.sh: need root (or sudo) to run: $*" >&2; exit 1
  fi
}

part=${1:-all}
case "$part" in
  all | system | python) ;;
  *) echo "scripts/setup.sh: unknown part '$part' (system, python, or nothing for both)" >&2; exit 2 ;;
esac

# Debian packages, each with the command (or dpkg package, for busybox-static: a dynamic
# busybox does not do for a scratch image) that shows it is there.
if [ "$part" != python ]; then
  packages=()
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || packages+=(redis-server)
  if command -v dpkg-query >/dev/null; then
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' \
      || packages+=(busybox-static)
  else
    [ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || packages+=(busybox-static)
  fi
  command -v promtool >/dev/null || packages+=(prometheus)
  command -v prometheus-alertmanager >/dev/null || packages+=(prometheus-alertmanager)
  command -v spin >/dev/null || packages+=(spin)
  command -v protoc >/dev/null || packages+=(protobuf-compiler)
  command -v containerd >/dev/null || packages+=(containerd)
  command -v runc >/dev/null || packages+=(runc)
  command -v podman >/dev/null || packages+=(podman)
  # The CRI tests' pod network (a bridge per private containerd).
  [ -x /usr/lib/cni/bridge ] || packages+=(containernetworking-plugins)
  # jq: tests/kube.rs runs the kubectl-only uninstall of docs/kubernetes.md as written.
  command -v jq >/dev/null || packages+=(jq)
  command -v python3 >/dev/null || packages+=(python3)
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || packages+=(python3-venv)
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
fi
[ "$part" = system ] && exit 0
# The Python tools: .venv at the repository root, made once; installed again only when a
# requirements file or the client's pyproject changes (a stamp of their contents).
venv=.venv
if [ ! -x "$venv/bin/python" ]; then
  echo "scripts/setup.sh: making the Python virtual environment $venv"
  python3 -m venv "$venv"
fi
stamp=$(cat scripts/requirements.txt scripts/requirements-ml.txt clients/python/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.vigil-setup" 2>/dev/null)" != "$stamp" ]; then
  echo "scripts/setup.sh: installing the Python tools into $venv"
  "$venv/bin/python" -m pip install -q -r scripts/requirements.txt
  "$venv/bin/python" -m pip install -q -e ./clients/python
  ml_ok=1
  "$venv/bin/python" -m pip install -q -r scripts/requirements-ml.txt || {
    ml_ok=0
    echo "scripts/setup.sh: JAX/Orbax could not be installed: clients/python/tests/test_jax.py will skip and say so" >&2
  }
  # NB: without JAX the stamp is not written, so the next run tries again.
  if [ "$ml_ok" = 1 ]; then echo "$stamp" > "$venv/.vigil-setup"; fi
fi
