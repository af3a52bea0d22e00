"""Beats appear and advance, through each transport, against the real agent and Redis."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import (NEEDS_LAYOUT, Agent, eventually, redis_client, worker_container,
                      xfail_unless)
from vigil_worker import ApiTransport, RedisTransport, Worker, status_key

WORKERS = Path(__file__).parent / "workers"


def beat_for(w: Worker, steps: int, every: float = 0.05) -> None:
    for step in range(steps):
        w.progress(step)
        time.sleep(every)


def test_api_beats_appear_and_advance_on_loopback(agent: Agent) -> None:
    agent.start()
    w = Worker(agent.worker, job="run-1", gang="ml/run-1", gang_size=4, transport=ApiTransport(agent.worker, agent=agent.api_url), interval=0.2)
    with w:
        first = agent.record()
        assert first.get("state") == "processing", first
        assert first.get("job") == "run-1", first
        # The agent's worker API takes the gang fields as they are.
        assert (first.get("gang"), first.get("gang_size")) == ("ml/run-1", "4"), first
        beat_for(w, 12)
        assert w.flush()
        second = agent.record()
        assert float(second["heartbeat"]) > float(first["heartbeat"]), (first, second)
        assert second["progress"] == "11", second
    assert agent.record()["state"] == "idle"


def test_redis_beats_appear_and_advance(agent: Agent, redis_url: str) -> None:
    """The record at the client's key, stamped with the Redis server's clock (TIME)."""
    r = redis_client(redis_url)
    key = status_key(agent.prefix, agent.node, agent.worker)
    t = RedisTransport(agent.worker, url=redis_url, node=agent.node, prefix=agent.prefix)
    with Worker(agent.worker, job="run-2", gang="run-2", gang_size=2, transport=t, interval=0.2) as w:
        first = r.hgetall(key)
        assert first["state"] == "processing" and first["job"] == "run-2", first
        assert (first["gang"], first["gang_size"]) == ("run-2", "2"), first
        beat_for(w, 12)
        assert w.flush()
        second = r.hgetall(key)
        sec, usec = r.time()
        now = sec + usec / 1e6
        assert float(first["heartbeat"]) < float(second["heartbeat"]) <= now + 0.001, (first, second, now)
        assert now - float(second["heartbeat"]) < 2, (second, now)
        assert second["progress"] == "11"
    assert r.hget(key, "state") == "idle"


def test_the_agent_reads_the_redis_record(agent: Agent, redis_url: str, agent_features: dict,
                                          request: pytest.FixtureRequest) -> None:
    xfail_unless(request, agent_features["status_layout"], NEEDS_LAYOUT)
    agent.start()
    t = RedisTransport(agent.worker, url=redis_url, node=agent.node, prefix=agent.prefix)
    with Worker(agent.worker, transport=t, interval=0.2) as w:
        beat_for(w, 5)
        assert w.flush()
        assert eventually(lambda: agent.record().get("progress") == "4", 10), agent.record()


def test_api_beats_from_inside_the_container_over_the_socket(agent: Agent, containers, tmp_path: Path) -> None:
    """The worker in its own container finds the agent's socket (/run/vigil/worker.sock) by
    itself; the agent accepts the write because the peer's cgroup names the worker's container."""
    agent.start()
    c = worker_container(containers, agent, WORKERS / "hang_once.py", state_dir=tmp_path)
    assert eventually(lambda: agent.record().get("progress", "0") not in ("", "0"), 20), (agent.record(), c.logs())
    first = agent.record()
    assert first["state"] == "processing" and first["job"] == "hang-once", first
    assert eventually(lambda: int(agent.record()["progress"]) >= int(first["progress"]) + 3, 5), c.logs()
    assert float(agent.record()["heartbeat"]) > float(first["heartbeat"])


def _worker_acl_rules(prefix: str, node: str, worker: str, password: str) -> list:
    """The worker's own user's rules, as docs/security.md ("Redis ACLs") gives them."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "security.md").read_text()
    line = next(l for l in doc.splitlines() if l.startswith("user vigil-worker-<node>-<worker-id> "))
    line = line.replace("<node>", node).replace("<worker-id>", worker).replace("<worker-password>", password)
    line = line.replace("~vigil:", f"~{prefix}:")
    return line.split()[2:]


def test_the_redis_transport_needs_only_the_documented_worker_acl(agent: Agent, redis_url: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Beats, a checkpoint request read back and its acknowledgement, as the worker's own user
    of docs/security.md: TIME, HSET and HGETALL on its own status record, nothing else."""
    caplog.set_level("WARNING", logger="vigil_worker")
    admin = redis_client(redis_url)
    user = f"vigil-worker-{agent.node}-{agent.worker}"
    admin.execute_command("ACL", "SETUSER", user,
                          *_worker_acl_rules(agent.prefix, agent.node, agent.worker, "pw"))
    try:
        url = redis_url.replace("redis://", f"redis://{user}:pw@")
        t = RedisTransport(agent.worker, url=url, node=agent.node, prefix=agent.prefix)
        key = status_key(agent.prefix, agent.node, agent.worker)
        with Worker(agent.worker, transport=t, interval=0.1) as w:
            beat_for(w, 5)
            admin.hset(key, mapping={"checkpoint_request": "req-acl", "checkpoint_reason": "preemption"})
            assert eventually(lambda: w.checkpoint_requested is not None, 10)
            w.checkpoint_done()
            assert w.flush()
        record = admin.hgetall(key)
        assert record["checkpoint_ack"] == "req-acl" and record["state"] == "idle", record
        refused = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
        assert not refused, refused
    finally:
        admin.execute_command("ACL", "DELUSER", user)
