"""A worker that is told to stop while its loop is stuck exits, instead of holding its restart for
the whole stop grace.

Why it is needed: a restart (Vigil's, Docker's, the kubelet's) sends SIGTERM, waits the stop
grace (30 s by default), then SIGKILL. A loop stuck in a collective or a dead data loader never
acts on SIGTERM; once :meth:`Worker.handle_signals` has replaced Python's default action (exit)
with a flag for the loop, the process ignores SIGTERM altogether — and so does a Python process
that is PID 1 without ``--init``. Every restart then takes the whole grace.

How: Python runs a signal's handler only between two bytecodes of the main thread, never while
that thread is inside C code (NCCL, a blocked read). But the C-level handler writes the signal's
number to the *wakeup fd* at once. This watchdog owns that fd and reads it on a thread of its
own: after a SIGTERM, when the loop has made no call to the worker for ``exit_after`` (and is not
inside a :meth:`Worker.busy` block whose grace still runs), the process exits with status 143,
as SIGTERM's default action would have.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable, Optional

log = logging.getLogger("vigil_worker")

#: The least silence after a SIGTERM that counts as "stuck", whatever the loop's rhythm.
MIN_EXIT_AFTER = 10.0


class StopWatchdog:
    """Exits the process when SIGTERM came and the loop is stuck (see the module's text).

    `idle` says how long the loop has made no call and whether a busy block's grace still
    runs; `exit_after` is the silence that counts as stuck (``None``: twice the longest gap
    between the loop's calls so far, at least :data:`MIN_EXIT_AFTER`)."""

    def __init__(self, idle: Callable[[], "tuple[float, bool, float]"], exit_after: Optional[float],
                 exit: Callable[[int], None] = os._exit) -> None:
        self._idle = idle
        self._exit_after = exit_after
        self._exit = exit
        self._term_at: Optional[float] = None
        self._read_fd = -1
        self._write_fd = -1
        self._stopped = False

    def install(self) -> bool:
        """Take the signal wakeup fd (from the main thread) and start watching. False when
        someone else holds it (an asyncio loop in the main thread): said once, nothing done."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:
            os.close(r)
            os.close(w)
            raise RuntimeError("handle_signals must be called from the main thread") from None
        if previous != -1:
            signal.set_wakeup_fd(previous)
            os.close(r)
            os.close(w)
            log.warning("vigil: the signal wakeup fd is in use (an asyncio loop?): a loop stuck outside "
                        "Python will not exit on SIGTERM by itself; run the container with --init "
                        "and do not install SIGTERM handlers there")
            return False
        self._read_fd, self._write_fd = r, w
        threading.Thread(target=self._run, name="vigil-stop-watchdog", daemon=True).start()
        return True

    def stop(self) -> None:
        """Disarm: the worker closed (its loop is over; what the process does next is not a
        training loop's). Gives the wakeup fd back when called from the main thread."""
        self._stopped = True
        if threading.current_thread() is not threading.main_thread() or self._write_fd < 0:
            return
        previous = signal.set_wakeup_fd(-1)
        if previous != self._write_fd:  # pragma: no cover - someone else's since: give it back
            signal.set_wakeup_fd(previous)
            return
        # Ours no more: closing it ends the watching thread's read (EOF).
        os.close(self._write_fd)
        self._write_fd = -1

    def limit(self, longest_gap: float) -> float:
        if self._exit_after is not None:
            return self._exit_after
        return max(MIN_EXIT_AFTER, 2.0 * longest_gap)

    def _run(self) -> None:
        while self._term_at is None and not self._stopped:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data:
                os.close(self._read_fd)
                return
            if int(signal.SIGTERM) in data:
                self._term_at = time.monotonic()
        while not self._stopped:
            idle, busy, longest_gap = self._idle()
            limit = self.limit(longest_gap)
            since_term = time.monotonic() - self._term_at
            # A loop silent this long is stuck, whether it went silent before the SIGTERM or
            # after it; one inside an announced long operation (busy) is not, until its grace
            # runs out.
            if not busy and idle >= limit:
                log.error("vigil: SIGTERM %.0fs ago and the training loop has made no call for %.0fs: "
                          "it is stuck; exiting now (status 143) so that its restart is not held for the "
                          "whole stop grace", since_term, idle)
                for handler in logging.getLogger().handlers + log.handlers:
                    try:
                        handler.flush()
                    except Exception:  # pragma: no cover - best effort
                        pass
                self._exit(128 + int(signal.SIGTERM))
                return
            time.sleep(0.2)
