"""A checkpoint request reaches the loop, the acknowledgement carries its id, and the ack ends
the round early: SIGTERM to the agent runs a round, and the agent exits well before its budget
(`LONG_SIGTERM_ROUND`: checkpoint.sigterm_budget = 20 s, checkpoint.grace = 22 s)."""

from __future__ import annotations

from pathlib import Path

from conftest import (EARLY_ROUND_LIMIT, LONG_SIGTERM_ROUND, SIGTERM_EXIT_LIMIT, Agent, eventually,
                      redis_client, worker_container)

WORKERS = Path(__file__).parent / "workers"


def _round_ends_early(agent: Agent) -> None:
    code, took = agent.sigterm_and_wait(SIGTERM_EXIT_LIMIT)
    assert code == 0, agent.log_text()
    # NB: a bound between an acknowledged round (seconds) and one that waited out its 20 s.
    assert took < EARLY_ROUND_LIMIT, (f"the round took {took:.1f}s: the acknowledgement did not end it\n"
                                      f"{agent.log_text()}")
    assert agent.decisions("checkpoint-acked") == 1, agent.trail()
    assert agent.decisions("checkpoint-timed-out") == 0, agent.trail()


def test_a_checkpoint_request_reaches_the_callback_and_the_ack_ends_the_round(
        agent: Agent, containers, tmp_path: Path) -> None:
    agent.start(checkpoint=LONG_SIGTERM_ROUND)
    c = worker_container(containers, agent, WORKERS / "checkpoint_callback.py", state_dir=tmp_path)
    assert eventually(lambda: int(agent.record().get("progress") or 0) > 3, 20), (agent.record(), c.logs())
    _round_ends_early(agent)
    saved = list(tmp_path.glob("saved-*"))
    assert len(saved) == 1, (saved, c.logs())
    assert saved[0].read_text() == "agent-sigterm"
    request = saved[0].name[len("saved-"):]
    # The agent is gone: read the record from Redis, under whichever layout it wrote.
    r = redis_client(agent.redis_url)
    keys = [k for k in r.scan_iter(f"{agent.prefix}:*") if k.endswith(f":{agent.worker}")]
    record = r.hgetall(keys[0])
    assert record["checkpoint_request"] == request and record["checkpoint_ack"] == request, record


def test_a_sigusr1_checkpoint_raises_the_polled_flag_and_the_ack_ends_the_round(
        agent: Agent, containers, tmp_path: Path) -> None:
    agent.start(checkpoint=LONG_SIGTERM_ROUND)
    c = worker_container(containers, agent, WORKERS / "checkpoint_signal.py", state_dir=tmp_path,
                         extra=["--label", f"{agent.label}.checkpoint=signal:SIGUSR1"])
    assert eventually(lambda: int(agent.record().get("progress") or 0) > 3, 20), (agent.record(), c.logs())
    _round_ends_early(agent)
    assert list(tmp_path.glob("saved-*")), c.logs()
    assert "checkpoint" in c.logs()
