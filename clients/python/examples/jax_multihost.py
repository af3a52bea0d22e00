"""A multi-host JAX job under Vigil: every process saves the same step with Orbax when a notice
on any host (maintenance, preemption, the agent's SIGTERM) or a drill asks the job's gang.

    pip install ./clients/python 'jax[cpu]' orbax-checkpoint
    # process i of N, on its own host (its node's agent serves the worker API):
    VIGIL_WORKER=trainer python clients/python/examples/jax_multihost.py \\
        --coordinator host-0:7777 --num-processes N --process-id i \\
        --gang llama-7b-attempt-3 --ckpt-dir /shared/ckpt

- Every process beats for its own worker, naming the gang (the job's id, the same on every
  host) and its size: a notice on one host opens one round for the whole gang, with one
  request id in every member's record.
- Every `--agree-every` steps, all processes ask :meth:`Worker.agreed_checkpoint` together:
  process 0's pending request is broadcast (``multihost_utils.broadcast_one_to_all``), so they
  all decide at the same step. Orbax's save is a collective: each process writes its shards.
- Each process acknowledges (with the agreed id) only when the save is durable
  (``wait_until_finished``): the node of the notice waits until every member has.
- ``--stall-on-save`` makes this process stop before its save, as a rank stuck in I/O or a
  bad GPU would: the round is then cut short at its budget and names the members that did not
  answer (try it with ``vigil drill checkpoint --gang ...``).

Runs on CPU as is (gloo collectives between the processes).
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coordinator", required=True, help="host:port of process 0's coordination service")
    ap.add_argument("--num-processes", type=int, required=True)
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--gang", required=True, help="the job's id: the same on every process")
    ap.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/tmp/vigil-jax-multihost"))
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--step-time", type=float, default=0.02)
    ap.add_argument("--agree-every", type=int, default=1, help="steps between two agreements")
    ap.add_argument("--stall-on-save", action="store_true", help="never save: a rank stuck before its shards")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)

    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from vigil_worker import Worker
    from vigil_worker.collective import jax_share

    pid = jax.process_index()
    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharded, replicated = NamedSharding(mesh, PartitionSpec("x")), NamedSharding(mesh, PartitionSpec())
    n = 8 * jax.device_count()
    x = np.random.RandomState(0).randn(256, n).astype(np.float32)
    y = x @ np.linspace(1.0, 2.0, n, dtype=np.float32)
    X = jax.make_array_from_callback(x.shape, replicated, lambda i: x[i])
    Y = jax.make_array_from_callback(y.shape, replicated, lambda i: y[i])
    w = jax.make_array_from_callback((n,), sharded, lambda i: np.zeros(n, np.float32)[i])

    @jax.jit
    def train_step(w: jax.Array) -> jax.Array:
        # The gradient of a sharded w is an all-reduce across the processes: a real collective.
        return w - 0.05 * jax.grad(lambda w: jnp.mean((X @ w - Y) ** 2))(w)

    manager = ocp.CheckpointManager(os.path.abspath(args.ckpt_dir),
                                    options=ocp.CheckpointManagerOptions(max_to_keep=3))
    step = 0
    latest = manager.latest_step()
    if latest is not None:
        w = manager.restore(latest, args=ocp.args.StandardRestore({"w": w}))["w"]
        step = latest
        print(f"process {pid} resumed from step {step}", flush=True)

    worker = Worker(job=f"jax-{args.gang}", gang=args.gang, gang_size=args.num_processes)
    with worker:
        with worker.busy("compile", up_to="20m"):
            w = train_step(w)
        while step < args.steps:
            w = train_step(w)
            step += 1
            worker.progress(step)
            if step % args.agree_every:
                continue
            request = worker.agreed_checkpoint(jax_share)  # a collective: every process, same step
            if request is None:
                time.sleep(args.step_time)
                continue
            print(f"process {pid} saving step {step} for request {request.id} ({request.reason})", flush=True)
            if args.stall_on_save:
                time.sleep(1e9)
            with worker.busy("checkpoint", up_to="10m"):
                manager.save(step, args=ocp.args.StandardSave({"w": w}), force=True)
                manager.wait_until_finished()  # this process's shards are durable
            worker.checkpoint_done(request.id)
            print(f"process {pid} saved step {step} for request {request.id} ({request.reason})", flush=True)
    manager.close()


if __name__ == "__main__":
    main()
