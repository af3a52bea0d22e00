"""vigil-worker: the worker side of Vigil.

A training loop publishes its progress (the heartbeat means progress, never mere liveness),
announces a bounded grace for long operations, and learns of checkpoint requests::

    from vigil_worker import Worker

    with Worker(job="run-42") as w:          # VIGIL_WORKER names the worker
        for step in range(steps):
            train_step()
            w.progress(step)                  # a beat, from the loop
            request = w.checkpoint_requested
            if request:
                save()
                w.checkpoint_done(request.id)

A multi-host job saves together: every rank asks :meth:`Worker.agreed_checkpoint` at the same
step, with :mod:`vigil_worker.collective`'s ``jax_share`` or ``torch_share``, and all of them get
rank 0's answer.

See docs/write-a-worker.md in the Vigil repository.
"""

from ._util import parse_duration, status_key
from .transport import (
    AgentAddress,
    ApiTransport,
    CheckpointRequest,
    RedisTransport,
    Reply,
    Transport,
    TransportError,
    agent_from_env,
    auto_transport,
    parse_agent,
)
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "AgentAddress",
    "ApiTransport",
    "CheckpointRequest",
    "RedisTransport",
    "Reply",
    "Transport",
    "TransportError",
    "Worker",
    "agent_from_env",
    "auto_transport",
    "parse_agent",
    "parse_duration",
    "status_key",
]
