"""A worker told to stop while its loop is stuck exits by itself (status 143) instead of holding
its restart for the whole stop grace; a loop that is alive, or inside an announced long
operation, is left to finish (issue 27). Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

PRELUDE = """
import signal, sys, time
from vigil_worker import Worker, Transport, Reply
class Null(Transport):
    def send(self, fields): return Reply()
    def read(self): return Reply()
w = Worker("w0", transport=Null(), interval=0.05)
w.start()
w.handle_signals(exit_after=sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "auto" else None)
for step in range(5):
    w.progress(step)
    time.sleep(0.05)
print("ready", flush=True)
"""


def run(body: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + body, *args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
    return p


def term_and_wait(p: subprocess.Popen, limit: float) -> tuple[int, str]:
    p.send_signal(signal.SIGTERM)
    try:
        code = p.wait(limit)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        pytest.fail(f"still running {limit}s after SIGTERM: {p.stderr.read() if p.stderr else ''}")
    return code, p.stderr.read() if p.stderr else ""


def test_a_stuck_loop_exits_on_sigterm_with_143() -> None:
    # The loop never calls the worker again (and never looks at stop_requested).
    p = run("while True:\n    time.sleep(3600)\n", "1s")
    code, err = term_and_wait(p, 20)
    assert code == 143, err
    assert "stuck" in err and "exiting now" in err, err


def test_a_loop_stuck_in_c_code_exits_too() -> None:
    # The main thread blocks inside C (a read that never returns and is retried after every
    # signal): Python handlers never get to run there, the wakeup fd still tells the watchdog.
    p = run("import os\nr, w = os.pipe()\nwhile True:\n    os.read(r, 1)\n", "1s")
    code, err = term_and_wait(p, 20)
    assert code == 143, err


def test_a_live_loop_is_left_to_save_and_leave() -> None:
    body = (
        "step = 5\n"
        "while not w.stop_requested:\n"
        "    w.progress(step); step += 1; time.sleep(0.05)\n"
        "for _ in range(80):\n"               # saving: 4 s of calls, longer than exit_after
        "    w.progress(step); time.sleep(0.05)\n"
        "w.close()\n"
        "print('saved', flush=True)\n"
    )
    # NB: exit_after 3 s, not 1 s: a loaded machine can stall this live loop for a second
    # between two calls, and the watchdog would take it for stuck.
    p = run(body, "3s")
    code, err = term_and_wait(p, 20)
    assert code == 0, err
    assert p.stdout is not None and "saved" in p.stdout.read()


def test_a_busy_block_s_grace_holds_the_exit_until_it_runs_out() -> None:
    # NB: the child says when it enters the block (the monotonic clock is the machine's, the
    # same in both processes): a start taken here, once "ready" is read, could come late on a
    # loaded machine and shorten the grace measured.
    body = (
        "print(time.monotonic(), flush=True)\n"
        "with w.busy('checkpoint', up_to='3s'):\n"
        "    time.sleep(3600)\n"
    )
    p = run(body, "1s")
    assert p.stdout is not None
    started = float(p.stdout.readline())
    code, err = term_and_wait(p, 20)
    assert code == 143, err
    assert time.monotonic() - started >= 2.5, "exited inside the busy block's grace"


def test_closing_the_worker_disarms_it() -> None:
    body = (
        "w.close()\n"
        "print('closed', flush=True)\n"
        "time.sleep(3)\n"                     # past exit_after, no loop any more
        "print('alive', flush=True)\n"
    )
    p = run(body, "1s")
    assert p.stdout is not None and p.stdout.readline().strip() == "closed"
    p.send_signal(signal.SIGTERM)
    code = p.wait(20)
    # SIGTERM's handler stays the worker's (a flag, no exit): the process lives on.
    assert code == 0, p.stderr.read() if p.stderr else ""
    assert "alive" in p.stdout.read()
