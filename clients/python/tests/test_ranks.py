"""Several ranks in one container (torchrun: one process per GPU), each with its own fields in
the container's record: one hung rank is not hidden by the others' beats (issue 27)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Agent, eventually, worker_container
from vigil_worker import Worker
from vigil_worker.transport import pending_checkpoint, ranked
from vigil_worker.worker import ranks_from_env

WORKERS = Path(__file__).parent / "workers"


def test_ranks_come_from_torchrun_s_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VIGIL_RANK", "VIGIL_RANKS", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_LOCALID",
                 "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    # mpirun (JAX's multi-process launcher) and Slurm say it too.
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert ranks_from_env(None, None) == (1, 4)
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_RANK")
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE")
    monkeypatch.setenv("SLURM_LOCALID", "2")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    assert ranks_from_env(None, None) == (2, 8)
    monkeypatch.delenv("SLURM_LOCALID")
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE")
    assert ranks_from_env(None, None) == (None, None)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert ranks_from_env(None, None) == (None, None), "one process per container: no ranks"
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert ranks_from_env(None, None) == (3, 8)
    monkeypatch.setenv("VIGIL_RANK", "1")
    monkeypatch.setenv("VIGIL_RANKS", "2")
    assert ranks_from_env(None, None) == (1, 2), "VIGIL_RANK wins"
    assert ranks_from_env(0, 4) == (0, 4), "the arguments win"
    for bad in ((4, 4), (0, 33), (None, 2)):
        with pytest.raises(ValueError):
            ranks_from_env(*bad)


def test_a_rank_writes_its_own_fields_and_acknowledges_for_itself() -> None:
    fields = {"state": "processing", "progress": "7", "job": "j", "heartbeat": "1.0"}
    assert ranked(fields, 2, 4) == {"state@2": "processing", "progress@2": "7", "job": "j",
                                    "heartbeat@2": "1.0", "ranks": "4"}
    assert ranked(fields, None, None) == fields
    # The agent reads rank r's compute time from `compute_ms@r` only (as the worker API writes it).
    assert ranked({"compute_ms": "5"}, 1, 2) == {"compute_ms@1": "5", "ranks": "2"}
    record = {"checkpoint_request": "r1", "checkpoint_ack@0": "r1"}
    assert pending_checkpoint(record, 0) is None
    assert pending_checkpoint(record, 1) is not None
    # As the agent counts it: the container's ack (`vigil beat --checkpoint-ack`), or every rank's,
    # ends the request for every rank.
    assert pending_checkpoint({"checkpoint_request": "r1", "checkpoint_ack": "r1"}, 1) is None
    every = {"checkpoint_request": "r1", "ranks": "2", "checkpoint_ack@0": "r1", "checkpoint_ack@1": "r1"}
    assert pending_checkpoint(every, None) is None
    assert pending_checkpoint({**every, "checkpoint_ack@1": "r0"}, None) is not None


def test_the_worker_takes_its_rank_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("VIGIL_RANK", raising=False)
    monkeypatch.delenv("VIGIL_RANKS", raising=False)
    w = Worker("w0", transport="api")
    assert (w.rank, w.ranks) == (1, 2)
    assert (w.transport.rank, w.transport.ranks) == (1, 2)


def test_one_hung_rank_of_two_restarts_the_container(agent: Agent, containers, tmp_path: Path) -> None:
    agent.start()
    c = worker_container(containers, agent, WORKERS / "two_ranks.py", state_dir=tmp_path)
    started = c.started_at()
    # Both ranks beat into the one record, each with its own fields.
    assert eventually(lambda: {"heartbeat@0", "heartbeat@1"} <= set(agent.record()), 20), (agent.record(), c.logs())
    assert agent.record().get("ranks") == "2"
    # Rank 1 hangs at step 15 while rank 0 beats on: the container is restarted all the same.
    assert eventually(lambda: c.started_at() != started, 40), (agent.record(), agent.log_text(), c.logs())
    assert eventually(lambda: agent.decisions("restarted") == 1, 10), agent.trail()
    assert "rank 1 of 2" in agent.log_text(), agent.log_text()
    # Both ranks of the new run beat again.
    assert eventually(lambda: (tmp_path / "runs").read_text().count("run") == 2, 20), c.logs()
