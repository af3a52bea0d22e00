"""The rig: the real `vigil` binary, a private Redis, and real Docker containers.

- `VIGIL_BIN`: the agent binary (default: the repository's `target/debug/vigil`, which
  `scripts/test.sh` builds).
- A Redis server of its own on a free port (`--save '' --dir <tmp>`), for the whole session.
- Containers from a tiny image `docker import`ed from a static busybox (no registry is
  reached), labelled with the worker id. A worker that runs *inside* its container gets the
  host's Python (its prefix, `/usr` and `/lib`) and this client's source mounted read-only, so
  it runs the client exactly as a trainer would, with nothing installed in the image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

CLIENT = Path(__file__).resolve().parents[1]
REPO = CLIENT.parents[1]
IMAGE = "vigil-pytest-busybox:1"
BUSYBOX_APPLETS = ["sh", "sleep", "echo", "cat", "kill", "date", "true", "ls", "touch"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def eventually(check: Callable[[], object], limit: float, every: float = 0.1) -> bool:
    deadline = time.monotonic() + limit
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)


# ---------------------------------------------------------------------------------------------
# The agent binary and what it supports


@pytest.fixture(scope="session")
def vigil_bin() -> Path:
    path = Path(os.environ.get("VIGIL_BIN") or (CLIENT / "../../target/debug/vigil")).resolve()
    if not os.access(path, os.X_OK):
        pytest.fail(f"no vigil binary at {path}: run `cargo build` at the repository root, or set VIGIL_BIN", pytrace=False)
    return path


@pytest.fixture(scope="session")
def agent_features(vigil_bin: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, bool]:
    """What the binary under test supports, probed (never assumed):

    - `grace`: `policy.max_grace` in its effective config (the record's `grace` field);
    - `status_layout`: `vigil beat` writes `<prefix>:{<node>}:status:<worker>` (the client's key).
    """
    d = tmp_path_factory.mktemp("probe")
    prefix, node = unique("probe"), unique("node-")
    cfg = d / "vigil.toml"
    cfg.write_text(f'node_name = "{node}"\n[redis]\nkey_prefix = "{prefix}"\n')
    env = dict(os.environ, REDIS_URL=redis_url)
    out = subprocess.run([str(vigil_bin), "config", "check", "--config", str(cfg)],
                         env=env, capture_output=True, text=True, timeout=30)
    grace = "max_grace" in out.stdout
    subprocess.run([str(vigil_bin), "beat", "--config", str(cfg), "--worker", "probe", "--state", "idle"],
                   env=env, capture_output=True, text=True, timeout=30, check=True)
    r = redis_client(redis_url)
    status_layout = bool(r.exists(f"{prefix}:{{{node}}}:status:probe"))
    return {"grace": grace, "status_layout": status_layout}


NEEDS_GRACE = "the agent under test predates the record's `grace` field (policy.max_grace; issue 19, agent side)"
NEEDS_LAYOUT = ("the agent under test reads <prefix>:{<node>}:worker:<id>, not the client's "
                "<prefix>:{<node>}:status:<id> (the key layout change, agent side)")


def xfail_unless(request: pytest.FixtureRequest, supported: bool, reason: str) -> None:
    """Mark the running test as an expected failure (it still runs, strictly: once the agent
    supports it, a pass is reported as XPASS(strict) so the marker gets removed)."""
    if not supported:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))


# ---------------------------------------------------------------------------------------------
# Redis


def redis_client(url: str):  # type: ignore[no-untyped-def]
    import redis

    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    exe = shutil.which("redis-server")
    if not exe:
        pytest.fail("redis-server is missing (apt-get install redis-server; scripts/setup.sh does)", pytrace=False)
    port = free_port()
    d = tempfile.mkdtemp(prefix="vigil-pytest-redis-")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}"
    r = redis_client(url)

    def up() -> bool:
        try:
            return bool(r.ping())
        except Exception:
            return False

    if not eventually(up, 10):
        proc.kill()
        pytest.fail("redis-server did not start", pytrace=False)
    yield url
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Docker


def docker(*args: str, check: bool = True, timeout: float = 60) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


@pytest.fixture(scope="session")
def docker_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not shutil.which("docker"):
        pytest.fail("docker is missing: these tests run the worker in a real container", pytrace=False)
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        pytest.fail("the Docker daemon does not answer", pytrace=False)
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode == 0:
        return IMAGE
    busybox = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if os.path.exists(p)), None)
    if busybox is None:
        pytest.fail("a static busybox is needed (apt-get install busybox-static)", pytrace=False)
    d = tmp_path_factory.mktemp("image")
    bin_dir = d / "rootfs" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy(busybox, bin_dir / "busybox")
    for applet in BUSYBOX_APPLETS:
        (bin_dir / applet).symlink_to("busybox")
    for extra in ("tmp", "run"):
        (d / "rootfs" / extra).mkdir()
    tar = d / "rootfs.tar"
    with tarfile.open(tar, "w") as t:
        t.add(d / "rootfs", arcname=".")
    docker("import", str(tar), IMAGE)
    return IMAGE


def python_mounts() -> List[str]:
    """`docker run` arguments that give a busybox container this host's Python, read-only,
    at the same paths (the interpreter, its standard library, the C libraries it links)."""
    args: List[str] = []
    paths = ["/usr", "/lib", "/lib64", "/lib32"]
    for p in (os.path.realpath(sys.base_prefix), os.path.dirname(host_python())):
        if not p.startswith("/usr/") and p not in paths:
            paths.append(p)
    for p in paths:
        if os.path.exists(p):
            args += ["-v", f"{p}:{p}:ro"]
    args += ["-v", f"{CLIENT / 'src'}:/opt/vigil-client:ro",
             "-e", "PYTHONPATH=/opt/vigil-client", "-e", "PYTHONUNBUFFERED=1",
             "-e", "PYTHONDONTWRITEBYTECODE=1"]
    return args


def host_python() -> str:
    """The interpreter a container runs: the base one behind this virtual environment's, so the
    container sees the standard library only (the client needs nothing else)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


class Container:
    def __init__(self, cid: str) -> None:
        self.id = cid

    def started_at(self) -> str:
        return docker("inspect", "-f", "{{.State.StartedAt}}", self.id)

    def running(self) -> bool:
        return docker("inspect", "-f", "{{.State.Running}}", self.id, check=False) == "true"

    def logs(self) -> str:
        out = subprocess.run(["docker", "logs", self.id], capture_output=True, text=True, timeout=30)
        return out.stdout + out.stderr

    def remove(self) -> None:
        docker("rm", "-f", self.id, check=False)


@pytest.fixture
def containers(docker_image: str) -> Iterator[Callable[..., Container]]:
    started: List[Container] = []

    def start(args: Sequence[str], command: Sequence[str]) -> Container:
        cid = docker("run", "-d", "--name", unique("vigil-pytest-"), *args, docker_image, *command)
        c = Container(cid)
        started.append(c)
        return c

    yield start
    for c in started:
        c.remove()


# ---------------------------------------------------------------------------------------------
# The agent


class Agent:
    """A `vigil run` under test: its own node name, Redis key prefix, worker label, worker id,
    metrics port, loopback worker API (auth none) and worker API socket."""

    def __init__(self, vigil_bin: Path, redis_url: str, tmp: Path) -> None:
        self.bin = vigil_bin
        self.redis_url = redis_url
        self.dir = tmp
        self.node = unique("node-")
        self.prefix = unique("py")
        self.label = unique("vigil.pytest.")
        self.worker = unique("trainer-")
        self.listen = f"127.0.0.1:{free_port()}"
        self.worker_listen = f"127.0.0.1:{free_port()}"
        self.socket_dir = Path(tempfile.mkdtemp(prefix="vigil-sock-"))
        self.socket = self.socket_dir / "worker.sock"
        self.config = tmp / "vigil.toml"
        self.log_path = tmp / "agent.log"
        self.proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def api_url(self) -> str:
        return f"http://{self.worker_listen}"

    def write_config(self, checkpoint: str = "", policy: str = "", metadata: str = 'enabled = "off"',
                     extra: str = "") -> None:
        """`checkpoint`: more keys of `[checkpoint]`; one of the defaults below that it sets
        replaces the default (see `LONG_SIGTERM_ROUND`)."""
        defaults = {"grace": "8s", "sigterm_budget": "6s", "preemption_budget": "6s"}
        budgets = "\n".join(f'{key} = "{value}"' for key, value in defaults.items()
                             if not re.search(rf"^\s*{key}\s*=", checkpoint, re.MULTILINE))
        self.config.write_text(f'''node_name = "{self.node}"
poll_interval = "300ms"
[redis]
key_prefix = "{self.prefix}"
[server]
listen = "{self.listen}"
[runtime]
worker_label = "{self.label}"
log_timeout = "5s"
call_timeout = "2s"
stop_grace = "3s"
restart_timeout = "15s"
[policy]
stale_after = "2s"
confirm_after = "500ms"
restart_delay = "2s"
{policy}
[safety]
lock_ttl = "60s"
[metadata]
{metadata}
[kubernetes]
enabled = "off"
[gpu]
enabled = "off"
[checkpoint]
label = "{self.label}.checkpoint"
# The agent's own SIGTERM is these tests' trigger of a round (no metadata server here).
on_sigterm = "always"
{budgets}
{checkpoint}
[worker_api]
listen = "{self.worker_listen}"
auth = "none"
socket = "{self.socket}"
{extra}
''')

    def start(self, checkpoint: str = "", policy: str = "", metadata: str = 'enabled = "off"',
              extra: str = "") -> "Agent":
        """`extra`: more of the config, after the rest (whole tables, e.g. `[gang.pace]`)."""
        self.write_config(checkpoint=checkpoint, policy=policy, metadata=metadata, extra=extra)
        env = dict(os.environ, REDIS_URL=self.redis_url, RUST_LOG="info")
        env.pop("NODE_NAME", None)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(self.bin), "run", "--config", str(self.config)],
                                         env=env, stdout=log, stderr=subprocess.STDOUT)
        if not eventually(self._serving, 20):
            raise AssertionError(f"the agent did not start serving:\n{self.log_text()}")
        return self

    def _serving(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the agent exited ({self.proc.returncode}):\n{self.log_text()}")
        try:
            with urllib.request.urlopen(f"http://{self.listen}/healthz", timeout=2):
                pass
        except Exception:
            return False
        return self.socket.exists()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""

    def record(self, worker: Optional[str] = None) -> Dict[str, str]:
        """The worker's status record as the agent reads it (its own key layout), through the
        loopback worker API's GET."""
        url = f"{self.api_url}/v1/workers/{worker or self.worker}/status"
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                data = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return {}
            raise
        return {k: str(v) for k, v in data.items()}

    def trail(self) -> str:
        env = dict(os.environ, REDIS_URL=self.redis_url)
        out = subprocess.run([str(self.bin), "explain", "--config", str(self.config), "--limit", "500", self.node],
                             env=env, capture_output=True, text=True, timeout=30)
        return out.stdout + out.stderr

    def decisions(self, decision: str, worker: Optional[str] = None) -> int:
        worker = worker or self.worker
        return sum(1 for line in self.trail().splitlines()
                   if len(line.split()) > 3 and line.split()[1] == worker and line.split()[3] == decision)

    def sigterm_and_wait(self, limit: float) -> "tuple[int, float]":
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the agent did not exit within {limit}s of SIGTERM:\n{self.log_text()}")
        return code, time.monotonic() - started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


#: `Agent.start(checkpoint=...)` for a test that times the agent's SIGTERM round ending early
#: (acknowledged): a budget far above what an acknowledged round takes on a loaded machine, so
#: that "ended by the acknowledgement" and "waited out the budget" cannot be mistaken. NB: the
#: grace must exceed the budget by a second (the config refuses less), and the agent ends a
#: round 2 s before the grace. A round that ends early costs nothing of it.
LONG_SIGTERM_ROUND = 'sigterm_budget = "20s"\ngrace = "22s"'
#: What a test that times that round allows it, and how long it waits for the agent to exit at
#: all: past the grace, so that a round that waited out the budget fails on its time, which
#: says why.
EARLY_ROUND_LIMIT = 15.0
SIGTERM_EXIT_LIMIT = 30.0


@pytest.fixture
def agent(vigil_bin: Path, redis_url: str, tmp_path: Path) -> Iterator[Agent]:
    """An agent, not started yet (call `.start(...)` with the suite's config keys)."""
    a = Agent(vigil_bin, redis_url, tmp_path)
    yield a
    a.stop()


def worker_container(containers: Callable[..., Container], agent: Agent, script: Path, *,
                     state_dir: Path, extra: Sequence[str] = (), worker: Optional[str] = None) -> Container:
    """A container opted in as `agent`'s worker, running `script` with the host's Python and
    this client, the worker API socket's directory mounted at /run/vigil (so the client finds
    it by itself), and `state_dir` at /state."""
    worker = worker or agent.worker
    args = ["--label", f"{agent.label}={worker}", "-e", f"VIGIL_WORKER={worker}",
            "-v", f"{agent.socket_dir}:/run/vigil:ro", "-v", f"{state_dir}:/state",
            "-v", f"{script}:/opt/worker.py:ro", *python_mounts(), *extra]
    return containers(args, [host_python(), "/opt/worker.py"])


@pytest.fixture
def two_agents(vigil_bin: Path, redis_url: str, tmp_path: Path) -> Iterator[Tuple[Agent, Agent]]:
    """Two agents of one fleet (one key prefix, two node names), each with its rank's worker."""
    a = Agent(vigil_bin, redis_url, tmp_path / "a")
    b = Agent(vigil_bin, redis_url, tmp_path / "b")
    for i, agent in enumerate((a, b)):
        agent.dir.mkdir()
        agent.config, agent.log_path = agent.dir / "vigil.toml", agent.dir / "agent.log"
        agent.worker = f"rank-{i}"
    b.prefix = a.prefix
    yield a, b
    a.stop()
    b.stop()
