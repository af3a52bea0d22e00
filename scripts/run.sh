#!/usr/bin/env bash
# Runs the agent on this machine (the README's "run the agent" command): installs the build's one
# system dependency when it is missing (protoc, for the CRI protos), then `cargo run --release`.
# Arguments go to `vigil run`, e.g. `bash scripts/run.sh --dry-run`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v protoc >/dev/null; then
  echo "scripts/run.sh: installing protobuf-compiler (needed to build the CRI protos)"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq protobuf-compiler >/dev/null
  fi
fi
# The worker API on loopback (scripts/local.toml), unless a config is given.
config=()
case " $* " in
  *" --config "*|*" -c "*|*" --config="*) ;;
  *) [ -n "${VIGIL_CONFIG:-}" ] || config=(--config scripts/local.toml) ;;
esac
exec cargo run --release -p vigil -- run "${config[@]}" "$@"
