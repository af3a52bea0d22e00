"""A PyTorch training loop under Vigil, saving with torch.save when the agent asks.

    pip install ./clients/python torch
    VIGIL_WORKER=trainer-0 python clients/python/examples/pytorch_loop.py --ckpt /tmp/ckpt.pt

PyTorch is not installed in Vigil's CI (it is large); this example says so and exits 0 when
`import torch` fails. Everything Vigil-specific is the same as in jax_orbax.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from vigil_worker import CheckpointRequest, Worker

try:
    import torch
    from torch import nn
except ImportError:  # pragma: no cover - depends on the environment
    print("pytorch_loop.py: PyTorch is not installed (pip install torch); nothing to run", file=sys.stderr)
    sys.exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=os.environ.get("CKPT_PATH", "/tmp/vigil-torch-ckpt.pt"))
    ap.add_argument("--steps", type=int, default=10_000)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 8)
    y = x.sum(dim=1, keepdim=True)
    step = 0
    if os.path.exists(args.ckpt):
        saved = torch.load(args.ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        step = saved["step"]
        print(f"resumed from step {step}", flush=True)

    worker = Worker(job="torch-mlp", checkpoint_up_to="5m")
    worker.handle_signals()

    @worker.on_checkpoint
    def save(request: CheckpointRequest) -> None:
        tmp = args.ckpt + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, args.ckpt)  # whole or not at all, before the acknowledgement
        print(f"saved step {step} for request {request.id}", flush=True)

    loss = torch.tensor(float("nan"))
    with worker:
        # (A torch.compile'd model would compile on its first call: wrap that call in
        # `with worker.busy("compile", up_to="20m"):`.)
        while step < args.steps and not worker.stop_requested:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            worker.progress(step)  # beats, and runs `save` here when a checkpoint is asked
    print(f"done at step {step}, loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
