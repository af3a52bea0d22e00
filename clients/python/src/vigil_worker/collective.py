"""Sharing the first rank's checkpoint request with every rank: the `share` functions of
:meth:`vigil_worker.Worker.agreed_checkpoint`, one per framework. Each is a collective: every
process of the job calls it at the same point, and every one gets process 0's bytes back.

The frameworks are imported when called, so this module costs nothing to a job without them.
"""

from __future__ import annotations

from typing import Any, Optional

#: The most bytes a request takes (its JSON is about 150).
MAX_BYTES = 1024


def jax_share(data: bytes) -> bytes:
    """Process 0's `data`, on every JAX process (``multihost_utils.broadcast_one_to_all``: a
    fixed-size ``uint8`` array, so every process compiles the same broadcast). Only process 0's
    bytes travel; every process takes part whatever its own. Process 0's bytes over
    :data:`MAX_BYTES` raise :class:`ValueError` on every process, after the broadcast (never on
    one process alone, which would leave the others waiting in it)."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    buf = np.zeros(MAX_BYTES + 2, dtype=np.uint8)
    if jax.process_index() == 0:
        if len(data) > MAX_BYTES:
            buf[0] = buf[1] = 0xFF  # too long: said to every process
        else:
            buf[0], buf[1] = len(data) >> 8, len(data) & 0xFF
            buf[2:2 + len(data)] = np.frombuffer(data, dtype=np.uint8)
    out = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    n = int(out[0]) << 8 | int(out[1])
    if n > MAX_BYTES:
        raise ValueError(f"process 0's request is over {MAX_BYTES} bytes")
    return bytes(out[2:2 + n].tolist())


def torch_share(data: bytes, group: Optional[Any] = None) -> bytes:
    """Rank 0's `data`, on every rank of `group` (default: the world) of ``torch.distributed``
    (``broadcast_object_list``)."""
    import torch.distributed as dist

    box = [data]
    dist.broadcast_object_list(box, src=0, group=group)
    return bytes(box[0])
