"""The single-machine path of docs/write-a-worker.md, as a new user follows it (issue 27): the
agent started by `bash scripts/run.sh` with scripts/local.toml's worker API (here with the
policy's durations shortened, everything else as shipped), a worker started with the guide's own
`docker run` line, a hang — and the worker restarted, quickly (`--init`: the stop does not wait
out the grace), with `vigil status` and `vigil explain -c` working without Redis.

The `docker run` line is read from the guide itself; only the image (`my-trainer:latest`) is
replaced by this suite's image running a worker script."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Iterator, List

import pytest

from conftest import Container, docker, eventually, host_python, python_mounts, unique

ROOT = Path(__file__).resolve().parents[3]
WORKERS = Path(__file__).parent / "workers"


def guide_docker_run() -> List[str]:
    """The `docker run` command of the guide's "Try it on this machine" section, as words."""
    text = (ROOT / "docs" / "write-a-worker.md").read_text()
    section = text.split("## 6. Try it on this machine", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    line = next(b for b in blocks if b.lstrip().startswith("docker run"))
    return shlex.split(line.replace("\\\n", " "))


def local_config(tmp: Path) -> Path:
    """scripts/local.toml as shipped, plus the durations of this suite (a hang found in seconds:
    the 15 s poll interval alone made it 45 s, and a loaded machine pushed it past the test's
    minute) and a stop grace long enough that a worker holding it would show."""
    text = (ROOT / "scripts" / "local.toml").read_text()
    # NB: a top-level key goes before the file's first table.
    text = "poll_interval = \"2s\"\n" + text
    text += (
        "\n[policy]\nstale_after = \"2s\"\nconfirm_after = \"500ms\"\nrestart_delay = \"2s\"\n"
        # A worker the agent never heard from shows in the trail (unreachable) within the test.
        "start_grace = \"10s\"\n"
        "cooldown = \"30s\"\n[runtime]\nstop_grace = \"20s\"\nrestart_timeout = \"40s\"\n"
        "[safety]\nlock_ttl = \"120s\"\n"
    )
    path = tmp / "local.toml"
    path.write_text(text)
    return path


@pytest.fixture
def run_sh(vigil_bin: Path, tmp_path: Path) -> Iterator[Path]:
    """`bash scripts/run.sh -c <local.toml + durations>`, with the prebuilt `vigil` the script
    prefers to a cargo build on the PATH: the one `cargo install --locked --path agent` put in
    place (`VIGIL_PREBUILT`, from scripts/test.sh), else the test build."""
    cfg = local_config(tmp_path)
    prebuilt = Path(os.environ.get("VIGIL_PREBUILT") or vigil_bin)
    assert prebuilt.is_file(), f"no prebuilt vigil at {prebuilt}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vigil").symlink_to(prebuilt)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    env.pop("REDIS_URL", None)
    log = open(tmp_path / "agent.log", "w")
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "run.sh"), "-c", str(cfg)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        assert eventually(lambda: Path("/run/vigil/worker.sock").exists() and proc.poll() is None, 20), (
            (tmp_path / "agent.log").read_text())
        yield cfg
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
        log.close()


def test_the_guide_s_single_machine_path_restarts_a_hung_worker(run_sh: Path, vigil_bin: Path,
                                                               docker_image: str, tmp_path: Path) -> None:
    worker = unique("guide-")
    words = guide_docker_run()
    assert words[:2] == ["docker", "run"] and "--init" in words, words
    assert "/run/vigil:/run/vigil:ro" in words, words
    image = words.index("my-trainer:latest")
    args = [w.replace("trainer-0", worker) for w in words[2:image]]
    (tmp_path / "state").mkdir()
    cid = docker("run", "-d", "--name", worker, *args,
                 "-v", f"{WORKERS / 'hang_once.py'}:/opt/worker.py:ro", "-v", f"{tmp_path / 'state'}:/state",
                 *python_mounts(), docker_image, host_python(), "/opt/worker.py")
    c = Container(cid)
    try:
        started = c.started_at()
        explain = lambda: subprocess.run([str(vigil_bin), "explain", "-c", str(run_sh)],  # noqa: E731
                                         capture_output=True, text=True, timeout=30)
        # It beats through the socket (its container is its identity), hangs, is restarted.
        agent_log = lambda: (tmp_path / "agent.log").read_text()[-6000:]  # noqa: E731
        assert eventually(lambda: c.started_at() != started, 60), (explain().stdout, c.logs(), agent_log())
        assert eventually(lambda: "restarted" in explain().stdout, 20), explain()
        trail = explain().stdout
        assert worker in trail, trail
        # `--init`: the stuck Python process is not PID 1, so SIGTERM ends it at once.
        assert "did not exit on SIGTERM" not in trail, trail
        assert "unreachable" not in trail, trail
        status = subprocess.run([str(vigil_bin), "status", "-c", str(run_sh)], capture_output=True,
                                text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        # The restarted worker beats again.
        assert eventually(lambda: (tmp_path / "state" / "runs").read_text().count("run") == 2, 20), c.logs()
    finally:
        c.remove()
