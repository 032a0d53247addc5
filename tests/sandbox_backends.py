"""Sandbox backend fixtures shared by the sandbox test modules.

``backend`` is parametrised over every backend that can run here: persistent and fresh
bubblewrap always (the tests fail loudly if bwrap is missing), and docker when
``agent_envs.sandbox.docker`` exists and the private daemon of ``tests/docker_daemon.py`` starts
(otherwise that parameter is skipped with the daemon fixture's reason).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from agent_envs.core.spec import Mount
from agent_envs.envs.docvqa.spec import DOCUMENT_PATH
from agent_envs.sandbox.base import Sandbox, SandboxConfig, SandboxLimits
from agent_envs.sandbox.factory import make_sandbox
from agent_envs.testing import live_descendants, temp_dirs  # noqa: F401  (the tests import them from here)

BACKENDS = ["bwrap-persistent", "bwrap-fresh", "docker"]
#: small caps so that filling the disk or memory stays cheap on a shared machine
TEST_LIMITS = SandboxLimits(workspace_mib=64, max_file_size_mib=128)

Maker = Callable[..., Sandbox]


def _base_config(request: pytest.FixtureRequest, name: str) -> SandboxConfig:
    if name == "docker":
        if importlib.util.find_spec("agent_envs.sandbox.docker") is None:
            pytest.skip("agent_envs.sandbox.docker is not present")
        return request.getfixturevalue("docker_sandbox_config")
    return SandboxConfig(backend="bwrap", mode=name.split("-", 1)[1])


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest) -> Iterator[Maker]:
    """``make(image_path=None, **limit_overrides)`` builds a sandbox of the parametrised backend."""
    base = _base_config(request, request.param)
    made: list[Sandbox] = []

    def build(image_path: str | Path | None = None, **limits) -> Sandbox:
        lim = TEST_LIMITS.model_copy(update=limits)
        cfg = base.model_copy(
            update={"limits": lim, "mounts": [] if image_path is None else [Mount(str(image_path), DOCUMENT_PATH)]}
        )
        sb = make_sandbox(cfg)
        made.append(sb)
        return sb

    yield build
    for sb in made:
        close_checked(sb)


def our_processes() -> set[int]:
    """Descendants of this test process, except a private Docker daemon's own tree."""
    from agent_envs.sandbox._procs import children

    out: set[int] = set()
    todo = children(os.getpid())
    while todo:
        pid = todo.pop()
        try:
            exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        if exe.rsplit(b"/", 1)[-1] in (b"dockerd", b"containerd"):
            continue
        out.add(pid)
        todo += children(pid)
    return out


def pid_namespaces(pids: list[int]) -> set[str]:
    out = set()
    for pid in pids:
        try:
            out.add(os.readlink(f"/proc/{pid}/ns/pid"))
        except OSError:
            continue
    return out - {os.readlink("/proc/self/ns/pid")}


def processes_in(namespaces: set[str]) -> list[int]:
    """Host processes still living in any of ``namespaces``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") in namespaces:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def close_checked(sb: Sandbox) -> None:
    """Close ``sb`` and assert that nothing of its pid namespace survives (bwrap backends)."""
    namespaces = pid_namespaces(sb.processes()) if hasattr(sb, "processes") else set()
    sb.close()
    left = {pid: describe(pid) for pid in processes_in(namespaces)}
    assert left == {}, f"processes outlived close(): {left}"


def describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:100].decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        ns = os.readlink(f"/proc/{pid}/ns/pid")
        return f"{cmd} state={state} ns={ns}"
    except OSError:
        return "gone"


def host_processes_matching(token: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if token in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def sandbox_mounts() -> list[str]:
    """Host mounts a sandbox could have leaked (docker's own daemon mounts are not ours)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return sorted(line.split()[4] for line in lines if "aedk-" not in line and "docker" not in line)


@pytest.fixture(scope="module", autouse=True)
def nothing_left_behind():
    """Imported by a test module: after its last test no process, temp folder or mount of ours is left."""
    before = (our_processes(), temp_dirs(), sandbox_mounts())
    yield
    assert our_processes() - before[0] == set()
    assert temp_dirs() - before[1] == set()
    assert sandbox_mounts() == before[2]
