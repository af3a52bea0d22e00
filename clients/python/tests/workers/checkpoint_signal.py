"""A worker that polls the checkpoint flag, with SIGUSR1 (the `signal:SIGUSR1` method) and
SIGTERM handled: the signal raises the flag, the loop saves and acknowledges with the id."""

import time

from vigil_worker import Worker

with Worker(job="ckpt-signal", interval=0.2) as w:
    w.handle_signals()  # SIGTERM and SIGUSR1
    step = 0
    while not w.stop_requested:
        time.sleep(0.1)
        step += 1
        w.progress(step)
        request = w.checkpoint_requested
        if request:
            time.sleep(0.3)  # the save
            w.checkpoint_done()
            print("checkpoint", request.id, request.source, flush=True)
            with open(f"/state/saved-{request.id or 'signal'}", "w") as f:
                f.write(str(step))
