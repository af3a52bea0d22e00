"""The smallest worker: a loop that beats, a slow start announced with a grace, and a
checkpoint saved when the agent asks. Standard library only.

    pip install ./clients/python
    VIGIL_WORKER=trainer-0 python clients/python/examples/plain_loop.py

Where the agent is, the client finds by itself: VIGIL_AGENT (a host or IP, as the downward API's
status.hostIP gives it; a URL; or unix:/path), else the host's /run/vigil/worker.sock when it is
mounted, else http://127.0.0.1:9465. With REDIS_URL (and NODE_NAME) it writes to Redis instead
(pip install './clients/python[redis]').
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

from vigil_worker import Worker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--state-file", default=os.environ.get("STATE_FILE", "/tmp/plain-loop.json"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)

    step = 0
    if os.path.exists(args.state_file):
        with open(args.state_file) as f:
            step = json.load(f)["step"]
        print(f"resumed from step {step}", flush=True)

    with Worker(job="plain-loop") as worker:
        worker.handle_signals()  # SIGTERM: save and stop; SIGUSR1: the signal checkpoint method
        with worker.busy("loading", up_to="2m"):
            time.sleep(1.0)  # loading data, building the model: silent, but announced

        while step < args.steps and not worker.stop_requested:
            time.sleep(args.step_time)  # one training step
            step += 1
            worker.progress(step)  # the heartbeat: from the loop, so a hung loop stops it

            request = worker.checkpoint_requested
            if request:
                with open(args.state_file, "w") as f:
                    json.dump({"step": step}, f)
                worker.checkpoint_done(request.id)  # the acknowledgement carries the id
                print(f"saved step {step} ({request.reason or request.source})", flush=True)
    print(f"done at step {step}", flush=True)


if __name__ == "__main__":
    main()
