"""The examples run: the plain loop against the real agent (its checkpoint request saved and
acknowledged), the PyTorch one where PyTorch is installed (CI has none: it then says so and
exits 0). The JAX + Orbax example has its own test (test_jax.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import CLIENT, EARLY_ROUND_LIMIT, LONG_SIGTERM_ROUND, SIGTERM_EXIT_LIMIT, Agent, eventually

EXAMPLES = CLIENT / "examples"


def test_the_plain_loop_beats_and_saves_when_asked(agent: Agent, containers, tmp_path: Path) -> None:
    agent.start(checkpoint=LONG_SIGTERM_ROUND)
    containers(["--label", f"{agent.label}={agent.worker}"], ["/bin/sleep", "100000"])
    state = tmp_path / "state.json"
    env = dict(os.environ, VIGIL_WORKER=agent.worker, VIGIL_AGENT=agent.api_url, PYTHONUNBUFFERED="1")
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "plain_loop.py"), "--steps", "100000",
                             "--step-time", "0.05", "--state-file", str(state)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert eventually(lambda: agent.record().get("state") == "loading", 10), agent.record()
        assert eventually(lambda: int(agent.record().get("progress") or 0) > 5, 15), agent.record()
        code, took = agent.sigterm_and_wait(SIGTERM_EXIT_LIMIT)
        # NB: a bound between an acknowledged round (seconds) and one that waited out its 20 s.
        assert code == 0 and took < EARLY_ROUND_LIMIT, (took, agent.log_text())
        assert agent.decisions("checkpoint-acked") == 1, agent.trail()
        assert json.loads(state.read_text())["step"] > 5
        proc.send_signal(signal.SIGTERM)  # the pod is deleted: saves, stops
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "(agent-sigterm)" in out and "(SIGTERM)" in out, out


def test_the_pytorch_example_runs_or_says_pytorch_is_missing(tmp_path: Path) -> None:
    env = dict(os.environ, VIGIL_WORKER="torch-0", VIGIL_AGENT="127.0.0.1:1")
    env.pop("REDIS_URL", None)
    out = subprocess.run([sys.executable, str(EXAMPLES / "pytorch_loop.py"), "--steps", "20",
                          "--ckpt", str(tmp_path / "ckpt.pt")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    if importlib.util.find_spec("torch") is None:
        assert "PyTorch is not installed" in out.stderr
    else:
        assert "done at step 20" in out.stdout, out.stdout + out.stderr
