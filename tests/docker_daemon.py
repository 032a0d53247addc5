"""pytest plugin: a private Docker daemon and a locally built image, once per test session.

Why private: tests must not touch a system daemon or pull images.  The daemon gets its own
data/exec roots and socket under a short temporary directory and has no bridge network; the
image comes from ``docker/build_local_image.sh`` (``docker import`` of this machine's files).
Load it with ``pytest_plugins = ["docker_daemon"]`` so that every module shares one daemon.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator

import pytest

from agent_envs.sandbox.base import SandboxConfig

REPO = Path(__file__).resolve().parent.parent
TEST_IMAGE = "agent-envs-test:local"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
PR_SET_PDEATHSIG = 1
DATA_TMPFS = "6g"  # upper bound; the test image takes about 1 GB


@dataclass
class DockerDaemon:
    host: str  # DOCKER_HOST value
    process: subprocess.Popen
    root: Path
    log: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def docker(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", *args], env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _why_unavailable() -> str | None:
    for tool in ("dockerd", "docker", "containerd", "runc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    return None


def _die_with_parent() -> None:
    """SIGTERM dockerd if pytest is killed before its teardown runs (survives exec)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _start() -> DockerDaemon:
    """Start dockerd in its own mount namespace with its storage on a tmpfs.

    The namespace takes every overlay/tmpfs mount with it when dockerd exits, and the tmpfs
    makes image import and teardown fast (deleting a layer tree from disk takes tens of seconds).
    """
    root = Path(tempfile.mkdtemp(prefix="aedk-", dir="/tmp"))  # unix socket paths must stay short
    (root / "data").mkdir()
    log = root / "dockerd.log"
    host = f"unix://{root}/d.sock"
    cmd = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs -o size={DATA_TMPFS} agent-envs-docker "$1" && shift && exec "$@"',
        "sh",
        str(root / "data"),
        "dockerd",
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--data-root",
        str(root / "data"),
        "--exec-root",
        str(root / "x"),
        "--pidfile",
        str(root / "d.pid"),
        "-H",
        host,
    ]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
        )
    daemon = DockerDaemon(host=host, process=proc, root=root, log=log)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _stop(daemon)
            raise RuntimeError(f"dockerd exited with {proc.returncode}:\n{daemon.log_tail()}")
        if daemon.docker("info", "--format", "{{.ServerVersion}}", timeout=10).returncode == 0:
            return daemon
        time.sleep(0.2)  # polling interval, not a synchronisation delay
    _stop(daemon)
    raise RuntimeError(f"dockerd not ready after {READY_TIMEOUT_S:.0f}s:\n{daemon.log_tail()}")


def _stop(daemon: DockerDaemon) -> None:
    """Remove every container, stop dockerd by PID (its mounts go with it), delete its files."""
    proc = daemon.process
    if proc.poll() is None:
        ids = daemon.docker("ps", "-aq", timeout=30).stdout.split()
        if ids:
            daemon.docker("rm", "-f", *ids, timeout=120)
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
            proc.wait()
    shutil.rmtree(daemon.root, ignore_errors=True)


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[DockerDaemon]:
    reason = _why_unavailable()
    if reason:
        pytest.skip(f"private Docker daemon unavailable: {reason}")
    try:
        daemon = _start()
    except RuntimeError as exc:
        pytest.skip(f"private Docker daemon did not start: {exc}")
    try:
        yield daemon
    finally:
        _stop(daemon)


@pytest.fixture(scope="session")
def docker_image(docker_daemon: DockerDaemon) -> str:
    """The repository's image built from local files (sandbox tools + the package)."""
    res = subprocess.run(
        [str(REPO / "docker" / "build_local_image.sh"), TEST_IMAGE],
        env=docker_daemon.env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if res.returncode != 0:
        pytest.fail(f"docker/build_local_image.sh failed:\n{res.stderr[-3000:]}")
    return TEST_IMAGE


@pytest.fixture(scope="session")
def docker_sandbox_config(docker_daemon: DockerDaemon, docker_image: str) -> Iterator[SandboxConfig]:
    """A docker-backend config; DOCKER_HOST points the sandbox's docker CLI at the private daemon."""
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = docker_daemon.host
    try:
        yield SandboxConfig(backend="docker", docker_image=docker_image)
    finally:
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous
