"""`busy(..., up_to=...)` publishes a grace: the agent holds off past stale_after while it
lasts, and a worker still silent when it ends is hung and restarted.

Needs the agent's support for the record's `grace` field (policy.max_grace, issue 19): with an
agent that predates it, these run as strict expected failures (XFAIL), never skipped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (NEEDS_GRACE, NEEDS_LAYOUT, Agent, eventually, worker_container,
                      xfail_unless)

WORKERS = Path(__file__).parent / "workers"
GRACE = 8.0  # well past stale_after (2 s) + confirm_after (0.5 s) + restart_delay (2 s)


def _holds_then_expires(agent: Agent, container, entered_busy: float) -> None:
    started = container.started_at()
    # Silent inside its grace: not restarted, although its heartbeat is stale after 2 s.
    while time.monotonic() < entered_busy + GRACE - 1.0:
        assert container.started_at() == started, (
            f"restarted {time.monotonic() - entered_busy:.1f}s into a {GRACE}s grace:\n{agent.trail()}")
        time.sleep(0.25)
    assert agent.decisions("restarted") == 0, agent.trail()
    # The grace ends with the worker still silent: hung, restarted.
    assert eventually(lambda: container.started_at() != started, 25), (agent.trail(), agent.log_text())
    assert eventually(lambda: agent.decisions("restarted") == 1, 10), agent.trail()


def test_busy_grace_holds_past_stale_after_then_expires_over_the_api(
        agent: Agent, containers, tmp_path: Path, agent_features: dict, request: pytest.FixtureRequest) -> None:
    xfail_unless(request, agent_features["grace"], NEEDS_GRACE)
    agent.start()
    c = worker_container(containers, agent, WORKERS / "busy.py", state_dir=tmp_path,
                         extra=["-e", f"GRACE={GRACE:g}s"])
    assert eventually(lambda: agent.record().get("state") == "compile", 20), (agent.record(), c.logs())
    entered = time.monotonic()
    assert float(agent.record().get("grace") or 0) == GRACE, agent.record()
    _holds_then_expires(agent, c, entered)


def test_busy_grace_holds_past_stale_after_then_expires_over_redis(
        agent: Agent, containers, tmp_path: Path, redis_url: str, agent_features: dict,
        request: pytest.FixtureRequest) -> None:
    """The same with the Redis transport, the client on the host beating for a container."""
    xfail_unless(request, agent_features["grace"] and agent_features["status_layout"],
                 NEEDS_GRACE if not agent_features["grace"] else NEEDS_LAYOUT)
    agent.start()
    c = containers(["--label", f"{agent.label}={agent.worker}"], ["/bin/sleep", "100000"])
    script = (
        "import sys, time\n"
        "from vigil_worker import RedisTransport, Worker\n"
        "t = RedisTransport(sys.argv[1], url=sys.argv[2], node=sys.argv[3], prefix=sys.argv[4])\n"
        "with Worker(sys.argv[1], transport=t, interval=0.2) as w:\n"
        "    for step in range(10):\n"
        "        w.progress(step); time.sleep(0.1)\n"
        "    with w.busy('compile', up_to=sys.argv[5]):\n"
        "        time.sleep(3600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, agent.worker, redis_url, agent.node, agent.prefix,
                             f"{GRACE:g}s"], env=dict(os.environ))
    try:
        assert eventually(lambda: agent.record().get("state") == "compile", 10), agent.record()
        entered = time.monotonic()
        _holds_then_expires(agent, c, entered)
    finally:
        proc.kill()
        proc.wait()
