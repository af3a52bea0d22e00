"""A worker that enters a long operation with a grace (`GRACE`, e.g. "8s") and never comes
back from it on its first run; once restarted it beats normally. It exits at once on SIGTERM,
so a restart is quick."""

import os
import signal
import time

from vigil_worker import Worker

signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
runs = open("/state/runs", "a+")
runs.write("run\n")
runs.close()
first = open("/state/runs").read().count("run") == 1

with Worker(job="busy", interval=0.2) as w:
    for step in range(10):
        time.sleep(0.1)
        w.progress(step)
    if first:
        with w.busy("compile", up_to=os.environ["GRACE"]):
            print("compiling, silent", flush=True)
            while True:  # a compile that never ends
                time.sleep(3600)
    step = 0
    while True:
        time.sleep(0.1)
        step += 1
        w.progress(step)
