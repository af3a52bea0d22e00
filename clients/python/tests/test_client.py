"""The client on its own (no agent): addresses, durations, and the rules that keep a training
loop safe: beats only from the loop, a transport error never raising into it, bounded retries,
Retry-After, the token read afresh, an older agent without `grace` (or another optional field:
`compute_ms`, `gang`...; tried again after a while; never `rank`), checkpoints in the loop's
thread, signals."""

from __future__ import annotations

import http.server
import json
import logging
import os
import signal
import threading
import time
from typing import Dict, Iterator, List, Mapping, Optional, Set, Tuple

import pytest

from conftest import eventually
from vigil_worker import (AgentAddress, ApiTransport, CheckpointRequest, Reply, Transport,
                          TransportError, Worker, parse_agent, parse_duration, status_key)
from vigil_worker.transport import agent_from_env


class FakeTransport(Transport):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sends: List[Tuple[float, Dict[str, str]]] = []
        self.reads = 0
        self.failing = False
        self.checkpoint: Optional[CheckpointRequest] = None
        self.warnings: Tuple[str, ...] = ()

    def send(self, fields: Mapping[str, str]) -> Reply:
        with self.lock:
            if self.failing:
                raise TransportError("down")
            self.sends.append((time.monotonic(), dict(fields)))
            if self.checkpoint and fields.get("checkpoint_ack") == self.checkpoint.id:
                self.checkpoint = None
            return Reply(checkpoint=self.checkpoint, warnings=self.warnings)

    def read(self) -> Reply:
        with self.lock:
            if self.failing:
                raise TransportError("down")
            self.reads += 1
            return Reply(checkpoint=self.checkpoint)

    def sent(self) -> List[Dict[str, str]]:
        with self.lock:
            return [f for _, f in self.sends]


# -- addresses and durations -------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("10.128.0.7", AgentAddress("http", "10.128.0.7", 9465)),
    ("10.128.0.7:9000", AgentAddress("http", "10.128.0.7", 9000)),
    ("http://127.0.0.1:9465", AgentAddress("http", "127.0.0.1", 9465)),
    ("http://agent.local", AgentAddress("http", "agent.local", 9465)),
    ("fd00::7", AgentAddress("http", "fd00::7", 9465)),
    ("[fd00::7]:9465", AgentAddress("http", "fd00::7", 9465)),
    ("unix:/run/vigil/worker.sock", AgentAddress("unix", path="/run/vigil/worker.sock")),
    ("unix:///run/vigil/worker.sock", AgentAddress("unix", path="/run/vigil/worker.sock")),
    ("/run/vigil/worker.sock", AgentAddress("unix", path="/run/vigil/worker.sock")),
])
def test_agent_addresses(text: str, expected: AgentAddress) -> None:
    assert parse_agent(text) == expected


@pytest.mark.parametrize("bad", ["", "unix:relative", "ftp://x"])
def test_bad_agent_addresses(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_agent(bad)


def test_agent_from_env_defaults_to_loopback_without_a_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VIGIL_AGENT", raising=False)
    if not os.path.exists("/run/vigil/worker.sock"):
        assert agent_from_env() == AgentAddress("http", "127.0.0.1", 9465)
    assert agent_from_env({"VIGIL_AGENT": "10.0.0.1"}) == AgentAddress("http", "10.0.0.1", 9465)


@pytest.mark.parametrize("text,secs", [
    ("20m", 1200), ("1h30m", 5400), ("90s", 90), ("500ms", 0.5), ("1.5h", 5400), ("45", 45), (2.5, 2.5)])
def test_durations(text: object, secs: float) -> None:
    assert parse_duration(text) == pytest.approx(secs)  # type: ignore[arg-type]


def test_status_key_is_the_new_layout() -> None:
    assert status_key("vigil", "gke-a-1", "trainer-0") == "vigil:{gke-a-1}:status:trainer-0"


def test_invalid_ids_and_states_are_refused_at_the_call() -> None:
    with pytest.raises(ValueError):
        Worker("bad id", transport=FakeTransport())
    w = Worker("w", transport=FakeTransport())
    with pytest.raises(ValueError):
        w.state("two words")
    for gang, size in [("a:b", None), ("", None), ("x" * 254, None), ("g", 0), ("g", 65537), ("g", True), (None, 4)]:
        with pytest.raises(ValueError):
            Worker("w", transport=FakeTransport(), gang=gang, gang_size=size)
    assert Worker("w", transport=FakeTransport(), gang="ml/run-1/0", gang_size=65536).gang_size == 65536


# -- beats come from the loop only -------------------------------------------------------------

def test_a_loop_that_stops_stops_the_beats() -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.1) as w:
        for step in range(10):
            w.progress(step)
            time.sleep(0.03)
        # NB: waited for, not slept for: a loaded machine may run the sender thread late.
        assert eventually(lambda: t.sent()[-1].get("progress") == "9", 5), t.sent()
        n, reads = len(t.sent()), t.reads
        time.sleep(0.6)  # the loop "hangs": the sender only reads (for checkpoint requests)
        # NB: the sender did run meanwhile (it read twice since), and still sent nothing.
        assert eventually(lambda: t.reads >= reads + 2, 5), t.reads
        assert len(t.sent()) == n
    assert t.sent()[-1]["state"] == "idle"


def test_progress_calls_are_coalesced_to_the_interval() -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.2) as w:
        started = time.monotonic()
        while time.monotonic() - started < 1.0:
            w.progress()
            time.sleep(0.001)
    # ~5 beats in a second, plus the first and the last: never one per call.
    assert 2 <= len(t.sent()) <= 9, len(t.sent())


def test_a_failed_beat_is_retried_only_for_retry_for_after_the_loop_made_it() -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.05, retry_for=0.8) as w:
        t.failing = True
        w.progress("last")  # then the loop hangs
        time.sleep(1.5)
        t.failing = False
        time.sleep(1.0)
        # Retrying "last" past retry_for would stamp a fresh heartbeat for a hung loop.
        assert all(f.get("progress") != "last" for f in t.sent()), t.sent()
        # After the backoff the failures set (up to a few seconds, longer than retry_for on a
        # slow machine: "next" is then dropped as too old, and flush says it was not stored),
        # the loop's next beat goes out.
        deadline = time.monotonic() + 10
        w.progress("next")
        while not w.flush(5) and time.monotonic() < deadline:
            w.progress("next")
        assert [f["progress"] for f in t.sent() if "progress" in f][-1] == "next", t.sent()


def test_a_transport_error_never_raises_into_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="vigil_worker")
    t = ApiTransport("w", agent=f"http://127.0.0.1:{_closed_port()}", timeout=0.5)
    started = time.monotonic()
    with Worker("w", transport=t, interval=0.01, timeout=0.5) as w:
        for step in range(200):
            w.progress(step)
            time.sleep(0.005)
        w.state("loading")
        with w.busy("compile", up_to="20m"):
            pass
        w.checkpoint_done("req-1")
        assert not w.flush(0.2)
    assert time.monotonic() - started < 8
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert 1 <= len(warnings) <= 3, [r.getMessage() for r in warnings]  # rate-limited


def test_without_with_the_first_call_starts_it() -> None:
    t = FakeTransport()
    w = Worker("w", transport=t, interval=0.05)
    w.state("loading")
    assert t.sent() == [{"state": "loading"}]
    w.progress(1)
    w.close()
    assert t.sent()[-1] == {"state": "idle", "progress": "1"}


def test_exit_on_an_exception_publishes_error() -> None:
    t = FakeTransport()
    with pytest.raises(RuntimeError):
        with Worker("w", transport=t):
            raise RuntimeError("boom")
    assert t.sent()[-1]["state"] == "error"


def test_busy_publishes_state_and_grace_and_restores_them() -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=10) as w:
        with w.busy("compile", up_to="20m"):
            assert t.sent()[-1] == {"state": "compile", "grace": "1200"}
            with w.busy("checkpoint", up_to="90s"):
                assert w.flush()
                assert t.sent()[-1] == {"state": "checkpoint", "grace": "90"}
            assert w.flush()
            assert t.sent()[-1] == {"state": "compile", "grace": "1200"}
        assert w.flush()
        assert t.sent()[-1] == {"state": "processing", "grace": "0"}


# -- checkpoints -----------------------------------------------------------------------------

def test_a_request_runs_the_callback_in_the_loop_thread_and_acks_with_its_id() -> None:
    t = FakeTransport()
    seen: List[Tuple[str, int]] = []
    w = Worker("w", transport=t, interval=0.05, checkpoint_up_to="5m")
    w.on_checkpoint(lambda req: seen.append((req.id or "", threading.get_ident())))
    with w:
        t.checkpoint = CheckpointRequest("req-7", "preemption", "1796000000000")
        assert eventually(lambda: w.checkpoint_requested is not None, 10)
        w.progress(1)
        assert seen == [("req-7", threading.get_ident())]
        assert w.flush()
        states = [f["state"] for f in t.sent()]
        assert "checkpoint" in states
        assert any(f.get("grace") == "300" for f in t.sent())
        assert t.sent()[-1]["checkpoint_ack"] == "req-7"
        assert w.checkpoint_requested is None
        w.progress(2)
        assert seen == [("req-7", threading.get_ident())]  # once


def test_a_polled_flag_and_an_explicit_ack() -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.05) as w:
        t.checkpoint = CheckpointRequest("req-9", "agent-sigterm")
        assert eventually(lambda: bool(w.checkpoint_requested), 10)
        req = w.checkpoint_requested
        assert req is not None and req.id == "req-9" and req.reason == "agent-sigterm"
        w.checkpoint_done(req.id)
        assert w.flush()
        assert t.sent()[-1]["checkpoint_ack"] == "req-9"
        # NB: the reads after the acknowledgement, not a fixed sleep, make the check below mean
        # something: a loaded machine may not run the sender in 0.2 s.
        reads = t.reads
        assert eventually(lambda: t.reads >= reads + 2, 5), t.reads
        assert w.checkpoint_requested is None


def test_every_rank_gets_rank_0_s_request_at_the_same_step_and_acks_it() -> None:
    """`agreed_checkpoint` is rank 0's answer on every rank: two workers (two ranks), a
    broadcast that hands every caller rank 0's bytes (what jax_share and torch_share do)."""
    t0, t1 = FakeTransport(), FakeTransport()
    w0 = Worker("rank-0", transport=t0, interval=0.05)
    w1 = Worker("rank-1", transport=t1, interval=0.05)
    with w0, w1:
        # Rank 1 learnt of the round first: no one saves until rank 0 knows too.
        t1.checkpoint = CheckpointRequest("r-1", "host-maintenance", "1796000000000")
        assert eventually(lambda: w1.checkpoint_requested is not None, 10)
        assert [w.agreed_checkpoint(lambda _: w0.checkpoint_requested.encode() if w0.checkpoint_requested else b"")
                for w in (w0, w1)] == [None, None]
        t0.checkpoint = CheckpointRequest("r-1", "host-maintenance", "1796000000000", drill=True)
        assert eventually(lambda: w0.checkpoint_requested is not None, 10)
        shared: List[bytes] = []

        def share(data: bytes) -> bytes:
            if not shared:
                shared.append(data)  # rank 0 calls first here; a collective orders nothing
            return shared[0]

        agreed = [w.agreed_checkpoint(share) for w in (w0, w1)]
        assert agreed[0] == agreed[1]
        assert agreed[0] is not None and agreed[0].id == "r-1" and agreed[0].drill
        assert agreed[0].reason == "host-maintenance"
        for w in (w0, w1):
            w.checkpoint_done(agreed[0].id)
        assert w0.flush() and w1.flush()
        assert t0.sent()[-1]["checkpoint_ack"] == t1.sent()[-1]["checkpoint_ack"] == "r-1"


def test_the_default_marker_is_a_beat_count_never_read_as_a_step() -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.01) as w:
        w.progress()
        w.progress()
        assert w.flush()
    assert [f["progress"] for f in t.sent() if "progress" in f][-1] == "beat-2"


def test_a_saved_step_is_published_and_a_bad_one_refused() -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.05) as w:
        t.checkpoint = CheckpointRequest("req-3", "preemption")
        assert eventually(lambda: w.checkpoint_requested is not None, 10)
        w.checkpoint_done("req-3", step=41200)
        assert w.flush()
        assert t.sent()[-1]["checkpoint_step"] == "41200"
        assert t.sent()[-1]["checkpoint_ack"] == "req-3"
        w.saved(41300)
        assert w.flush()
        assert t.sent()[-1]["checkpoint_step"] == "41300"
        for bad in (-1, "7", True, 1.5):
            with pytest.raises(ValueError):
                w.saved(bad)  # type: ignore[arg-type]


def test_the_compute_time_before_the_collective_goes_with_the_next_beat() -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.01) as w:
        with w.compute():
            time.sleep(0.05)
        w.progress(10)
        assert w.flush()
        took = int(t.sent()[-1]["compute_ms"])
        assert 50 <= took < 2_000, took
        w.compute_took(412)
        w.progress(11)
        assert w.flush()
        assert t.sent()[-1]["compute_ms"] == "412"
        for bad in (-1, "7", True, 1.5, 86_400_001):
            with pytest.raises(ValueError):
                w.compute_took(bad)  # type: ignore[arg-type]


def test_the_steps_since_the_last_beat_send_their_mean_compute_time() -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.01) as w:
        # NB: a send needs an update (progress): these three steps all go with the next beat.
        for ms in (10, 10, 40):
            w.compute_took(ms)
        w.progress()
        assert w.flush()
        assert t.sent()[-1]["compute_ms"] == "20", "one step alone is noise: their mean"
        w.progress()
        assert w.flush()
        assert t.sent()[-1]["compute_ms"] == "20", "no step timed since: the last mean stands"
        w.compute_took(7)
        w.progress()
        assert w.flush()
        assert t.sent()[-1]["compute_ms"] == "7"


def test_a_request_round_trips_through_bytes() -> None:
    r = CheckpointRequest("abc", "preemption", "17", source="record", drill=True)
    assert CheckpointRequest.decode(r.encode()) == r
    assert CheckpointRequest.decode(b"") is None
    from vigil_worker.transport import pending_checkpoint
    drill = pending_checkpoint({"checkpoint_request": "d1", "checkpoint_reason": "drill", "checkpoint_drill": "1"})
    assert drill is not None and drill.drill and drill.reason == "drill"
    notice = pending_checkpoint({"checkpoint_request": "n1", "checkpoint_drill": ""})
    assert notice is not None and not notice.drill
    assert len(CheckpointRequest("x" * 12, "host-maintenance", "1796000000000").encode()) < 200


@pytest.fixture
def restore_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_sigusr1_raises_the_flag_and_the_ack_names_the_record_s_request(restore_signals: None) -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.05) as w:
        w.handle_signals()
        t.checkpoint = CheckpointRequest("req-3", "preemption")  # written before the signal
        os.kill(os.getpid(), signal.SIGUSR1)
        assert w.checkpoint_requested is not None
        w.checkpoint_done()  # maybe before the record was read: the id comes from it
        assert eventually(lambda: any(f.get("checkpoint_ack") == "req-3" for f in t.sent()), 10), t.sent()
        assert not w.stop_requested


def test_sigterm_sets_stop_requested_and_needs_no_record(restore_signals: None) -> None:
    t = FakeTransport()
    with Worker("w", transport=t, interval=0.05) as w:
        w.handle_signals(signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert w.stop_requested
        req = w.checkpoint_requested
        assert req is not None and req.source == "signal" and req.id is None
        reads = t.reads
        w.checkpoint_done()
        # NB: the reads after it, not the sleep alone, make the checks below mean something (the
        # record read after such a signal is where a request would be acknowledged). A short
        # limit: the stop watchdog armed here exits this whole process (status 143) once the
        # loop has made no call for 10 s after the SIGTERM, and this test makes none.
        time.sleep(0.4)
        assert eventually(lambda: t.reads >= reads + 2, 3), t.reads
        assert w.checkpoint_requested is None
        assert not any("checkpoint_ack" in f for f in t.sent())


# -- the worker API transport against a fake agent ------------------------------------------------

class FakeAgent:
    """An HTTP server answering like the worker API: `grace` (or any field of `unknown`)
    refused as an older agent does (optionally, until it is upgraded), 503 with Retry-After on
    demand, any other refusal on demand, Authorization headers recorded; `stored`: the bodies
    answered 200."""

    def __init__(self, knows_grace: bool = True) -> None:
        self.knows_grace = knows_grace
        #: Fields this agent predates: a body carrying one is refused, naming the first, as
        #: serde's `deny_unknown_fields` does (agent/src/worker_api/body.rs).
        self.unknown: Set[str] = set()
        #: Upgraded (knows every field of `unknown`) after this many PUTs; ``None``: never.
        self.upgraded_after: Optional[int] = None
        #: A 400 every PUT gets instead, when set (a refusal of a bad value...).
        self.refusal: Optional[str] = None
        self.unavailable = 0
        self.requests: List[Tuple[float, str, Dict[str, str], Optional[str]]] = []
        self.stored: List[Dict[str, str]] = []
        #: What a GET answers (the worker's record).
        self.record: Dict[str, str] = {}
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                fields = json.loads(body)
                fake.requests.append((time.monotonic(), "PUT", fields, self.headers.get("Authorization")))
                upgraded = fake.upgraded_after is not None and len(fake.puts()) > fake.upgraded_after
                if fake.unavailable > 0:
                    fake.unavailable -= 1
                    self._answer(503, "the API server does not answer\n", {"Retry-After": "1"})
                elif fake.refusal is not None:
                    self._answer(400, fake.refusal)
                elif "grace" in fields and not fake.knows_grace:
                    self._answer(400, "body must be JSON {...}: unknown field `grace`, expected one of "
                                      "`state`, `job`, `progress`, `checkpoint_ack` at line 1 column 9\n")
                elif not upgraded and any(k in fake.unknown for k in fields):
                    name = next(k for k in fields if k in fake.unknown)
                    self._answer(400, 'body must be JSON {"state":..,"job":..,"progress":..} (strings): '
                                      f"unknown field `{name}`, expected one of `state`, `job`, "
                                      "`progress`, `checkpoint_ack`, `grace` at line 1 column 42\n")
                else:
                    fake.stored.append(fields)
                    self._answer(200, json.dumps({"heartbeat_ms": 1796000000000}))

            def do_GET(self) -> None:
                fake.requests.append((time.monotonic(), "GET", {}, self.headers.get("Authorization")))
                self._answer(200, json.dumps(fake.record))

            def _answer(self, code: int, text: str, headers: Optional[Dict[str, str]] = None) -> None:
                data = text.encode()
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def puts(self) -> List[Dict[str, str]]:
        return [f for _, m, f, _ in self.requests if m == "PUT"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_agent() -> Iterator[FakeAgent]:
    a = FakeAgent()
    yield a
    a.close()


def test_an_older_agent_without_grace_still_gets_the_beats(fake_agent: FakeAgent,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    fake_agent.knows_grace = False
    caplog.set_level(logging.WARNING, logger="vigil_worker")
    t = ApiTransport("w", agent=fake_agent.url)
    with Worker("w", transport=t, interval=0.05) as w:
        with w.busy("compile", up_to="10m"):
            pass
        w.progress(1)
        assert w.flush()
    stored = [f for f in fake_agent.puts() if "grace" not in f]
    assert any(f.get("state") == "compile" for f in stored)
    assert stored[-1]["state"] == "idle"
    assert sum("does not know the 'grace' field" in r.getMessage() for r in caplog.records) == 1


def test_an_older_agent_without_compute_ms_still_gets_the_beats(fake_agent: FakeAgent,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """An agent that predates `compute_ms` refuses every body carrying it: the field is dropped
    for the rest of the session (said once), the beat that carried it is stored without it, and
    the heartbeat goes on instead of freezing (the worker would be judged hung)."""
    fake_agent.unknown = {"compute_ms"}
    caplog.set_level(logging.WARNING, logger="vigil_worker")
    t = ApiTransport("w", agent=fake_agent.url)
    with Worker("w", transport=t, interval=0.05) as w:
        w.progress(1)
        assert w.flush()
        with w.compute():
            pass
        w.progress(2)
        assert w.flush(5), "the beat that carried compute_ms is stored, without it"
        for step in range(3, 6):
            w.compute_took(7)
            w.progress(step)
            assert w.flush(5)
    progress = [f.get("progress") for f in fake_agent.stored]
    assert all(str(step) in progress for step in range(2, 6)), progress
    assert not any("compute_ms" in f for f in fake_agent.stored)
    assert sum("compute_ms" in f for f in fake_agent.puts()) == 1, "refused once, then never sent again"
    assert t.unsupported == {"compute_ms"} and t.grace_supported
    said = [r.getMessage() for r in caplog.records if "does not know the 'compute_ms' field" in r.getMessage()]
    assert len(said) == 1, said
    assert not any("update dropped" in r.getMessage() for r in caplog.records)


def test_an_older_agent_without_ranks_refuses_a_rank_s_beats(fake_agent: FakeAgent,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """`rank` is never dropped: a rank's checkpoint ack would become the container's, which the
    agent counts as every rank's (the first rank done would end the round for all, a partial
    checkpoint with no error). An agent that predates ranks is refused, permanently, as always."""
    fake_agent.unknown = {"rank", "ranks"}
    caplog.set_level(logging.WARNING, logger="vigil_worker")
    t = ApiTransport("w", agent=fake_agent.url)
    t.rank, t.ranks = 1, 2
    with pytest.raises(TransportError) as refused:
        t.send({"state": "processing", "progress": "1"})
    assert refused.value.status == 400 and refused.value.permanent
    assert len(fake_agent.puts()) == 1 and not fake_agent.stored and not t.unsupported
    assert not any("does not know" in r.getMessage() for r in caplog.records)
    fake_agent.record = {"checkpoint_request": "r1", "ranks": "2", "checkpoint_ack@0": "r1"}
    pending = t.read().checkpoint
    assert pending is not None and pending.id == "r1", "rank 1's own ack is read, never another's"


def test_a_dropped_field_is_sent_again_after_a_while(fake_agent: FakeAgent,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The agent may be upgraded under a running worker (a DaemonSet rollout): a dropped field is
    sent again once RETRY_DROPPED_AFTER has passed since the last drop. An agent still old
    refuses it again (said once more, once per period); the upgraded one stores it."""
    from vigil_worker.transport import RETRY_DROPPED_AFTER
    fake_agent.unknown = {"compute_ms"}
    fake_agent.upgraded_after = 5  # the first five PUTs reach the old agent
    caplog.set_level(logging.WARNING, logger="vigil_worker")
    now = [1000.0]
    t = ApiTransport("w", agent=fake_agent.url)
    t.clock = lambda: now[0]

    def said() -> int:
        return sum("does not know the 'compute_ms' field" in r.getMessage() for r in caplog.records)

    t.send({"progress": "1", "compute_ms": "7"})  # PUTs 1 (refused) and 2
    assert t.unsupported == {"compute_ms"} and said() == 1
    now[0] += RETRY_DROPPED_AFTER - 1
    t.send({"progress": "2", "compute_ms": "7"})  # PUT 3: not yet
    assert t.unsupported == {"compute_ms"} and said() == 1
    now[0] += 1
    t.send({"progress": "3", "compute_ms": "7"})  # PUTs 4 (tried again, refused: still old) and 5
    assert t.unsupported == {"compute_ms"} and said() == 2, "said once more, at the retry"
    for step in (4, 5):
        now[0] += RETRY_DROPPED_AFTER / 3
        t.send({"progress": str(step), "compute_ms": "7"})  # PUTs 6, 7 (upgraded): not yet tried
    assert said() == 2, "not said again within the period"
    now[0] += RETRY_DROPPED_AFTER / 3
    t.send({"progress": "6", "compute_ms": "8"})  # PUT 8: tried again, stored
    assert not t.unsupported and t.grace_supported
    assert [f.get("compute_ms") for f in fake_agent.puts()] == ["7", None, None, "7", None, None, None, "8"]
    assert [f.get("progress") for f in fake_agent.stored] == ["1", "2", "3", "4", "5", "6"]
    assert fake_agent.stored[-1] == {"progress": "6", "compute_ms": "8"}
    assert said() == 2


def test_grace_is_tried_again_after_a_while(fake_agent: FakeAgent,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """An agent older than `grace` (its 400 worded without "(strings)"): grace_supported comes back
    after the period, and the still-old agent drops it again, said once per period."""
    from vigil_worker.transport import RETRY_DROPPED_AFTER
    fake_agent.knows_grace = False
    caplog.set_level(logging.WARNING, logger="vigil_worker")
    now = [0.0]
    t = ApiTransport("w", agent=fake_agent.url)
    t.clock = lambda: now[0]
    for _ in range(3):
        t.send({"state": "compile", "grace": "600"})
        now[0] += RETRY_DROPPED_AFTER / 4
    assert not t.grace_supported and sum("grace" in f for f in fake_agent.puts()) == 1
    now[0] += RETRY_DROPPED_AFTER / 4
    t.send({"state": "compile", "grace": "600"})
    assert not t.grace_supported and sum("grace" in f for f in fake_agent.puts()) == 2
    assert len(fake_agent.stored) == 4 and not any("grace" in f for f in fake_agent.stored)
    assert sum("does not know the 'grace' field" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("refusal", [
    'gang must be 1-253 characters of [A-Za-z0-9._/-]; got "unknown field `compute_ms`"\n',
    'body must be JSON {"state":..,"compute_ms":..} (strings): invalid type: '
    'map, expected a string; unknown field `compute_ms` at line 1 column 30\n',
    "a proxy's page: body must be JSON {} (strings): unknown field `compute_ms`, expected `state`\n",
])
def test_only_serde_s_refusal_drops_a_field(fake_agent: FakeAgent, refusal: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """A field named as unknown anywhere but where the agent's body parser says so (a worker's
    own text echoed in another 400) is not taken for a refusal of the field: the 400 stands."""
    fake_agent.refusal = refusal
    caplog.set_level(logging.WARNING, logger="vigil_worker")
    t = ApiTransport("w", agent=fake_agent.url)
    with pytest.raises(TransportError) as refused:
        t.send({"state": "processing", "gang": "unknown field `compute_ms`", "compute_ms": "7"})
    assert refused.value.status == 400 and refused.value.permanent
    assert len(fake_agent.puts()) == 1 and not t.unsupported
    assert not any("does not know" in r.getMessage() for r in caplog.records)


def test_other_refusals_still_drop_the_update(fake_agent: FakeAgent) -> None:
    """Only an optional field refused as unknown is dropped and the beat sent again: any other
    400 (a required field unknown, a bad value) stays permanent."""
    fake_agent.unknown = {"state"}
    t = ApiTransport("w", agent=fake_agent.url)
    with pytest.raises(TransportError) as refused:
        t.send({"state": "processing"})
    assert refused.value.status == 400 and refused.value.permanent
    assert len(fake_agent.puts()) == 1 and not t.unsupported


def test_retry_after_is_honoured(fake_agent: FakeAgent) -> None:
    fake_agent.unavailable = 1
    t = ApiTransport("w", agent=fake_agent.url)
    with Worker("w", transport=t, interval=0.05) as w:
        assert eventually(lambda: len(fake_agent.puts()) >= 2, 5)
        w.progress(1)
    times = [at for at, m, _, _ in fake_agent.requests if m == "PUT"]
    assert times[1] - times[0] >= 0.9, times


def test_the_token_is_read_afresh_on_every_call(fake_agent: FakeAgent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    token = tmp_path / "token"
    token.write_text("first\n")
    t = ApiTransport("w", agent=fake_agent.url, token_file=str(token))
    with Worker("w", transport=t, interval=0.05) as w:
        token.write_text("second")  # the kubelet rotated it
        w.state("loading")
        assert w.flush()
    auth = [a for _, m, _, a in fake_agent.requests if m == "PUT"]
    assert auth[0] == "Bearer first" and "Bearer second" in auth, auth


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_what_the_agent_warns_of_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 27: a grace past the agent's policy.max_grace is cut there; the worker hears it."""
    caplog.set_level("WARNING", logger="vigil_worker")
    t = FakeTransport()
    t.warnings = ("grace 2h is longer than this agent's policy.max_grace (1h)",)
    with Worker("w0", transport=t, interval=0.01) as w:
        with w.busy("compile", up_to="2h"):
            pass
        for step in range(5):
            w.progress(step)
            time.sleep(0.02)
    said = [r.getMessage() for r in caplog.records if "max_grace" in r.getMessage()]
    assert len(said) == 1, said
