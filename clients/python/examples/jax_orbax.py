"""A JAX training loop under Vigil, with Orbax checkpoints saved when the agent asks.

    pip install ./clients/python 'jax[cpu]' orbax-checkpoint
    VIGIL_WORKER=trainer-0 python clients/python/examples/jax_orbax.py --ckpt-dir /tmp/ckpt

- The first step's XLA compile runs inside ``worker.busy("compile", up_to=...)``: the agent
  allows that much silence, and no more.
- Every step beats with its step number: a loop that hangs stops the beats.
- A checkpoint request (a preemption, host maintenance, the agent's own SIGTERM) reaches the loop
  between two steps; the callback saves with Orbax, waits until the save is durable, and only
  then is the request acknowledged (with its id).
- SIGTERM to this process (the pod being deleted) saves too, and ends the loop.
- On start, it resumes from the latest checkpoint in ``--ckpt-dir``.

Runs on CPU as is (the same code runs on GPU or TPU).
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from vigil_worker import CheckpointRequest, Worker


def make_data(key: jax.Array, n: int = 256) -> tuple:
    x = jax.random.normal(key, (n, 8))
    true_w = jnp.arange(1.0, 9.0)
    y = x @ true_w + 0.5
    return x, y


def init_state() -> dict:
    return {"params": {"w": jnp.zeros(8), "b": jnp.zeros(())}, "step": jnp.array(0, dtype=jnp.int32)}


def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    pred = x @ params["w"] + params["b"]
    return jnp.mean((pred - y) ** 2)


def train_step(state: dict, x: jax.Array, y: jax.Array) -> tuple:
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y)
    params = jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, state["params"], grads)
    return {"params": params, "step": state["step"] + 1}, loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/tmp/vigil-jax-ckpt"))
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--step-time", type=float, default=0.01, help="extra seconds per step (a real step is slower)")
    ap.add_argument("--compile-grace", default="20m")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    manager = ocp.CheckpointManager(
        os.path.abspath(args.ckpt_dir),
        options=ocp.CheckpointManagerOptions(max_to_keep=3),
    )
    state = init_state()
    latest = manager.latest_step()
    if latest is not None:
        state = manager.restore(latest, args=ocp.args.StandardRestore(state))
        print(f"resumed from step {int(state['step'])}", flush=True)
    x, y = make_data(jax.random.PRNGKey(0))

    worker = Worker(job=f"linreg-{os.path.basename(os.path.abspath(args.ckpt_dir))}",
                    checkpoint_up_to="10m")
    worker.handle_signals()  # SIGTERM (pod deleted) and SIGUSR1 (the signal checkpoint method)

    def save(request: CheckpointRequest) -> None:
        step = int(state["step"])
        manager.save(step, args=ocp.args.StandardSave(state), force=True)
        manager.wait_until_finished()  # durable before the acknowledgement
        print(f"saved step {step} for request {request.id} ({request.reason})", flush=True)

    worker.on_checkpoint(save)

    with worker:
        with worker.busy("compile", up_to=args.compile_grace):
            step_fn = jax.jit(train_step).lower(state, x, y).compile()
        loss = None
        while int(state["step"]) < args.steps and not worker.stop_requested:
            state, loss = step_fn(state, x, y)
            worker.progress(int(state["step"]))  # saves here, in the loop, when asked
            time.sleep(args.step_time)
        if worker.stop_requested:
            print(f"stopping at step {int(state['step'])}", flush=True)
        print(f"final loss {float(loss) if loss is not None else float('nan'):.6f}", flush=True)
    manager.close()


if __name__ == "__main__":
    main()
