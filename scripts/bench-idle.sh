#!/usr/bin/env bash
# Idle footprint of the release binary with 8 healthy workers: RSS (max and last; the max is
# start-up's, before the agent lets its start-up code go at 20 s), CPU as % of
# one core, and threads, over DURATION seconds (default 180), against a private redis-server and
# 8 real containers on the local Docker daemon (a tiny busybox image built by `docker import`).
# The workers' records are kept fresh by redis-cli, as the workers would. Figures, not a test.
# Usage: [DURATION_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-180}"
command -v redis-server >/dev/null || bash scripts/setup.sh
cargo build --quiet --release -p vigil
bin=target/release/vigil
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
listen=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
label="vigil.bench.$$"
image=vigil-test-busybox:2
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  docker ps -aq --filter "label=$label" | xargs -r docker rm -f >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if ! docker image inspect "$image" >/dev/null 2>&1; then
  mkdir -p "$work/root/bin"
  cp "$(command -v busybox)" "$work/root/bin/busybox"
  for a in sh sleep; do ln -s busybox "$work/root/bin/$a"; done
  tar -C "$work/root" -cf "$work/rootfs.tar" bin
  docker import "$work/rootfs.tar" "$image" >/dev/null
fi
redis-server --port "$port" --bind 127.0.0.1 --dir "$work" --save "" --appendonly no >/dev/null &
pids+=($!)
sleep 0.5
for i in $(seq 0 7); do
  docker run -d --label "$label=w$i" "$image" sleep 100000 >/dev/null
done
beat() {
  while true; do
    now=$(redis-cli -p "$port" TIME | head -1)
    for i in $(seq 0 7); do
      redis-cli -p "$port" HSET "vigil:{bench}:status:w$i" state processing heartbeat "$now" progress "$now" >/dev/null
    done
    sleep 5
  done
}
beat &
pids+=($!)
cat > "$work/vigil.toml" <<TOML
node_name = "bench"
[server]
listen = "127.0.0.1:$listen"
[runtime]
kind = "docker"
worker_label = "$label"
[metadata]
enabled = "off"
[kubernetes]
enabled = "off"
TOML
REDIS_URL="redis://127.0.0.1:$port" "$bin" run --config "$work/vigil.toml" >"$work/vigil.log" 2>&1 &
vpid=$!
pids+=($vpid)
sleep 5
ticks() { awk '{print $14 + $15}' "/proc/$vpid/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks); s0=$(date +%s.%N); max=0; max_threads=0
end=$(( $(date +%s) + duration ))
while [ "$(date +%s)" -lt "$end" ]; do
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$vpid/status")
  [ "$rss" -gt "$max" ] && max=$rss
  n=$(ls "/proc/$vpid/task" | wc -l)
  [ "$n" -gt "$max_threads" ] && max_threads=$n
  sleep 5
done
t1=$(ticks); s1=$(date +%s.%N)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$vpid/status")
threads=$(ls "/proc/$vpid/task" | wc -l)
cpu=$(python3 -c "print(f'{($t1-$t0)/$hz/($s1-$s0)*100:.3f}')")
cycles=$(curl -s "http://127.0.0.1:$listen/metrics" | awk '/^vigil_cycle_duration_seconds_count/ {print $2}')
healthy=$(curl -s "http://127.0.0.1:$listen/metrics" | awk '/^vigil_verdicts_total\{verdict="healthy"\}/ {print $2}')
printf 'idle %ss, 8 workers, poll 15s: RSS %.1f MiB (max %.1f MiB), CPU %s%% of a core (%s ticks), %s threads (max %s); %s cycles, %s healthy verdicts\n' \
  "$duration" "$(echo "$rss/1024" | bc -l)" "$(echo "$max/1024" | bc -l)" "$cpu" "$((t1 - t0))" "$threads" "$max_threads" "${cycles:-?}" "${healthy:-?}"
# Where the resident memory is: heap and stacks (anonymous) or the binary's pages (file).
awk '/^Rss|^Anonymous|^Shared_Clean|^Private_Clean/ {printf "%s %.1f MiB  ", $1, $2/1024} END {print ""}' "/proc/$vpid/smaps_rollup"
# The binary's own mappings: resident KiB of each, and its advice (`rr`: pages read as they run).
awk -v exe="$(readlink -f "$bin")" '/^[0-9a-f]+-/ {m = ($6 == exe); perms = $2} m && /^Rss:/ {rss = $2} m && /^VmFlags/ {printf "  %s %s KiB (%s)\n", perms, rss, ($0 ~ / rr/ ? "rr" : "no advice")}' "/proc/$vpid/smaps"
# What each thread is: its name (comm), counted.
echo "threads by name: $(cat /proc/"$vpid"/task/*/comm | sort | uniq -c | awk '{printf "%s×%s ", $1, $2}')"
