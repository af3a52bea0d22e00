"""Fail-slow with real processes (issue 45, ``gang.pace``): a two-process JAX job on CPU (gloo
collectives), one gang on two agents (two node names, one Redis), each rank timing its own
compute with ``Worker.compute``. The agents learn the gang's pace; then process 1 is throttled
— stopped 75 ms of every 100 (SIGSTOP/SIGCONT; strongly, so that the other tests' load on the
machine, which comes and goes, cannot hide it), as a host starved of CPU or a GPU clocked down
would slow it. Both ranks slow down (the collective waits for the slower), both agents find the
gang slow, and the one that opens the episode names process 1's node: it computes longer, the
other waits for it. Nothing is restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import pytest

from conftest import Agent, eventually, free_port, redis_client, unique
from test_jax import _need_jax

WORKER = Path(__file__).parent / "workers" / "jax_pace.py"

# Small windows so the test learns and decides in seconds (the defaults: 30 s windows, 2 min).
PACE = """[gang.pace]
enabled = true
window = "2s"
min_steps = 10
learn_windows = 4
slow_for = "6s"
warmup = "0s"
"""


def metric(agent: Agent, series: str) -> Optional[float]:
    """A series of the agent's scrape (`name{labels}`), or the sum of a family's series (`name`);
    `None` when there is none."""
    import urllib.request

    with urllib.request.urlopen(f"http://{agent.listen}/metrics", timeout=3) as resp:
        found = []
        for line in resp.read().decode().splitlines():
            name, _, value = line.rpartition(" ")
            if name == series or ("{" not in series and name.startswith(series + "{")):
                found.append(float(value))
    return sum(found) if found else None


def throttle(pid: int, stop: threading.Event) -> None:
    """Stop `pid` 75 ms of every 100 until `stop`; leave it running."""
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.075)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.025)
    except ProcessLookupError:
        return
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


# NB: the measure needs a machine whose load does not swing under it: CI runs the Python suite
# beside the Rust tests, whose load comes and goes and hid the throttle twice in fresh-clone
# runs. Run alone by `bash scripts/test-fail-slow-jax.sh` (green alone and at -n 4 here).
@pytest.mark.skipif(os.environ.get("VIGIL_PACE_JAX") != "1",
                    reason="a timing measure: run alone by scripts/test-fail-slow-jax.sh")
def test_a_throttled_process_slows_its_gang_and_vigil_names_its_node(
        two_agents: Tuple[Agent, Agent], containers: Callable[..., object], redis_url: str) -> None:
    _need_jax()
    a, b = two_agents
    a.start(extra=PACE)
    b.start(extra=PACE)
    gang = unique("ml/pace-")
    coordinator = f"127.0.0.1:{free_port()}"
    procs: List[subprocess.Popen] = []  # type: ignore[type-arg]
    for i, agent in enumerate((a, b)):
        # The rank's container, as its agent sees it (the process itself runs on the host).
        containers(["--label", f"{agent.label}={agent.worker}"], ["/bin/sleep", "100000"])
        env = dict(os.environ, VIGIL_WORKER=agent.worker, VIGIL_AGENT=agent.api_url, JAX_PLATFORMS="cpu",
                   PYTHONUNBUFFERED="1")
        env.pop("REDIS_URL", None)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), coordinator, str(i), gang], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    r = redis_client(redis_url)
    key = f"{a.prefix}:gang:{{{gang}}}:slow"
    series = 'vigil_gang_step_rate_baseline{gang="%s",worker="%s"}'
    stop = threading.Event()

    def logs() -> str:
        return f"agent a:\n{a.log_text()[-3000:]}\nagent b:\n{b.log_text()[-3000:]}"

    try:
        learned = eventually(lambda: all(metric(ag, series % (gang, ag.worker)) for ag in (a, b)), 120, 0.5)
        assert learned, f"no baseline learned\n{logs()}"
        time.sleep(4)
        assert r.get(key) is None, "no slow episode at the job's own pace"
        base = metric(a, series % (gang, a.worker))
        threading.Thread(target=throttle, args=(procs[1].pid, stop), daemon=True).start()

        def named() -> bool:
            value = r.get(key) or ""
            return "|" in value and not value.endswith("|?")
        assert eventually(named, 90, 0.5), f"no slow episode: {r.get(key)!r}\n{logs()}"
        value = r.get(key) or ""
        head, placed = value.split("|", 1)
        rate = int(head.split(":")[1]) / 1000
        assert placed.startswith(f"{b.node}/{b.worker}|"), f"{value}\n{logs()}"
        assert "computes" in placed and "they wait for it" in placed, value
        assert base and rate < 0.85 * base, (rate, base)
        opened = sum(metric(ag, "vigil_gang_slow_episodes_total") or 0 for ag in (a, b))
        assert opened == 1, "one agent opened the gang's episode"
        for agent in (a, b):
            restarts = metric(agent, "vigil_restarts_total") or 0
            assert restarts == 0, f"never a restart for slowness\n{logs()}"
    finally:
        stop.set()
        time.sleep(0.1)
        for p in procs:
            p.kill()
            p.communicate(timeout=30)
