"""The worker: what a training loop calls."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import threading
import time
import types
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Set, Tuple, Type, Union

from ._stop import StopWatchdog
from ._util import (
    Backoff,
    Duration,
    RateLimitedLog,
    format_seconds,
    parse_duration,
    valid_gang_id,
    valid_state,
    valid_worker_id,
)
from .transport import (
    ApiTransport,
    CheckpointRequest,
    RedisTransport,
    Reply,
    Transport,
    TransportError,
    auto_transport,
)

log = logging.getLogger("vigil_worker")

CheckpointCallback = Callable[[CheckpointRequest], Any]

#: The longest text kept in `job` and `progress` (the agent keeps 256 bytes).
MAX_FIELD = 256


class Worker:
    """One worker's status, published from its training loop.

    ``with Worker() as w:`` publishes ``state=processing`` (the first beat) and, on exit,
    ``idle`` (or ``error`` when an exception leaves the block). Inside, the loop calls
    :meth:`progress` once per step: **each beat comes from the loop**. A background thread
    only forwards what the loop produced (so the loop never waits on the network) and retries a
    failed send for at most `retry_for` seconds after the loop produced it: a loop that hangs
    stops the heartbeats, which is what lets Vigil find it.

    A transport error never raises into the loop: it is logged (rate-limited, logger
    ``vigil_worker``), retried with backoff, and the loop goes on.

    Arguments:
        worker_id: the worker id (the container's or pod's ``vigil.worker`` label); default
            ``VIGIL_WORKER``.
        job: what it works on (shown in alerts): the job, not one attempt of it (a new
            ``job`` starts its run of fruitless restarts over).
        gang: the distributed job this worker is one member of: the same id on every rank of
            it, on every node (1-253 characters of ``[A-Za-z0-9._/-]``; e.g. the job's name
            and its launch attempt). Shown in alerts.
        gang_size: how many members the gang has (1 to 65536), with ``gang``.
        transport: a :class:`~vigil_worker.Transport`, ``"api"``, ``"redis"``, or ``None`` for
            :func:`~vigil_worker.auto_transport` (``REDIS_URL`` set: Redis; else the worker API).
        interval: the least time between two heartbeats (progress calls in between are
            coalesced into the next). State changes, grace and acknowledgements go at once.
        retry_for: how long after the loop produced an update a failed send of it is retried.
        timeout: the bound on each network call, and on the waits of :meth:`start`,
            :meth:`busy` and :meth:`close` for their update to be delivered.
        checkpoint_up_to: the grace announced while the :meth:`on_checkpoint` callbacks save
            (e.g. ``"5m"``); ``None``: none (the save is then bounded by ``stale_after``).
        state: the state :meth:`start` publishes (``processing``).
    """

    def __init__(
        self,
        worker_id: Optional[str] = None,
        job: Optional[str] = None,
        transport: Union[Transport, str, None] = None,
        *,
        interval: float = 1.0,
        retry_for: float = 30.0,
        timeout: float = 2.0,
        checkpoint_up_to: Optional[Duration] = None,
        state: str = "processing",
        rank: Optional[int] = None,
        ranks: Optional[int] = None,
        gang: Optional[str] = None,
        gang_size: Optional[int] = None,
    ) -> None:
        worker_id = worker_id or os.environ.get("VIGIL_WORKER", "").strip()
        if not worker_id:
            raise ValueError("no worker id: pass worker_id= or set VIGIL_WORKER (the value of the vigil.worker label)")
        if not valid_worker_id(worker_id):
            raise ValueError(f"invalid worker id {worker_id!r}: 1-128 characters of [A-Za-z0-9._-]")
        if not valid_state(state):
            raise ValueError(f"invalid state {state!r}: 1-64 characters of [A-Za-z0-9._-]")
        if gang is not None and not valid_gang_id(gang):
            raise ValueError(f"invalid gang {gang!r}: 1-253 characters of [A-Za-z0-9._/-]")
        if gang_size is not None and (gang is None or isinstance(gang_size, bool) or not isinstance(gang_size, int) or not 1 <= gang_size <= 65536):
            raise ValueError(f"invalid gang_size {gang_size!r}: a whole number from 1 to 65536, with gang=")
        self.id = worker_id
        self.gang, self.gang_size = gang, gang_size
        if transport is None:
            self.transport: Transport = auto_transport(worker_id, timeout=timeout)
        elif transport == "api":
            self.transport = ApiTransport(worker_id, timeout=timeout)
        elif transport == "redis":
            self.transport = RedisTransport(worker_id, timeout=timeout)
        elif isinstance(transport, Transport):
            self.transport = transport
        else:
            raise TypeError(f"transport must be a Transport, 'api', 'redis' or None, not {transport!r}")
        self.rank, self.ranks = ranks_from_env(rank, ranks)
        self.transport.rank, self.transport.ranks = self.rank, self.ranks
        self.interval = float(interval)
        self.retry_for = float(retry_for)
        self.timeout = float(timeout)
        self._checkpoint_up_to = None if checkpoint_up_to is None else parse_duration(checkpoint_up_to)
        self._initial_state = state

        self._cond = threading.Condition(threading.RLock())
        # What the loop last said. `_version` counts the loop's updates; `_delivered` is the
        # last version done with (stored, or dropped: too old, or refused for good); `_stored`
        # the last the transport stored.
        self._state = state
        self._job: Optional[str] = _field(job) if job is not None else None
        self._progress: Optional[str] = None
        self._grace: Optional[str] = None  # None: never used (not sent); "0": cleared
        self._ack: Optional[str] = None
        self._checkpoint_step: Optional[str] = None
        self._compute_ms: Optional[str] = None
        # The steps' compute times since the last beat sent (their mean goes with the next).
        self._compute_sum = 0
        self._compute_n = 0
        self._version = 0
        self._delivered = 0
        self._stored = 0
        self._urgent = False
        self._produced_at = 0.0
        self._last_send = float("-inf")
        self._not_before = 0.0
        self._attempts = 0
        self._counter = 0
        self._backoff = Backoff()
        self._rl = RateLimitedLog(log)
        self._failing = False
        self._warned: Set[str] = set()

        # Checkpoints.
        self._request: Optional[CheckpointRequest] = None
        self._signal_request: Optional[CheckpointRequest] = None
        self._ack_next_seen_until = 0.0
        self._acked: Deque[str] = collections.deque(maxlen=16)
        self._callbacks: List[CheckpointCallback] = []
        self._in_callback = False
        self._poll_now = False
        self._signals_installed = False
        self._watchdog: Optional[StopWatchdog] = None
        self._stop_requested = False
        # The loop's rhythm, for the stop watchdog (`_stop.py`): its last call, the longest gap
        # between two calls, and the end of the grace of the busy block it is in (0: none).
        self._last_call = time.monotonic()
        self._calls = 0
        self._longest_gap = 0.0
        self._busy_until = 0.0

        self._thread: Optional[threading.Thread] = None
        self._started = False
        self._stopping = False
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "Worker":
        """Publish the initial state (the first beat) and start forwarding; waits up to
        `timeout` for that first beat to be delivered."""
        with self._cond:
            if self._thread is not None:
                return self
            self._started = True
            self._stopping = False
            self._closed = False
            self._thread = threading.Thread(target=self._run, name=f"vigil-worker-{self.id}", daemon=True)
            self._update(state=self._initial_state, urgent=True)
            self._thread.start()
        self.flush()
        return self

    def close(self, state: str = "idle") -> None:
        """Publish `state` (``idle``; ``error`` for a failure) and stop forwarding, after
        waiting up to `timeout` for that last update to be delivered."""
        with self._cond:
            if self._thread is None:
                return
            if self._grace not in (None, "0"):
                self._grace = "0"
            self._update(state=state, urgent=True)
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        thread.join(self.timeout + 0.5)
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        with self._cond:
            self._closed = True
            self._thread = None
            self._cond.notify_all()
        self.transport.close()

    def __enter__(self) -> "Worker":
        return self.start()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[types.TracebackType],
    ) -> None:
        failed = exc_type is not None and issubclass(exc_type, Exception)
        self.close("error" if failed else "idle")

    # -- what the loop says ----------------------------------------------------------------

    def progress(self, step: Any = None) -> None:
        """A beat from the training loop: `step` is the progress marker (a step, a batch, an
        offset; anything that changes as work advances; ``None``: a counter kept here,
        published as ``beat-<n>``). A whole number is read by the agent as a step: where a
        restart resumes, to tell a restart that helps from one that does not.

        Cheap (no I/O here): call it every step. When a checkpoint was requested and callbacks
        are registered (:meth:`on_checkpoint`), they run here, in the loop's thread."""
        if self._thread is None and not self._started:
            self.start()  # used without `with` or start(): the first call starts it
        self._called()
        with self._cond:
            if step is None:
                self._counter += 1
                # NB: not a bare number: the count starts again in every process, and the
                # agent reads a number as the step a restart resumes from.
                marker = f"beat-{self._counter}"
            else:
                marker = _field(step)
            self._update(progress=marker)
        self._dispatch()

    @contextlib.contextmanager
    def compute(self) -> Iterator["Worker"]:
        """Time the step's own work, before its collective (the forward and backward pass,
        before the gradients' all-reduce): the mean over the steps since the last beat is
        published as the record's ``compute_ms`` with the next beat (one step's time alone is
        noise: a page fault, a stop of the process). In a gang that slows down, the rank that
        computes longest is the one every other rank waits for; Vigil names it in its ``slow``
        page (``gang.pace``).

        ``with w.compute(): loss = step_fn(batch)`` then the collective, then ``w.progress(step)``.
        Cheap (no I/O here)."""
        started = time.monotonic()
        try:
            yield self
        finally:
            took = max(0, round((time.monotonic() - started) * 1000))
            with self._cond:
                self._compute_sum += min(took, 86_400_000)
                self._compute_n += 1

    def compute_took(self, ms: int) -> None:
        """A step's compute time measured elsewhere (a step callback), in whole
        milliseconds: counted as :meth:`compute` counts it (the mean of the steps since the
        last beat is published)."""
        if isinstance(ms, bool) or not isinstance(ms, int) or not 0 <= ms <= 86_400_000:
            raise ValueError(f"invalid compute time {ms!r}: whole milliseconds, at most a day")
        with self._cond:
            self._compute_sum += ms
            self._compute_n += 1

    def state(self, state: str) -> None:
        """Publish a state word: ``processing``, ``idle``, ``error``, or any other (``loading``,
        ``compile``, ...), bounded by the agent's ``stale_after`` like ``processing``; see
        :meth:`busy` for long operations."""
        if not valid_state(state):
            raise ValueError(f"invalid state {state!r}: 1-64 characters of [A-Za-z0-9._-]")
        if self._thread is None and not self._started:
            self._initial_state = state
            self.start()  # the first call starts it, with this state
            return
        self._called()
        with self._cond:
            self._update(state=state, urgent=True)
        self._dispatch()

    @property
    def current_state(self) -> str:
        return self._state

    @property
    def job(self) -> Optional[str]:
        """What the worker works on (shown in alerts); setting it publishes it."""
        return self._job

    @job.setter
    def job(self, value: Optional[str]) -> None:
        with self._cond:
            self._update(job=_field(value) if value is not None else "", urgent=True)

    @contextlib.contextmanager
    def busy(self, state: str = "busy", up_to: Optional[Duration] = None) -> Iterator["Worker"]:
        """A long operation that beats seldom or never (an XLA compile, a checkpoint save, a
        model load): publishes ``state=<state>`` and ``grace=<up_to in seconds>`` (the agent
        honours it up to its ``policy.max_grace``), waits up to `timeout` for that to be
        stored, and restores the previous state (grace cleared) when the block ends. A worker
        still silent when the grace ends is hung.

        ``with worker.busy("compile", up_to="20m"): step = jax.jit(f).lower(x).compile()``"""
        if not valid_state(state):
            raise ValueError(f"invalid state {state!r}: 1-64 characters of [A-Za-z0-9._-]")
        grace = None if up_to is None else format_seconds(parse_duration(up_to))
        self._called()
        before_busy = self._busy_until
        if up_to is not None:
            self._busy_until = time.monotonic() + parse_duration(up_to)
        with self._cond:
            before_state, before_grace = self._state, self._grace
            self._update(state=state, grace=grace if grace is not None else before_grace, urgent=True)
        self.flush()
        try:
            yield self
        finally:
            self._busy_until = before_busy
            self._last_call = time.monotonic()
            with self._cond:
                # The outer grace again (nested busy blocks), else "0": cleared.
                restored = before_grace
                if restored is None and self._grace is not None:
                    restored = "0"
                self._update(state=before_state, grace=restored, urgent=True)

    # -- checkpoints -----------------------------------------------------------------------

    @property
    def checkpoint_requested(self) -> Optional[CheckpointRequest]:
        """The unacknowledged checkpoint request (truthy), or ``None``. A loop that polls it
        saves and then calls :meth:`checkpoint_done` with its id."""
        with self._cond:
            return self._request or self._signal_request

    @property
    def stop_requested(self) -> bool:
        """True once SIGTERM arrived (with :meth:`handle_signals`): save and leave the loop."""
        return self._stop_requested

    def checkpoint_done(self, request_id: Optional[str] = None, step: Optional[int] = None) -> None:
        """Acknowledge a checkpoint: sets ``checkpoint_ack`` to the request's id (`request_id`,
        default: the pending request's). When the request came as a signal whose record was
        not read yet, the request the record shows next is acknowledged. `step`: the step the
        checkpoint holds (also :meth:`saved`)."""
        if step is not None:
            self.saved(step)
        with self._cond:
            if request_id is None:
                pending = self._request or self._signal_request
                request_id = pending.id if pending else None
            self._signal_request = None
            if request_id is None:
                self._ack_next_seen_until = time.monotonic() + self.retry_for
                self._poll_now = True
                self._cond.notify_all()
                return
            self._acked.append(request_id)
            if self._request is not None and self._request.id == request_id:
                self._request = None
            self._update(ack=request_id, urgent=True)

    def saved(self, step: int) -> None:
        """A checkpoint of `step` is durable (any save, asked for or not): published as the
        record's ``checkpoint_step``. Vigil stops restarting a worker whose restarts bring no
        progress past where it stopped; the checkpoint step tells it where that is when the
        progress marker is no number."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"invalid checkpoint step {step!r}: a whole number")
        with self._cond:
            self._checkpoint_step = str(step)
            self._update(urgent=True)

    def agreed_checkpoint(self, share: Callable[[bytes], bytes]) -> Optional[CheckpointRequest]:
        """The checkpoint request of the job's first rank, the same on every rank: a collective.

        A multi-host job saves together (Orbax, ``torch.distributed.checkpoint``: every process
        writes its shards at the same step), but each rank learns of a request on its own beat,
        at its own step. Call this at the same point of the same steps on every rank (e.g. every
        step, or every 10th): `share(data)` must return the first rank's `data` on every rank
        (:func:`vigil_worker.collective.jax_share`, :func:`~vigil_worker.collective.torch_share`).
        Every rank then gets the same answer at the same step: save when it is not ``None``, and
        acknowledge with :meth:`checkpoint_done` (its ``id``) once this rank's shards are
        durable. A gang's round writes one id to every member, so each rank's acknowledgement
        answers its own record.

        The agreement follows the first rank's record only: a request that reaches the other
        ranks but not the first (its node's Redis write failed) is not saved for; the round then
        ends at its budget naming every rank, as it would without the agreement."""
        mine = self.checkpoint_requested
        agreed = share(mine.encode() if mine is not None else b"")
        return CheckpointRequest.decode(bytes(agreed))

    def on_checkpoint(self, callback: CheckpointCallback) -> CheckpointCallback:
        """Register `callback(request)`: it runs in the loop's thread, from :meth:`progress` or
        :meth:`state`, when a checkpoint is requested; when every callback returned, the request
        is acknowledged with its id. An exception from a callback is not caught: the request
        then stays unacknowledged. Usable as a decorator."""
        self._callbacks.append(callback)
        return callback

    def handle_signals(self, *signals: Union[int, str, signal.Signals],
                       exit_after: Optional[Duration] = None) -> None:
        """Opt in to signals (default SIGTERM and SIGUSR1; call from the main thread): each one
        raises a checkpoint request for the loop, and SIGTERM also sets :attr:`stop_requested`.
        For the ``signal:SIGUSR1`` checkpoint method, and to save when the pod is deleted.
        A Python handler installed before is still called; the default action is not.

        A loop that is stuck when SIGTERM comes never acts on it: then the process exits by
        itself (status 143) once the loop has made no call for `exit_after` (default: twice the
        longest gap between its calls so far, at least 10 s; never inside a :meth:`busy` block
        whose grace still runs), so a restart is not held for the whole stop grace."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("handle_signals must be called from the main thread")
        wanted = signals or (signal.SIGTERM, signal.SIGUSR1)
        for sig in wanted:
            signum = _signum(sig)
            previous = signal.getsignal(signum)
            signal.signal(signum, self._make_handler(signum, previous))
        if signal.SIGTERM in {_signum(s) for s in wanted} and self._watchdog is None:
            limit = None if exit_after is None else parse_duration(exit_after)
            self._watchdog = StopWatchdog(self._loop_idle, limit)
            self._watchdog.install()
        self._signals_installed = True

    def _called(self) -> None:
        """The loop called: its rhythm, for the stop watchdog. The first call's gap (imports,
        loading before the loop) and a busy block's are not the loop's rhythm."""
        now = time.monotonic()
        if self._calls > 0 and now >= self._busy_until:
            self._longest_gap = max(self._longest_gap, now - self._last_call)
        self._calls += 1
        self._last_call = now

    def _loop_idle(self) -> "tuple[float, bool, float]":
        now = time.monotonic()
        return now - self._last_call, now < self._busy_until, self._longest_gap

    def _make_handler(self, signum: int, previous: Any) -> Callable[[int, Any], None]:
        name = signal.Signals(signum).name

        def handler(sig: int, frame: Any) -> None:
            # NB: plain assignments only (no lock): the handler runs between two bytecodes of
            # the main thread, which may hold the worker's lock. The sender looks every 0.2 s.
            if self._signal_request is None:
                self._signal_request = CheckpointRequest(id=None, reason=name, source="signal")
            if signum == signal.SIGTERM:
                self._stop_requested = True
            self._poll_now = True
            if callable(previous):
                previous(sig, frame)

        return handler

    def _dispatch(self) -> None:
        if not self._callbacks or self._in_callback:
            return
        request = self.checkpoint_requested
        if request is None:
            return
        self._in_callback = True
        try:
            up_to = self._checkpoint_up_to
            with self.busy("checkpoint", up_to=up_to):
                for callback in list(self._callbacks):
                    callback(request)
            self.checkpoint_done(request.id)
        finally:
            self._in_callback = False

    # -- delivery --------------------------------------------------------------------------

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait (up to `timeout`, default the worker's) until what the loop said so far is
        stored, or a send of it failed. True when stored. Never raises."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._cond:
            target, attempts = self._version, self._attempts
            while self._delivered < target and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0 or (self._attempts > attempts and self._failing):
                    break
                self._cond.wait(left)
            # NB: stored, not merely done with: an update dropped as too old (a backoff that
            # outlasted `retry_for`) or refused for good was never stored.
            return self._stored >= target

    def _update(
        self,
        state: Optional[str] = None,
        job: Optional[str] = None,
        progress: Optional[str] = None,
        grace: Optional[str] = None,
        ack: Optional[str] = None,
        urgent: bool = False,
    ) -> None:
        # Called with the lock held, from the loop's own calls only.
        if state is not None:
            self._state = state
        if job is not None:
            self._job = job
        if progress is not None:
            self._progress = progress
        if grace is not None:
            self._grace = grace
        if ack is not None:
            self._ack = ack
        self._version += 1
        self._produced_at = time.monotonic()
        if urgent:
            self._urgent = True
        if urgent or self._produced_at - self._last_send >= self.interval:
            self._cond.notify_all()

    def _fields(self) -> Dict[str, str]:
        """The record to send (under the lock, at a send): the steps' compute times since the
        last send become one mean."""
        if self._compute_n:
            self._compute_ms = str(round(self._compute_sum / self._compute_n))
            self._compute_sum, self._compute_n = 0, 0
        fields = {"state": self._state}
        if self._job is not None:
            fields["job"] = self._job
        if self.gang is not None:
            fields["gang"] = self.gang
            if self.gang_size is not None:
                fields["gang_size"] = str(self.gang_size)
        if self._progress is not None:
            fields["progress"] = self._progress
        if self._grace is not None:
            fields["grace"] = self._grace
        if self._ack is not None:
            fields["checkpoint_ack"] = self._ack
        if self._checkpoint_step is not None:
            fields["checkpoint_step"] = self._checkpoint_step
        if self._compute_ms is not None:
            fields["compute_ms"] = self._compute_ms
        return fields

    def _run(self) -> None:
        next_poll = time.monotonic() + self.interval
        while True:
            with self._cond:
                action, snapshot, version = self._next_action(next_poll)
                if action == "exit":
                    return
            if action == "send":
                self._send(snapshot, version)
                next_poll = time.monotonic() + self.interval
            else:
                self._poll()
                next_poll = time.monotonic() + self.interval

    def _next_action(self, next_poll: float) -> Tuple[str, Dict[str, str], int]:
        while True:
            if self._closed:
                return "exit", {}, 0
            now = time.monotonic()
            pending = self._delivered < self._version
            wait = float("inf")
            if pending and now - self._produced_at > self.retry_for:
                # Too old to send: the loop has said nothing since. Sending it now would
                # stamp a fresh heartbeat for a loop that may be hung.
                self._rl.log(logging.WARNING, "dropped",
                             "vigil: dropped an update not delivered within %.0fs (%s)",
                             self.retry_for, self.transport.describe())
                self._delivered = self._version
                self._urgent = False
                self._cond.notify_all()
                continue
            if pending:
                due = max(self._not_before, self._last_send + (0.0 if self._urgent else self.interval))
                if now >= due:
                    self._urgent = False
                    return "send", self._fields(), self._version
                wait = due - now
            elif self._stopping:
                return "exit", {}, 0
            if self._poll_now or now >= max(next_poll, self._not_before):
                self._poll_now = False
                return "poll", {}, 0
            wait = min(wait, max(next_poll, self._not_before) - now)
            if self._signals_installed:
                wait = min(wait, 0.2)
            self._cond.wait(max(0.0, wait))

    def _send(self, fields: Dict[str, str], version: int) -> None:
        self._last_send = time.monotonic()
        try:
            reply = self.transport.send(fields)
        except Exception as e:  # never into the loop
            self._failed(e, "send")
            return
        with self._cond:
            self._attempts += 1
            self._delivered = max(self._delivered, version)
            self._stored = max(self._stored, version)
            if self._ack is not None and fields.get("checkpoint_ack") == self._ack:
                self._ack = None  # stored: later beats need not carry it
            self._succeeded()
            self._take(reply)
            self._cond.notify_all()

    def _poll(self) -> None:
        try:
            reply = self.transport.read()
        except Exception as e:
            self._failed(e, "read")
            return
        with self._cond:
            self._succeeded()
            self._take(reply)
            self._cond.notify_all()

    def _failed(self, e: Exception, what: str) -> None:
        with self._cond:
            self._attempts += 1
            self._failing = True
            permanent = isinstance(e, TransportError) and e.permanent
            if permanent:
                # The same fields would be refused again: drop them (the next update from the
                # loop is sent afresh).
                self._rl.log(logging.ERROR, "permanent", "vigil: %s refused, update dropped: %s", what, e)
                if what == "send":
                    self._delivered = self._version
                self._cond.notify_all()
                return
            retry_after = e.retry_after if isinstance(e, TransportError) else None
            delay = self._backoff.next_delay(retry_after)
            self._not_before = time.monotonic() + delay
            if not isinstance(e, TransportError):
                e = TransportError(f"{type(e).__name__}: {e}")
            self._rl.log(logging.WARNING, "failed",
                         "vigil: %s failed (%s), retrying in %.1fs: %s",
                         what, self.transport.describe(), delay, e)
            self._cond.notify_all()

    def _succeeded(self) -> None:
        if self._failing:
            self._failing = False
            log.info("vigil: %s reached again after %d failures", self.transport.describe(), self._backoff.failures)
            self._rl.forget("failed")
        self._backoff.reset()
        self._not_before = 0.0

    def _take(self, reply: Reply) -> None:
        for warning in reply.warnings:
            if warning not in self._warned:
                self._warned.add(warning)
                log.warning("vigil: the agent says: %s", warning)
        request = reply.checkpoint
        now = time.monotonic()
        if request is not None and request.id in self._acked:
            request = None  # our acknowledgement is on its way (or stored since this read)
        if request is not None and self._ack_next_seen_until > now:
            # Acknowledged by the loop before we learnt its id (a signal).
            self._ack_next_seen_until = 0.0
            self._acked.append(request.id or "")
            self._update(ack=request.id, urgent=True)
            request = None
        elif self._ack_next_seen_until > now:
            self._ack_next_seen_until = 0.0  # no request behind that signal (a plain SIGTERM)
        if request is not None and self._signal_request is not None:
            self._signal_request = None
        if request != self._request:
            if request is not None:
                log.info("vigil: checkpoint requested (%s, reason %s)", request.id, request.reason or "-")
            self._request = request


#: The most ranks the agent reads in one container's record.
MAX_RANKS = 32


def ranks_from_env(rank: Optional[int], ranks: Optional[int]) -> "tuple[Optional[int], Optional[int]]":
    """This process's rank in its container, and how many there are: as given, else
    ``VIGIL_RANK``/``VIGIL_RANKS``, else the launcher's local rank and size when the container
    runs more than one process — torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, and for JAX (or
    anything) started by ``mpirun`` Open MPI's ``OMPI_COMM_WORLD_LOCAL_RANK``/``_LOCAL_SIZE`` or
    by Slurm ``SLURM_LOCALID``/``SLURM_NTASKS_PER_NODE``. ``(None, None)``: the container's one
    process (JAX's usual one process per host)."""
    def env_int(name: str) -> Optional[int]:
        text = os.environ.get(name, "").strip()
        return int(text) if text.isdigit() else None

    if rank is None and ranks is None:
        rank, ranks = env_int("VIGIL_RANK"), env_int("VIGIL_RANKS")
    launchers = (("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
                 ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                 ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"))
    for rank_var, size_var in launchers:
        if rank is not None or ranks is not None:
            break
        local = env_int(size_var)
        if local is not None and local > 1:
            rank, ranks = env_int(rank_var), local
    if rank is None and ranks is None:
        return None, None
    if rank is None or ranks is None or not (0 <= rank < ranks <= MAX_RANKS):
        raise ValueError(f"rank {rank!r} of ranks {ranks!r}: give both, 0 <= rank < ranks <= {MAX_RANKS}")
    return rank, ranks


def _field(value: Any) -> str:
    text = str(value)
    return text if len(text) <= MAX_FIELD else text[: MAX_FIELD - 1] + "…"


def _signum(sig: Union[int, str, signal.Signals]) -> int:
    if isinstance(sig, str):
        name = sig.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        return int(getattr(signal, name))
    return int(sig)
