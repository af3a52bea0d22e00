#!/usr/bin/env bash
# Start the agent (embedded coordinator, no metadata server), scrape its live /metrics in the
# classic text format and lint it with `promtool check metrics` (Debian's prometheus package).
set -euo pipefail
cd "$(dirname "$0")/.."
vigil=${VIGIL:-target/debug/vigil}
command -v promtool >/dev/null || { echo "check-metrics: promtool is missing (apt-get install prometheus)" >&2; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
cat > "$dir/vigil.toml" <<TOML
node_name = "check-metrics"
[server]
listen = "127.0.0.1:$port"
[metadata]
enabled = "off"
TOML
"$vigil" run --config "$dir/vigil.toml" > "$dir/agent.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 50); do
  curl -sf "http://127.0.0.1:$port/metrics" > "$dir/metrics.txt" && break
  sleep 0.2
done
[ -s "$dir/metrics.txt" ] || { cat "$dir/agent.log"; echo "check-metrics: no scrape" >&2; exit 1; }
promtool check metrics < "$dir/metrics.txt"
echo "check-metrics: $(grep -c '^# TYPE' "$dir/metrics.txt") metric families pass promtool"
