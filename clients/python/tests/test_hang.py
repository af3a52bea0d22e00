"""A loop that stops calling progress is found hung, and its container restarted."""

from __future__ import annotations

from pathlib import Path

from conftest import Agent, eventually, worker_container

WORKERS = Path(__file__).parent / "workers"


def test_a_loop_that_stops_calling_progress_is_restarted(agent: Agent, containers, tmp_path: Path) -> None:
    agent.start()
    c = worker_container(containers, agent, WORKERS / "hang_once.py", state_dir=tmp_path)
    started = c.started_at()
    # It beats, then hangs at step 15: its heartbeats stop although the process lives on.
    assert eventually(lambda: agent.record().get("progress") == "15", 20), (agent.record(), c.logs())
    # stale after 2 s, confirmed 0.5 s later, restarted 2 s after that (stop grace 3 s: the
    # Python process as PID 1 ignores SIGTERM).
    assert eventually(lambda: c.started_at() != started, 30), (agent.log_text(), c.logs())
    # The trail's line follows the restart's verification.
    assert eventually(lambda: agent.decisions("restarted") == 1, 10), agent.trail()
    assert eventually(lambda: (tmp_path / "runs").read_text().count("run") == 2, 10), c.logs()
    # The restarted worker beats again from its new run.
    assert eventually(lambda: agent.record().get("state") == "processing"
                      and 0 < int(agent.record().get("progress", "0")) < 15, 15), agent.record()
    assert c.running()
    assert agent.decisions("restarted") == 1, agent.trail()  # once
