#!/usr/bin/env bash
# Runs the agent on this machine (the README's "run the agent" command), with scripts/local.toml
# unless a config is given. Arguments go to `vigil run`, e.g. `bash scripts/run.sh --dry-run`.
#
# The binary: `vigil` on the PATH when there is one (`cargo install --locked --path agent`, or a
# release's binary), else `cargo run --release` (which first installs the build's one system
# dependency when it is missing: protoc, for the CRI protos).
#
# The worker API's socket directory, /run/vigil, is made for the user who runs the agent (with
# sudo when that user is not root): the agent refuses a socket directory that another user owns.
set -euo pipefail
cd "$(dirname "$0")/.."
config=()
case " $* " in
  *" --config "*|*" -c "*|*" --config="*) ;;
  *) [ -n "${VIGIL_CONFIG:-}" ] || config=(--config scripts/local.toml) ;;
esac
if [ ! -d /run/vigil ]; then
  if [ "$(id -u)" = 0 ]; then install -d -m 0755 /run/vigil
  else
    echo "scripts/run.sh: making /run/vigil for $(id -un) (the worker API's socket directory), with sudo"
    sudo install -d -m 0755 -o "$(id -u)" -g "$(id -g)" /run/vigil
  fi
fi
if command -v vigil >/dev/null; then
  exec vigil run "${config[@]}" "$@"
fi
if ! command -v protoc >/dev/null; then
  echo "scripts/run.sh: installing protobuf-compiler (needed to build the CRI protos)"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq protobuf-compiler >/dev/null
  fi
fi
exec cargo run --release -p vigil -- run "${config[@]}" "$@"
