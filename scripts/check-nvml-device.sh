#!/usr/bin/env bash
# Vigil's NVML path against a real NVIDIA driver (docs/gpu.md, "Checked on a real GPU"): run on a
# machine with a GPU, never in CI (CI has none; tests/gpu*.rs cover the same path with the fake
# NVML). What it does, each step's output in OUT_DIR:
#
#   1. the machine: nvidia-smi, the driver's NVML library, the OS;
#   2. `vigil doctor` and `vigil config check` with NVML on (no Redis, no runtime, no metadata);
#   3. `vigil run` sampling every second: /metrics idle, under a bf16 matrix load (PyTorch, where
#      installed), and after a kernel that writes through a null pointer (CuPy, where installed):
#      a real MMU fault, an application XID (31, or 13 on some drivers) that NVIDIA's catalog
#      files under RESTART_APP, so the GPU must stay healthy while the XID is counted;
#   4. the same GPU read through NVIDIA's Python binding (nvidia-ml-py), and the agent's gauges
#      compared with it: the verdict lines PASS / FAIL / SEEN in OUT_DIR/verdict.txt.
#
#   bash scripts/check-nvml-device.sh VIGIL_BINARY OUT_DIR
#
# The binary is the one `cargo build` makes here; on the device tool it travels compressed
# (.device/vigil.xz, unpacked by this script when VIGIL_BINARY ends in .xz).
set -uo pipefail
bin=${1:?usage: check-nvml-device.sh VIGIL_BINARY OUT_DIR}
out=${2:?usage: check-nvml-device.sh VIGIL_BINARY OUT_DIR}
mkdir -p "$out"
work=$(mktemp -d)
if [[ "$bin" == *.xz ]]; then
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$bin" "$work/vigil"
  chmod +x "$work/vigil"
  bin="$work/vigil"
fi

{
  echo "== uname"; uname -a
  echo "== os"; grep PRETTY_NAME /etc/os-release
  echo "== nvidia-smi"; nvidia-smi
  echo "== libnvidia-ml"; ldconfig -p | grep -i nvidia-ml; ls -la /usr/local/nvidia/lib64/libnvidia-ml* 2>/dev/null
  echo "== vigil"; "$bin" --version
} >"$out/machine.txt" 2>&1

lib=$(ldconfig -p | awk '/libnvidia-ml\.so\.1 /{print $NF; exit}')
[ -n "$lib" ] || lib=/usr/local/nvidia/lib64/libnvidia-ml.so.1
port=19464
cat >"$work/vigil.toml" <<EOF
node_name = "nvml-device-check"
[server]
listen = "127.0.0.1:$port"
[metadata]
enabled = "off"
[kubernetes]
enabled = "off"
[gpu]
enabled = "on"
library_path = "$lib"
sample_interval = "1s"
state_file = "$work/gpu-state.json"
EOF
cp "$work/vigil.toml" "$out/vigil.toml"
"$bin" config check --config "$work/vigil.toml" >"$out/config-check.txt" 2>&1
echo "exit $?" >>"$out/config-check.txt"
"$bin" doctor --config "$work/vigil.toml" >"$out/doctor.txt" 2>&1
echo "exit $?" >>"$out/doctor.txt"

RUST_LOG=info "$bin" run --config "$work/vigil.toml" >"$out/agent.log" 2>&1 &
agent=$!
scrape() {
  python3 - "$port" >"$out/metrics-$1.txt" 2>&1 <<'EOF'
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode())
EOF
}
for _ in $(seq 1 30); do
  python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null && break
  sleep 0.5
done
sleep 4
scrape idle

# A bf16 matrix load for 15 s: utilisation, power, clocks and any throttle reason move. NB: the
# scrape waits for the first products to finish (PyTorch's start-up takes seconds), then for a
# few of the agent's 1 s samples, and NVIDIA's binding reads the GPU at the same moment.
python3 - "$work/loading" >"$out/load.txt" 2>&1 <<'EOF' &
import sys, time
try:
    import torch
except ImportError:
    print("no torch: no load"); raise SystemExit
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end, n = time.time() + 15, 0
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    if n == 0:
        open(sys.argv[1], "w").close()
    n += 20
print(f"{n} products of 8192^3 in 15 s")
EOF
load=$!
for _ in $(seq 1 60); do [ -e "$work/loading" ] && break; sleep 0.5; done
sleep 4
scrape load
python3 >"$out/load-nvml.txt" 2>&1 <<'EOF'
try:
    import pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    print(f"utilization {n.nvmlDeviceGetUtilizationRates(h).gpu} power {n.nvmlDeviceGetPowerUsage(h) / 1000}")
except Exception as e:
    print(f"unavailable: {e}")
EOF
wait "$load"

# A real application XID: a kernel that writes through a null pointer (an MMU fault).
python3 - >"$out/xid.txt" 2>&1 <<'EOF'
try:
    import cupy as cp
except ImportError:
    print("no cupy: no fault"); raise SystemExit
k = cp.RawKernel(r'extern "C" __global__ void bad(int* p) { p[threadIdx.x] = 1; }', "bad")
try:
    k((1,), (32,), (cp.uint64(0),))
    cp.cuda.Device().synchronize()
    print("the kernel ran without a fault")
except Exception as e:
    print(f"the kernel faulted: {type(e).__name__}: {e}")
EOF
sleep 5
scrape after
kill -TERM "$agent"
wait "$agent"
echo "agent exit $?" >>"$out/agent.log"

# NVIDIA's own binding, read now, and the verdict.
python3 - "$out" >"$out/verdict.txt" 2>&1 <<'EOF'
import re, sys
out = sys.argv[1]
def metrics(name):
    rows = {}
    for line in open(f"{out}/metrics-{name}.txt"):
        m = re.match(r'^(vigil_gpu_[a-z_]+)(\{[^}]*\})? (\S+)$', line.strip())
        if m:
            rows[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return rows
def one(rows, name, **labels):
    for (n, l), v in rows.items():
        if n == name and all(f'{k}="{val}"' in l for k, val in labels.items()):
            return v
    return None
def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
idle, load, after = metrics("idle"), metrics("load"), metrics("after")
check(one(idle, "vigil_gpu_monitoring") == 1, "NVML loaded (vigil_gpu_monitoring 1)")
check(one(idle, "vigil_gpu_monitor_state", state="on") == 1, "monitor state on")
try:
    import pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    uuid = n.nvmlDeviceGetUUID(h)
    mem = n.nvmlDeviceGetMemoryInfo(h)
    temp = n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
    print(f"nvml-py: {n.nvmlDeviceGetName(h)} {uuid} driver {n.nvmlSystemGetDriverVersion()} "
          f"mem {mem.total} temp {temp} power {n.nvmlDeviceGetPowerUsage(h) / 1000} W")
    check(one(idle, "vigil_gpu_memory_total_bytes", uuid=uuid) == mem.total,
          f"memory total equals NVML's ({mem.total} bytes)")
    t = one(after, "vigil_gpu_temperature_celsius", uuid=uuid)
    check(t is not None and abs(t - temp) <= 10, f"temperature {t} within 10 C of NVML's {temp}")
    try:
        reasons = n.nvmlDeviceGetCurrentClocksEventReasons(h)
    except Exception:
        reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons(h)
    print(f"nvml-py: clock event reasons now 0x{reasons:x}")
except Exception as e:
    print(f"SEEN nvml-py unavailable: {e}")
u_idle = one(idle, "vigil_gpu_utilization_ratio")
u_load = one(load, "vigil_gpu_utilization_ratio")
p_idle = one(idle, "vigil_gpu_power_watts")
p_load = one(load, "vigil_gpu_power_watts")
print("nvml-py under load: " + open(f"{out}/load-nvml.txt").read().strip())
check(u_load is not None and u_load > 0.5, f"utilisation under load {u_load} (idle {u_idle})")
check(p_load is not None and p_idle is not None and p_load > p_idle, f"power under load {p_load} W > idle {p_idle} W")
for (name, labels), v in sorted(load.items()):
    if name == "vigil_gpu_throttle" and v == 1:
        print(f"SEEN throttle under load: {labels}")
xids = {l: v for (name, l), v in after.items() if name == "vigil_gpu_xid_events_total"}
print(f"SEEN xid counters after the fault: {xids or 'none'}")
check(any(v >= 1 for v in xids.values()), "the MMU fault's XID reached the agent through the NVML event set")
check(one(after, "vigil_gpu_health", state="healthy") == 1, "the GPU stays healthy after an application XID")
for line in open(f"{out}/agent.log"):
    if "xid" in line.lower() or "NVML" in line:
        print("agent: " + line.rstrip()[:300])
EOF
cat "$out/verdict.txt"
rm -rf "$work"
