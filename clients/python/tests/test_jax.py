"""A real JAX (CPU) training loop under the client, with Orbax checkpointing: the agent's
checkpoint request (its SIGTERM round) makes the loop save a checkpoint that a new run resumes
from, and the acknowledgement ends the round early."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CLIENT, EARLY_ROUND_LIMIT, LONG_SIGTERM_ROUND, SIGTERM_EXIT_LIMIT, Agent, eventually

EXAMPLE = CLIENT / "examples" / "jax_orbax.py"


def _need_jax() -> None:
    missing = []
    for mod in ("jax", "orbax.checkpoint"):
        try:
            __import__(mod)
        except Exception as e:  # ImportError, or a broken install
            missing.append(f"{mod} ({type(e).__name__}: {e})")
    if missing:
        pytest.skip("JAX/Orbax cannot be imported in this environment: " + ", ".join(missing)
                    + " -- scripts/setup.sh installs jax[cpu] and orbax-checkpoint into .venv")


def _run(agent: Agent, ckpt: Path, *extra: str) -> subprocess.Popen:  # type: ignore[type-arg]
    env = dict(os.environ, VIGIL_WORKER=agent.worker, VIGIL_AGENT=agent.api_url, JAX_PLATFORMS="cpu",
               PYTHONUNBUFFERED="1")
    env.pop("REDIS_URL", None)
    return subprocess.Popen([sys.executable, str(EXAMPLE), "--ckpt-dir", str(ckpt), "--step-time", "0.02", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.jax
def test_a_jax_loop_saves_an_orbax_checkpoint_when_asked(agent: Agent, containers, tmp_path: Path) -> None:
    _need_jax()
    agent.start(checkpoint=LONG_SIGTERM_ROUND)
    # The worker's container (the trainer itself runs on the host here, beating for it).
    containers(["--label", f"{agent.label}={agent.worker}"], ["/bin/sleep", "100000"])
    ckpt = tmp_path / "ckpt"
    proc = _run(agent, ckpt)
    try:
        assert eventually(lambda: int(agent.record().get("progress") or 0) > 20, 60), (
            agent.record(), proc.poll(), agent.log_text())
        assert agent.record()["state"] == "processing"
        code, took = agent.sigterm_and_wait(SIGTERM_EXIT_LIMIT)
        assert code == 0, agent.log_text()
        # NB: a bound between an acknowledged round (an Orbax save: seconds) and one that waited
        # out its 20 s budget.
        assert took < EARLY_ROUND_LIMIT, f"the round took {took:.1f}s\n{agent.log_text()}"
        assert agent.decisions("checkpoint-acked") == 1, agent.trail()
        # The pod is deleted: SIGTERM saves once more and ends the loop.
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    saved = re.findall(r"saved step (\d+) for request (\S+) \((\S+)\)", out)
    assert saved and saved[0][2] == "agent-sigterm", out
    assert "stopping at step" in out, out
    last = int(saved[-1][0])
    # A new run resumes from the last checkpoint (the agent is gone now: the client logs that
    # and trains on).
    again = _run(agent, ckpt, "--steps", str(last + 5))
    out2, _ = again.communicate(timeout=60)
    assert again.returncode == 0, out2
    assert f"resumed from step {last}" in out2, out2
