"""A worker that saves from an on_checkpoint callback (the request reaches it in a beat's
answer: the `record` checkpoint method, over the worker API socket)."""

import time

from vigil_worker import Worker

w = Worker(job="ckpt-callback", interval=0.2, checkpoint_up_to="30s")


@w.on_checkpoint
def save(request):
    print("checkpoint", request.id, request.reason, flush=True)
    time.sleep(0.5)  # the save
    with open(f"/state/saved-{request.id}", "w") as f:
        f.write(request.reason)


with w:
    step = 0
    while True:
        time.sleep(0.1)
        step += 1
        w.progress(step)
