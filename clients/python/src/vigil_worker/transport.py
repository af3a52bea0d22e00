"""How a worker's status reaches Vigil: the agent's worker API (HTTP over TCP or its unix
socket), or Redis directly.

A transport is called from the worker's sender thread only, never from the training loop, and
every call is bounded by its timeout. It raises :class:`TransportError` on failure; the
:class:`~vigil_worker.Worker` logs it, backs off and retries, and the loop goes on.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Set, Tuple, Union
from urllib.parse import quote, urlsplit

from ._util import status_key, valid_worker_id

log = logging.getLogger("vigil_worker")

#: The agent's worker API port.
DEFAULT_PORT = 9465
#: Where a Docker/Podman host's agent serves the worker API to its containers.
DEFAULT_SOCKET = "/run/vigil/worker.sock"
#: Where the pod spec of docs/kubernetes.md mounts the projected token (audience `vigil`).
DEFAULT_TOKEN_FILE = "/var/run/secrets/vigil/token"
#: The record fields of a checkpoint request.
CHECKPOINT_FIELDS = ("checkpoint_request", "checkpoint_reason", "checkpoint_requested_at", "checkpoint_drill",
                     "checkpoint_ack")


@dataclass(frozen=True)
class CheckpointRequest:
    """A checkpoint the agent asked for.

    `id` is what the acknowledgement must carry. It is ``None`` only for a request that arrived
    as a signal (:meth:`Worker.handle_signals`) before its record was read; acknowledging that
    one acknowledges the request the record then shows (none, for a plain SIGTERM)."""

    id: Optional[str]
    reason: str = ""
    requested_at: Optional[str] = None
    #: ``"record"`` (read from the status record or a beat's answer) or ``"signal"``.
    source: str = "record"
    #: A drill (``vigil drill checkpoint``): save exactly as for a notice (that is what is
    #: measured), but the node is not going away: train on.
    drill: bool = False

    def encode(self) -> bytes:
        """The request as bytes, for a collective to share (:meth:`Worker.agreed_checkpoint`)."""
        return json.dumps({"id": self.id, "reason": self.reason, "requested_at": self.requested_at,
                           "source": self.source, "drill": self.drill}, separators=(",", ":")).encode()

    @staticmethod
    def decode(data: bytes) -> "Optional[CheckpointRequest]":
        """What :meth:`encode` made (``None`` for empty bytes: no request)."""
        if not data:
            return None
        d = json.loads(data.decode())
        return CheckpointRequest(id=d.get("id"), reason=d.get("reason") or "", requested_at=d.get("requested_at"),
                                 source=d.get("source") or "record", drill=bool(d.get("drill")))


@dataclass(frozen=True)
class Reply:
    """What a transport learnt from the agent (or Redis) on a send or a read."""

    #: The unacknowledged checkpoint request, if any.
    checkpoint: Optional[CheckpointRequest] = None
    #: The heartbeat the agent stamped (worker API only), in milliseconds.
    heartbeat_ms: Optional[int] = None
    #: What the agent wants the worker to know (e.g. a grace cut to its policy.max_grace).
    warnings: Tuple[str, ...] = ()


class TransportError(Exception):
    """A send or read that did not reach the agent (or Redis), or that it refused."""

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
        permanent: bool = False,
    ) -> None:
        super().__init__(message)
        #: The HTTP status, when there was an answer.
        self.status = status
        #: How long the agent asked us to wait (``Retry-After``).
        self.retry_after = retry_after
        #: True when sending the same fields again cannot succeed (a bad field, a body too
        #: large): the update is dropped instead of retried.
        self.permanent = permanent


#: The fields that are a rank's own in a container of several ranks (``state@3``...); ``job``,
#: ``gang``, ``gang_size``, ``checkpoint_step`` and ``ranks`` are the container's. The agent reads
#: rank r's ``compute_ms`` from ``compute_ms@r`` only, as the worker API writes it.
RANK_FIELDS = ("state", "progress", "grace", "checkpoint_ack", "compute_ms", "heartbeat")

#: The fields of a beat that an older agent may not know (its body parser refuses an unknown
#: field with a 400), and what the worker goes without when the agent does not: the worker API
#: transport then drops the field, says so once, and sends the same beat again without it, so
#: the heartbeat goes on; it tries the field again after :data:`RETRY_DROPPED_AFTER`.
#: ``rank`` and ``ranks`` are not among them: without them each rank's checkpoint ack would be
#: the container's, which the agent counts as every rank's (the first rank to finish would end
#: the round for all), so an agent that predates ranks refuses such a worker's every beat, as it
#: always did (docs/upgrading.md).
OPTIONAL_FIELDS: Dict[str, str] = {
    "grace": "long operations are bounded by its policy.stale_after",
    "compute_ms": "a gang that slows down is not told which rank it waits for",
    "checkpoint_step": "restarts are not told from the steps of the last durable checkpoint",
    "gang": "this worker is judged and restarted on its own, not with its gang",
    "gang_size": "the gang's size is not known to the agent",
}
#: The fields that cannot go without another: dropped with it (``gang_size`` is the size of
#: ``gang``).
_DROPPED_WITH = {"gang": ("gang_size",)}
#: How long the dropped fields stay dropped (seconds since the last drop) before the next beat
#: sends them again. The agent is upgraded under running workers (a DaemonSet rollout): without
#: a retry, a field dropped for an old agent would stay dropped for the whole run against the new
#: one. Ten minutes puts the fields back within minutes of a rollout, while an agent that is
#: still old costs one refused request and one warning per dropped field every ten minutes.
RETRY_DROPPED_AFTER = 600.0
#: serde's refusal of an unknown field as the agent words it, from the start of its 400 (every
#: release: ``body must be JSON {...} (strings): unknown field `grace`, expected ...``; ``{...}:``
#: without ``(strings)`` before grace): the field named anywhere else (a worker's own value
#: echoed in another refusal) is not taken for it.
_UNKNOWN_FIELD = re.compile(rb"\Abody must be JSON \{[^{}\n]*\}(?: \(strings\))?: unknown field `([A-Za-z0-9_@]+)`")


def rank_field(field: str, rank: Optional[int]) -> str:
    """The record field of `rank` for `field` (``state@3``); the field itself without a rank."""
    return field if rank is None else f"{field}@{rank}"


def ranked(fields: Mapping[str, str], rank: Optional[int], ranks: Optional[int]) -> Dict[str, str]:
    """`fields` as a rank writes them into the container's record."""
    if rank is None:
        return dict(fields)
    out = {rank_field(k, rank) if k in RANK_FIELDS else k: v for k, v in fields.items()}
    if ranks is not None:
        out["ranks"] = str(ranks)
    return out


def pending_checkpoint(record: Mapping[str, Optional[str]], rank: Optional[int] = None) -> Optional[CheckpointRequest]:
    """The request in a status record when it is not acknowledged yet: by this rank (for a rank
    of a container of several), or as the agent counts it acknowledged (the container's
    ``checkpoint_ack``, or every rank's ``checkpoint_ack@r``) — the agent's own rule."""
    request = record.get("checkpoint_request") or ""
    if not request or record.get(rank_field("checkpoint_ack", rank)) == request:
        return None
    if record.get("checkpoint_ack") == request:
        return None
    try:
        ranks = int(record.get("ranks") or "")
    except ValueError:
        ranks = 0
    if 0 < ranks <= 32 and all(record.get(f"checkpoint_ack@{r}") == request for r in range(ranks)):
        return None
    return CheckpointRequest(
        id=request,
        reason=record.get("checkpoint_reason") or "",
        requested_at=record.get("checkpoint_requested_at") or None,
        drill=(record.get("checkpoint_drill") or "") == "1",
    )


class Transport:
    """The interface of a transport. Subclasses implement :meth:`send` and :meth:`read`."""

    #: Whether the receiving end stores the ``grace`` field (an agent that predates it refuses
    #: it; the API transport then drops it and says so once, as it does any field of
    #: :data:`OPTIONAL_FIELDS`: see :attr:`ApiTransport.unsupported`).
    grace_supported: bool = True
    #: This process's rank in a container of several (torchrun: one per GPU), and how many
    #: there are; ``None``: the container's one process. Set by :class:`Worker`.
    rank: Optional[int] = None
    ranks: Optional[int] = None

    def send(self, fields: Mapping[str, str]) -> Reply:
        """Write `fields` into the worker's record and stamp its heartbeat (the Redis clock, or
        the agent's); the unacknowledged checkpoint request comes back in the reply."""
        raise NotImplementedError

    def read(self) -> Reply:
        """Read the worker's record without writing anything (no heartbeat)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""

    def describe(self) -> str:
        return type(self).__name__


# ---------------------------------------------------------------------------------------------
# The agent's worker API


class _UnixHTTPConnection(http.client.HTTPConnection):
    """`http.client` over a unix stream socket (the agent's `worker_api.socket`)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("vigil", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class AgentAddress:
    """Where the agent's worker API is: a unix socket path, or an HTTP(S) host and port."""

    scheme: str  # "unix", "http" or "https"
    host: str = ""
    port: int = DEFAULT_PORT
    path: str = ""  # the socket's path ("unix"), or a base path prefix ("http")

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def parse_agent(value: str) -> AgentAddress:
    """Read `VIGIL_AGENT`: ``unix:/path`` (or an absolute path), a full ``http://HOST:PORT``
    URL, or a bare host or IP (the node's ``status.hostIP``), which means
    ``http://HOST:9465``. A bare IPv6 address is accepted as the downward API writes it."""
    text = value.strip()
    if not text:
        raise ValueError("empty agent address")
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise ValueError(f"unix socket path must be absolute: {value!r}")
        return AgentAddress("unix", path=path)
    if text.startswith("/"):
        return AgentAddress("unix", path=text)
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"agent URL must be http://HOST[:PORT]: {value!r}")
        port = parts.port or (DEFAULT_PORT if parts.scheme == "http" else 443)
        return AgentAddress(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))
    if text.count(":") > 1 and not text.startswith("["):
        return AgentAddress("http", text, DEFAULT_PORT)  # a bare IPv6 address
    parts = urlsplit("http://" + text)
    if not parts.hostname:
        raise ValueError(f"not an agent address: {value!r}")
    return AgentAddress("http", parts.hostname, parts.port or DEFAULT_PORT)


def agent_from_env(env: Optional[Mapping[str, str]] = None) -> AgentAddress:
    """The agent this worker should talk to: `VIGIL_AGENT` when set; otherwise the host's
    unix socket when it is mounted (a Docker/Podman host), else ``http://127.0.0.1:9465``
    (a single-user host)."""
    env = os.environ if env is None else env
    value = env.get("VIGIL_AGENT", "").strip()
    if value:
        return parse_agent(value)
    if os.path.exists(DEFAULT_SOCKET):
        return AgentAddress("unix", path=DEFAULT_SOCKET)
    return AgentAddress("http", "127.0.0.1", DEFAULT_PORT)


def _retry_after(value: Optional[str]) -> Optional[float]:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class ApiTransport(Transport):
    """The agent's worker API: ``PUT``/``GET /v1/workers/<id>/status``.

    `agent`: an address as :func:`parse_agent` reads it (default: :func:`agent_from_env`).
    `token_file`: the projected ServiceAccount token (audience ``vigil``) sent as a bearer
    token, read afresh on every call because the kubelet rotates it (default:
    `VIGIL_TOKEN_FILE`, else ``/var/run/secrets/vigil/token`` when it exists; never for a
    unix socket unless given: there the container is the identity).
    """

    def __init__(
        self,
        worker_id: str,
        agent: Optional[Union[str, AgentAddress]] = None,
        token_file: Optional[str] = None,
        timeout: float = 2.0,
    ) -> None:
        if not valid_worker_id(worker_id):
            raise ValueError(f"invalid worker id {worker_id!r}: 1-128 characters of [A-Za-z0-9._-]")
        self.worker_id = worker_id
        if agent is None:
            self.agent = agent_from_env()
        elif isinstance(agent, AgentAddress):
            self.agent = agent
        else:
            self.agent = parse_agent(agent)
        env_token = os.environ.get("VIGIL_TOKEN_FILE", "").strip()
        self._token_explicit = bool(token_file or env_token)
        if token_file or env_token:
            self.token_file: Optional[str] = token_file or env_token
        elif self.agent.scheme != "unix":
            self.token_file = DEFAULT_TOKEN_FILE
        else:
            self.token_file = None
        self.timeout = timeout
        self.grace_supported = True
        #: The fields of :data:`OPTIONAL_FIELDS` the agent refused as unknown (an older
        #: agent): not sent, until :data:`RETRY_DROPPED_AFTER` has passed since the last drop.
        self.unsupported: Set[str] = set()
        #: The clock of that period (seconds, monotonic); a test sets its own.
        self.clock: Callable[[], float] = time.monotonic
        self._dropped_at: Optional[float] = None
        self._path = f"{self.agent.path if self.agent.scheme != 'unix' else ''}/v1/workers/{quote(worker_id, safe='')}/status"
        self._conn: Optional[http.client.HTTPConnection] = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        shown = self.token_file and (self._token_explicit or os.path.exists(self.token_file))
        auth = f", token {self.token_file}" if shown else ""
        return f"worker API at {self.agent}{auth}"

    def _connection(self) -> Tuple[http.client.HTTPConnection, bool]:
        if self._conn is not None:
            return self._conn, True
        a = self.agent
        conn: http.client.HTTPConnection
        if a.scheme == "unix":
            conn = _UnixHTTPConnection(a.path, self.timeout)
        elif a.scheme == "https":
            conn = http.client.HTTPSConnection(a.host, a.port, timeout=self.timeout)
        else:
            conn = http.client.HTTPConnection(a.host, a.port, timeout=self.timeout)
        self._conn = conn
        return conn, False

    def _token(self) -> Optional[str]:
        if not self.token_file:
            return None
        try:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            if self._token_explicit:
                # The agent will answer 401 and the worker retries: the kubelet may not have
                # mounted the token yet.
                log.debug("vigil: cannot read the token file %s: %s", self.token_file, e)
            return None
        return token or None

    def _request(self, method: str, body: Optional[bytes]) -> Tuple[int, Dict[str, str], bytes]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        with self._lock:
            for attempt in (0, 1):
                conn, reused = self._connection()
                try:
                    conn.request(method, self._path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read(1 << 20)
                    answer = {k.lower(): v for k, v in resp.getheaders()}
                    if resp.will_close:
                        self._drop()
                    return resp.status, answer, data
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                    # A kept-alive connection the agent closed meanwhile: once more, afresh.
                    self._drop()
                    if reused and attempt == 0:
                        continue
                    raise TransportError(f"{self.agent}: {e}") from e
                except (OSError, http.client.HTTPException) as e:
                    self._drop()
                    raise TransportError(f"{self.agent}: {type(e).__name__}: {e}") from e
        raise AssertionError("unreachable")

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # pragma: no cover - closing is best effort
                pass
            self._conn = None

    def _check(self, status: int, headers: Mapping[str, str], data: bytes) -> Dict[str, Any]:
        text = data.decode("utf-8", "replace").strip()
        if status == 200:
            try:
                parsed = json.loads(text) if text else {}
            except ValueError as e:
                raise TransportError(f"{self.agent}: answer is not JSON: {text[:200]!r}") from e
            return parsed if isinstance(parsed, dict) else {}
        why = {
            401: "not authenticated (is the projected token with audience 'vigil' mounted, and VIGIL_TOKEN_FILE right?)",
            403: "refused: this caller is not this worker (does the pod/container carry the agent's opt-in label, runtime.worker_label, with this id?)",
            429: "not reviewed: too many refused tokens came from this address (or node) lately; retrying after Retry-After",
            503: "the agent cannot check or store it now",
        }.get(status, "refused")
        permanent = status in (400, 404, 405, 413)
        raise TransportError(
            f"{self.agent}: {status} {why}: {text[:300]}",
            status=status,
            retry_after=_retry_after(headers.get("retry-after")),
            permanent=permanent,
        )

    def send(self, fields: Mapping[str, str]) -> Reply:
        body = dict(fields)
        if self.rank is not None:
            body["rank"] = str(self.rank)
            if self.ranks is not None:
                body["ranks"] = str(self.ranks)
        self._retry_dropped()
        if not self.grace_supported:
            body.pop("grace", None)
        for name in self.unsupported:
            body.pop(name, None)
        while True:
            if not body:
                return Reply()
            status, headers, data = self._request("PUT", json.dumps(body).encode())
            unknown = self._unknown_field(status, data, body)
            if unknown is not None:
                # An agent that predates this field: it refuses every body that carries it, so
                # every later beat would be refused and the worker judged hung. Dropped (until
                # the retry), said once; the beat itself goes on without it.
                self._drop_field(unknown)
                for name in (unknown, *_DROPPED_WITH.get(unknown, ())):
                    body.pop(name, None)
                continue
            answer = self._check(status, headers, data)
            hb = answer.get("heartbeat_ms")
            warnings = answer.get("warnings")
            return Reply(
                checkpoint=pending_checkpoint({k: _str(answer.get(k)) for k in CHECKPOINT_FIELDS}),
                heartbeat_ms=hb if isinstance(hb, int) else None,
                warnings=tuple(str(w) for w in warnings) if isinstance(warnings, list) else (),
            )

    @staticmethod
    def _unknown_field(status: int, data: bytes, body: Mapping[str, str]) -> Optional[str]:
        """The optional field of `body` that a 400 refused as unknown (serde's ``unknown field
        `compute_ms`, expected one of ...``), or ``None``: any other answer stands."""
        if status != 400:
            return None
        match = _UNKNOWN_FIELD.search(data)
        name = match.group(1).decode() if match else ""
        return name if name in OPTIONAL_FIELDS and name in body else None

    def _retry_dropped(self) -> None:
        """Send the dropped fields again once :data:`RETRY_DROPPED_AFTER` has passed since the
        last drop (the agent may have been upgraded). An agent that still refuses one drops it
        again at once: each field is dropped, and warned of, at most once per period, as a field
        is only dropped again after a retry, and a retry only comes a period after every drop."""
        if self._dropped_at is None or self.clock() - self._dropped_at < RETRY_DROPPED_AFTER:
            return
        log.info("vigil: sending the fields the agent at %s did not know again (%s): it may have "
                 "been upgraded", self.agent, ", ".join(sorted(self.unsupported)))
        self.unsupported.clear()
        self.grace_supported = True
        self._dropped_at = None

    def _drop_field(self, name: str) -> None:
        dropped = [name, *(f for f in _DROPPED_WITH.get(name, ()) if f not in self.unsupported)]
        self.unsupported.update(dropped)
        self._dropped_at = self.clock()
        if name == "grace":
            self.grace_supported = False
        also = f" (and {', '.join(repr(f) for f in dropped[1:])} with it)" if len(dropped) > 1 else ""
        log.warning(
            "vigil: the agent at %s does not know the '%s' field (an older agent): beats go on "
            "without it%s, tried again every %d minutes; %s", self.agent, name, also,
            RETRY_DROPPED_AFTER // 60, OPTIONAL_FIELDS[name])

    def read(self) -> Reply:
        status, headers, data = self._request("GET", None)
        if status == 404:
            return Reply()
        record = self._check(status, headers, data)
        return Reply(checkpoint=pending_checkpoint({k: _str(v) for k, v in record.items()}, self.rank))

    def close(self) -> None:
        with self._lock:
            self._drop()


def _str(v: Any) -> Optional[str]:
    return None if v is None else str(v)


# ---------------------------------------------------------------------------------------------
# Redis


class RedisTransport(Transport):
    """Redis directly (needs ``pip install 'vigil-worker[redis]'``): the record
    ``<prefix>:{<node>}:status:<worker>``, the heartbeat stamped with the Redis server's clock
    (``TIME``, never this machine's).

    `url`: default `REDIS_URL`. `node`: default `NODE_NAME`. `prefix`: default
    `VIGIL_KEY_PREFIX`, else ``vigil``. `client`: an existing ``redis.Redis`` to use instead
    (its responses decoded, or bytes: both are read).
    """

    def __init__(
        self,
        worker_id: str,
        url: Optional[str] = None,
        node: Optional[str] = None,
        prefix: Optional[str] = None,
        timeout: float = 2.0,
        client: Any = None,
    ) -> None:
        if not valid_worker_id(worker_id):
            raise ValueError(f"invalid worker id {worker_id!r}: 1-128 characters of [A-Za-z0-9._-]")
        node = node or os.environ.get("NODE_NAME", "").strip()
        if not node:
            raise ValueError("RedisTransport needs the node name: NODE_NAME (the downward API's spec.nodeName) or node=")
        prefix = prefix or os.environ.get("VIGIL_KEY_PREFIX", "").strip() or "vigil"
        self.worker_id = worker_id
        self.node = node
        self.key = status_key(prefix, node, worker_id)
        if client is None:
            url = url or os.environ.get("REDIS_URL", "").strip()
            if not url:
                raise ValueError("RedisTransport needs REDIS_URL (or url=)")
            try:
                import redis  # type: ignore[import-not-found,import-untyped,unused-ignore]
            except ImportError as e:
                raise ImportError(
                    "RedisTransport needs the redis package: pip install 'vigil-worker[redis]'"
                ) from e
            client = redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                decode_responses=True,
            )
        self._r = client
        self._url = _redact(url or "")

    def describe(self) -> str:
        return f"Redis {self._url} key {self.key}"

    def _call(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as e:  # redis.RedisError, OSError, timeouts: all are transport errors
            raise TransportError(f"Redis {what} {self.key}: {type(e).__name__}: {e}") from e

    # NB: only TIME, HSET and HGETALL, the commands the worker user of docs/security.md ("Redis
    # ACLs") may run: no MULTI/EXEC (the pipeline is not a transaction), no HMGET.
    def send(self, fields: Mapping[str, str]) -> Reply:
        sec, usec = self._call("TIME", self._r.time)
        mapping = dict(fields)
        mapping["heartbeat"] = f"{int(sec)}.{int(usec):06d}"
        mapping = ranked(mapping, self.rank, self.ranks)

        def write() -> Any:
            pipe = self._r.pipeline(transaction=False)
            pipe.hset(self.key, mapping=mapping)
            pipe.hgetall(self.key)
            return pipe.execute()

        _, record = self._call("HSET", write)
        return Reply(checkpoint=pending_checkpoint(_decoded(record), self.rank))

    def read(self) -> Reply:
        record = self._call("HGETALL", lambda: self._r.hgetall(self.key))
        return Reply(checkpoint=pending_checkpoint(_decoded(record), self.rank))

    def close(self) -> None:
        try:
            self._r.close()
        except Exception:  # pragma: no cover
            pass


def _decoded(record: Any) -> Dict[str, Optional[str]]:
    return {str(_text(k)): _text(v) for k, v in (record or {}).items()}


def _text(v: Any) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


def auto_transport(worker_id: str, timeout: float = 2.0) -> Transport:
    """`REDIS_URL` set: :class:`RedisTransport`; otherwise :class:`ApiTransport` (the agent from
    `VIGIL_AGENT`, the token from `VIGIL_TOKEN_FILE`)."""
    if os.environ.get("REDIS_URL", "").strip():
        return RedisTransport(worker_id, timeout=timeout)
    return ApiTransport(worker_id, timeout=timeout)
