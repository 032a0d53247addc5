"""The real Dockerfile, built on a debootstrapped Debian base, runs evaluations two ways.

Inside the container (bwrap inside when the profiles allow it, else the container is the
boundary), and from the host with the docker sandbox backend using the same image.  Both use the
model-free ``scripted`` policy on the built-in MATH tasks: what is under test is the image.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from docker_daemon import DockerDaemon

pytest_plugins = ["docker_daemon"]
pytestmark = [pytest.mark.docker, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
BASE = "agent-envs-base:bookworm"
#: the tags docs/docker.md gives: the CLI image and the docker backend's default image
TAGS = ("agent-envs:latest", "agent-envs-sandbox:latest")
EVAL = ["eval", "--policy", "scripted", "--env", "MATH-ReAct-v0", "--limit", "2", "--no-progress"]
FALLBACK_LINE = "bubblewrap cannot run in this container"
BWRAP_OPTS = [
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
    "--security-opt",
    "systempaths=unconfined",
]
LOCKED_DOWN = [
    "--read-only",
    "--tmpfs",
    "/tmp:rw,exec,size=1g",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
    "--pids-limit",
    "512",
]


@pytest.fixture(scope="module")
def image(docker_daemon: DockerDaemon) -> str:
    """``docker/debian_base.sh`` then ``docker build`` of the repository's Dockerfile on it."""
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap not found (apt-get install debootstrap; scripts/install.sh --test does)")
    env = docker_daemon.env()
    base = subprocess.run(
        ["bash", str(REPO / "docker" / "debian_base.sh"), BASE], env=env, capture_output=True, text=True, timeout=1200
    )
    assert base.returncode == 0, base.stdout[-2000:] + base.stderr[-3000:]
    # The legacy builder: it takes --network host (the private daemon has no bridge for apt and pip).
    build = subprocess.run(
        [
            "docker",
            "build",
            "--network",
            "host",
            "--build-arg",
            f"BASE={BASE}",
            *[a for t in TAGS for a in ("-t", t)],
            str(REPO),
        ],
        env={**env, "DOCKER_BUILDKIT": "0"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return TAGS[0]


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]


def _check_run(run_dir: Path) -> None:
    """Two finished episodes whose one tool call really ran (the observation holds its output)."""
    records = _records(run_dir)
    assert [r["termination_reason"] for r in records] == ["final_answer"] * 2
    for r in records:
        (step,) = r["react_steps"]
        assert r["error"] is None and step["observation"].endswith("\n\n[exit_code] 0")
        assert step["observation"].split("\n")[0] == r["prediction"]


def _run_in_container(
    daemon: DockerDaemon, image: str, tmp_path: Path, opts: list[str], *args: str
) -> subprocess.CompletedProcess:
    return daemon.docker(
        "run", "--rm", "--network", "none", *opts, "-v", f"{tmp_path}:/runs", image, *args, timeout=300
    )


def test_eval_inside_with_bwrap(docker_daemon: DockerDaemon, image: str, tmp_path: Path) -> None:
    res = _run_in_container(docker_daemon, image, tmp_path, BWRAP_OPTS, *EVAL, "--out", "/runs/a")
    assert res.returncode == 0 and FALLBACK_LINE not in res.stderr, res.stderr[-3000:]
    _check_run(tmp_path / "a")
    # The default sandbox in there is bwrap: its own PID namespace, the container's /runs out of sight.
    probe = (
        "import os\n"
        "from agent_envs.sandbox.factory import make_sandbox\n"
        "with make_sandbox(None) as sb:\n"
        "    r = sb.run('readlink /proc/self/ns/pid; ls /runs')\n"
        "    print(type(sb).__name__, r.returncode, r.stdout.decode().strip() != os.readlink('/proc/self/ns/pid'))\n"
    )
    res = _run_in_container(docker_daemon, image, tmp_path, [*BWRAP_OPTS, "--entrypoint", "python3"], "-c", probe)
    assert res.stdout.split() == ["BwrapSandbox", "2", "True"], res.stdout + res.stderr[-2000:]


def test_eval_inside_locked_down_falls_back_to_the_container(
    docker_daemon: DockerDaemon, image: str, tmp_path: Path
) -> None:
    """Docker's default profiles forbid bwrap's namespaces: one logged line says so, tools run in the container."""
    res = _run_in_container(docker_daemon, image, tmp_path, LOCKED_DOWN, *EVAL, "--out", "/runs/b")
    assert res.returncode == 0 and FALLBACK_LINE in res.stderr, res.stderr[-3000:]
    _check_run(tmp_path / "b")


def test_eval_from_outside_with_the_docker_backend(docker_daemon: DockerDaemon, image: str, tmp_path: Path) -> None:
    since = str(int(time.time()) - 1)
    env = {**docker_daemon.env(), "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-m", "agent_envs.cli", *EVAL, "--sandbox", "docker", "--out", str(tmp_path / "c")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    _check_run(tmp_path / "c")
    started = docker_daemon.docker(
        "events",
        "--since",
        since,
        "--until",
        str(int(time.time()) + 1),
        "--filter",
        "event=start",
        "--filter",
        f"image={TAGS[1]}",
        "--format",
        "{{.ID}}",
    )
    assert len(started.stdout.split()) == 2, started  # one container per episode, from the built image
    left = docker_daemon.docker("ps", "-aq", "--filter", "label=agent-envs.sandbox")
    assert left.stdout.split() == []
