"""A checkpoint is a collective: two JAX processes on CPU (``jax.distributed.initialize`` on
localhost, gloo collectives), one gang on two agents (two node names, one Redis), an Orbax
checkpoint. A host-maintenance notice on node A's (fake) metadata server opens one round for
the gang: both processes agree on it at the same step, both save, both acknowledge, and node A
records the gang's round as acknowledged by 2/2. With process 1 stuck before its save, the
round is cut short at its budget and names it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, List, Tuple

import pytest

from conftest import CLIENT, Agent, eventually, free_port, unique
from fake_metadata import FakeMetadata
from test_jax import _need_jax

EXAMPLE = CLIENT / "examples" / "jax_multihost.py"
TERMINATE = "TERMINATE_ON_HOST_MAINTENANCE"


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    fake = FakeMetadata()
    yield fake
    fake.close()


def start_job(a: Agent, b: Agent, metadata: FakeMetadata, containers: Callable[..., object], ckpt: Path,
              budget: str, stall: bool = False) -> Tuple[List[subprocess.Popen], str]:  # type: ignore[type-arg]
    gang = unique("ml/jax-")
    checkpoint = f'maintenance_budget = "{budget}"'
    a.start(checkpoint=checkpoint, metadata=f'enabled = "on"\nhost = "{metadata.host}"\ntimeout_sec = 5')
    b.start(checkpoint=checkpoint)
    coordinator = f"127.0.0.1:{free_port()}"
    procs = []
    for i, agent in enumerate((a, b)):
        # The rank's container, as its agent sees it (the trainer itself runs on the host).
        containers(["--label", f"{agent.label}={agent.worker}"], ["/bin/sleep", "100000"])
        env = dict(os.environ, VIGIL_WORKER=agent.worker, VIGIL_AGENT=agent.api_url, JAX_PLATFORMS="cpu",
                   PYTHONUNBUFFERED="1")
        env.pop("REDIS_URL", None)
        extra = ["--stall-on-save"] if stall and i == 1 else []
        procs.append(subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--coordinator", coordinator, "--num-processes", "2",
             "--process-id", str(i), "--gang", gang, "--ckpt-dir", str(ckpt), *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs, gang


def stop(procs: List[subprocess.Popen]) -> List[str]:  # type: ignore[type-arg]
    outs = []
    for p in procs:
        p.kill()
        out, _ = p.communicate(timeout=30)
        outs.append(out)
    return outs


def training(a: Agent, b: Agent) -> bool:
    return all(int(agent.record().get("progress") or 0) > 5 for agent in (a, b))


def gang_round_line(a: Agent) -> str:
    lines = [l for l in a.trail().splitlines() if " checkpoint-" in l and "gang " in l]
    return lines[-1] if lines else ""


@pytest.mark.jax
def test_a_maintenance_notice_on_one_host_saves_every_process_at_one_step(
        two_agents: Tuple[Agent, Agent], metadata: FakeMetadata, containers, tmp_path: Path) -> None:
    _need_jax()
    a, b = two_agents
    procs, gang = start_job(a, b, metadata, containers, tmp_path / "ckpt", budget="30s")
    try:
        assert eventually(lambda: training(a, b), 90), ([a.record(), b.record()], a.log_text())
        time.sleep(2)  # both agents' cycles have published their member to the gang's view
        # A drill first (from any machine with the fleet's Redis): the same collective save.
        drill = subprocess.run([str(a.bin), "drill", "checkpoint", "--config", str(a.config), "--gang", gang,
                                "--wait", "30s"], env=dict(os.environ, REDIS_URL=a.redis_url),
                               capture_output=True, text=True, timeout=60)
        metadata.set("maintenance-event", TERMINATE)
        assert eventually(lambda: "acked by" in gang_round_line(a), 45), (a.trail(), a.log_text())
        line = gang_round_line(a)
        rec_a, rec_b = a.record(), b.record()
    finally:
        outs = stop(procs)
    assert drill.returncode == 0, (drill.stdout, drill.stderr, outs)
    assert f"gang:{gang}: 2/2 acknowledged" in drill.stdout, drill.stdout
    assert "fits the 6 s preemption budget" in drill.stdout, drill.stdout
    drilled = [re.findall(r"process \d saved step (\d+) for request \S+ \(drill\)", o) for o in outs]
    assert drilled[0] and drilled[0] == drilled[1], f"both processes save the drill at one step: {drilled}"
    assert "checkpoint-drill" in a.trail() and "checkpoint-drill" in b.trail()
    assert "checkpoint-acked" in line and "acked by 2/2" in line, (line, outs)
    assert rec_a["checkpoint_request"] == rec_b["checkpoint_request"], (rec_a, rec_b)
    assert rec_a["checkpoint_reason"] == rec_b["checkpoint_reason"] == "host-maintenance"
    assert rec_a["checkpoint_ack"] == rec_a["checkpoint_request"] == rec_b["checkpoint_ack"]
    saved = [re.findall(r"process (\d) saved step (\d+) for request (\S+) \(host-maintenance\)", o) for o in outs]
    assert saved[0] and saved[1], outs
    assert saved[0][0][1] == saved[1][0][1], f"both processes save the same step: {saved}"
    assert saved[0][0][2] == saved[1][0][2] == rec_a["checkpoint_request"]
    step = saved[0][0][1]
    assert (tmp_path / "ckpt" / step).is_dir(), list((tmp_path / "ckpt").iterdir())
    assert b.decisions("checkpoint-acked", "rank-1") == 0, "node B had no notice: no round of its own"


@pytest.mark.jax
def test_a_process_stuck_before_its_save_is_named_when_the_round_is_cut_short(
        two_agents: Tuple[Agent, Agent], metadata: FakeMetadata, containers, tmp_path: Path) -> None:
    _need_jax()
    a, b = two_agents
    procs, gang = start_job(a, b, metadata, containers, tmp_path / "ckpt", budget="6s", stall=True)
    try:
        assert eventually(lambda: training(a, b), 90), ([a.record(), b.record()], a.log_text())
        time.sleep(2)
        started = time.monotonic()
        metadata.set("maintenance-event", TERMINATE)
        assert eventually(lambda: "acked by" in gang_round_line(a), 45), (a.trail(), a.log_text())
        took = time.monotonic() - started
        line = gang_round_line(a)
    finally:
        outs = stop(procs)
    assert "checkpoint-timed-out" in line and "acked by" in line and "/2" in line, (line, outs)
    assert f"{b.node}/rank-1 (state processing)" in line, (line, outs)
    assert took < 30, f"cut short at the 6 s budget, not {took:.0f}s"
    assert "process 1 saving step" in outs[1] and "process 1 saved" not in outs[1], outs[1]
