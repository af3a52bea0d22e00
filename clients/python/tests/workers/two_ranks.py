"""Two ranks in one container, as torchrun starts them (one process per GPU, LOCAL_RANK and
LOCAL_WORLD_SIZE in each one's environment). On the first run rank 1 hangs at step 15 while rank
0 goes on beating; once restarted both beat normally."""

import os
import subprocess
import sys
import time

if os.environ.get("LOCAL_RANK") is None:
    runs = open("/state/runs", "a+")
    runs.write("run\n")
    runs.close()
    procs = [subprocess.Popen([sys.executable, __file__],
                              env=dict(os.environ, LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2"))
             for r in range(2)]
    for p in procs:
        p.wait()
    sys.exit(0)

from vigil_worker import Worker  # noqa: E402

rank = int(os.environ["LOCAL_RANK"])
first = open("/state/runs").read().count("run") == 1
with Worker(job="two-ranks", interval=0.2) as w:
    assert w.rank == rank and w.ranks == 2, (w.rank, w.ranks)
    step = 0
    while True:
        time.sleep(0.1)
        step += 1
        w.progress(step)
        if first and rank == 1 and step == 15:
            print("rank 1 hanging at step", step, flush=True)
            while True:
                time.sleep(3600)
