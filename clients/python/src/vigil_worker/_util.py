"""Small helpers: durations, the protocol's word rules, the Redis key, rate-limited logging."""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from datetime import timedelta
from typing import Dict, Optional, Tuple, Union

Duration = Union[int, float, str, timedelta]

_WORD = re.compile(r"[A-Za-z0-9._-]+\Z")
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?", re.IGNORECASE)
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Duration) -> float:
    """Seconds in `value`: a number of seconds, a `timedelta`, or text such as ``"20m"``,
    ``"1h30m"``, ``"90s"``, ``"500ms"``, ``"1.5h"`` (a bare number is seconds)."""
    if isinstance(value, timedelta):
        secs = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        secs = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not text:
            raise ValueError("empty duration")
        secs, pos = 0.0, 0
        while pos < len(text):
            m = _PART.match(text, pos)
            if not m or m.end() == pos:
                raise ValueError(f"not a duration: {value!r} (e.g. '20m', '1h30m', '90s')")
            secs += float(m.group(1)) * _UNIT[(m.group(2) or "s").lower()]
            pos = m.end()
    else:
        raise TypeError(f"not a duration: {value!r}")
    if secs != secs or secs < 0 or secs == float("inf"):
        raise ValueError(f"not a duration: {value!r}")
    return secs


def format_seconds(secs: float) -> str:
    """`secs` as the protocol writes it: a decimal string, no exponent (``"1200"``, ``"2.5"``)."""
    text = f"{secs:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def valid_worker_id(worker_id: str) -> bool:
    """The agent's rule for a worker id: 1-128 characters of ``[A-Za-z0-9._-]``."""
    return 0 < len(worker_id) <= 128 and bool(_WORD.match(worker_id))


_GANG = re.compile(r"[A-Za-z0-9._/-]+\Z")


def valid_gang_id(gang: str) -> bool:
    """The agent's rule for a gang id: 1-253 characters of ``[A-Za-z0-9._/-]``."""
    return 0 < len(gang) <= 253 and bool(_GANG.match(gang))


def valid_state(state: str) -> bool:
    """The agent's rule for a state word: 1-64 characters of ``[A-Za-z0-9._-]``."""
    return 0 < len(state) <= 64 and bool(_WORD.match(state))


def status_key(prefix: str, node: str, worker_id: str) -> str:
    """The Redis key of a worker's status record, ``<prefix>:{<node>}:status:<worker>``.

    The braces are literal: ``{node}`` is a Redis Cluster hash tag, so all of a node's keys
    live in one slot."""
    return f"{prefix}:{{{node}}}:status:{worker_id}"


class Backoff:
    """Exponential backoff with jitter: `base`, doubling, capped at `cap` seconds."""

    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0

    def next_delay(self, at_least: Optional[float] = None) -> float:
        self.failures += 1
        delay: float = min(self.cap, self.base * 2.0 ** min(self.failures - 1, 16))
        delay *= random.uniform(0.5, 1.0)
        if at_least is not None:
            delay = max(delay, min(at_least, self.cap))
        return delay

    def reset(self) -> None:
        self.failures = 0


class RateLimitedLog:
    """Logs a message under `key` at most once every `every` seconds, saying how many were
    held back in between: a transport that fails on every beat must not flood the job's log."""

    def __init__(self, logger: logging.Logger, every: float = 60.0) -> None:
        self.logger = logger
        self.every = every
        self._lock = threading.Lock()
        self._seen: Dict[str, Tuple[float, int]] = {}

    def log(self, level: int, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(key, (float("-inf"), 0))
            if now - last < self.every:
                self._seen[key] = (last, held + 1)
                return
            self._seen[key] = (now, 0)
        if held:
            msg = f"{msg} ({held} more like it in the last {self.every:.0f}s)"
        self.logger.log(level, msg, *args)

    def forget(self, key: str) -> None:
        with self._lock:
            self._seen.pop(key, None)
