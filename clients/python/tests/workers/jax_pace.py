"""One rank of a two-process JAX job on CPU (gloo collectives) that steps as fast as it can: each
step computes on its own (timed with ``Worker.compute``) and then meets the other process in an
all-gather, so both run at the slower one's pace — a synchronous collective, as data-parallel
training is. Its argv: coordinator, process id, gang."""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

coordinator, pid, gang = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(coordinator, 2, pid)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from vigil_worker import Worker  # noqa: E402

a = np.random.RandomState(pid).rand(256, 256)
with Worker(job=f"pace-{gang}", gang=gang, gang_size=2, interval=0.2) as w:
    step = 0
    while True:
        with w.compute():
            # The rank's own work: CPU-bound, so a throttled process takes longer over it.
            for _ in range(12):
                a = np.tanh(a @ a.T / 256.0)
        multihost_utils.process_allgather(np.array([step]))  # the collective: both wait here
        step += 1
        w.progress(step)
