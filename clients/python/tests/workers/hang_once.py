"""A worker whose loop hangs once: its first run beats for a second or two, then stops calling
progress (as a deadlocked collective or a stuck data loader would) while the process lives on.
Once restarted it beats normally."""

import os
import time

from vigil_worker import Worker

runs = open("/state/runs", "a+")
runs.write("run\n")
runs.close()
first = open("/state/runs").read().count("run") == 1

with Worker(job="hang-once", interval=0.2) as w:
    step = 0
    while True:
        time.sleep(0.1)
        step += 1
        w.progress(step)
        if first and step == 15:
            print("hanging at step", step, flush=True)
            while True:  # the hang: the process is alive, the loop makes no progress
                time.sleep(3600)
