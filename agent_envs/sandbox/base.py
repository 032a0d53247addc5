"""The one small interface every tool sandbox implements.

A sandbox runs model-written shell commands for one episode.  It returns raw bytes and an exit
status; turning them into the protocol's observation text is a pure function
(:mod:`agent_envs.sandbox.output`) so that every backend frames output identically.
"""

from __future__ import annotations

import abc
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from agent_envs.core.spec import Mount
from agent_envs.core.flight import in_flight
from agent_envs.core.types import InfrastructureError
from agent_envs.core.validation import WholeNumber

#: capability: long-lived processes with pipes beside ``run`` (:meth:`Sandbox.popen`, ``sweep``, ``stop``)
PROCESSES = "processes"
#: capability: each process :meth:`Sandbox.popen` starts has a pid namespace of its own, so it can
#: kill everything it started by itself (no :meth:`Sandbox.sweep` from outside)
PID_NAMESPACE = "pid_namespace"

#: environment every sandbox backend sets: home and temp on the tmpfs, no pip index, and
#: single-threaded numeric libraries (tesseract is ~4x faster on 2 cores with one OpenMP thread)
BASE_ENV: dict[str, str] = {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "PIP_NO_INDEX": "1",
    **{
        var: "1"
        for var in (
            "OPENBLAS_NUM_THREADS",
            "OMP_NUM_THREADS",
            "MKL_NUM_THREADS",
            "NUMEXPR_NUM_THREADS",
            "OMP_THREAD_LIMIT",
        )
    },
}


@dataclass
class ExecResult:
    """What one command did.  ``stdout``/``stderr`` may be head+tail windows of a huge stream.

    When ``stdout_dropped`` (``stderr_dropped``) is > 0 the stream holds two windows of equal
    length, head then tail, and the dropped bytes sat exactly at ``len(stdout) // 2``; then
    ``stdout_stripped`` holds the stream without its trailing whitespace in the same layout (its
    tail window may be far from the stream's: the blanks at the end can outgrow a window).
    """

    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    #: set when the command could not be launched at all (text after "Failed to execute command: ")
    launch_error: str | None = None
    #: bytes that were dropped from the middle of each stream (0 when captured whole)
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    #: the stream minus its trailing whitespace, and what that dropped (None: not captured apart)
    stdout_stripped: bytes | None = None
    stdout_stripped_dropped: int = 0
    stderr_stripped: bytes | None = None
    stderr_stripped_dropped: int = 0
    duration_s: float = 0.0
    #: the limit that was applied (the timeout text quotes it)
    timeout_s: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


#: smallest address-space cap that still starts ``python3 -c "import numpy, sympy"`` (measured:
#: 128 MiB cannot, 256 MiB can); anything lower would turn every command into an error
MIN_MEMORY_GIB = 0.25


class SandboxLimits(BaseModel):
    """Resource limits applied to every command (all backends).

    Checked when the environment is made, strictly (``"3"`` or ``True`` is not a number here), with
    floors below which no command could run, so a bad limit never reaches the model as an error
    observation on every turn.
    """

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(default=20.0, gt=0, strict=True)
    #: address space (ulimit -v); None disables
    memory_gib: float | None = Field(default=8.0, ge=MIN_MEMORY_GIB, strict=True)
    max_processes: WholeNumber = Field(default=256, ge=2)  # the shell and one command
    max_file_size_mib: WholeNumber = Field(default=512, ge=1)
    max_open_files: WholeNumber = Field(default=1024, ge=64)  # the persistent driver uses fds 59-63
    cpu_seconds: WholeNumber = Field(default=120, ge=1)
    workspace_mib: WholeNumber = Field(default=1024, ge=1)  # size of the writable /workspace (and /tmp) tmpfs
    max_output_chars: WholeNumber = Field(default=6000, ge=1)
    #: bytes kept from each end of a stream; must exceed 4x max_output_chars for exact framing
    capture_window_bytes: WholeNumber = Field(default=65536, ge=4096)

    @property
    def capture_keep(self) -> int:
        """Bytes each stream window keeps: the configured size, raised to what exact framing needs."""
        return max(self.capture_window_bytes, 4 * self.max_output_chars + 64)


#: share of the host's RAM that the tmpfs mounts of one process's sandboxes may pin together
TMPFS_BUDGET_FRACTION = 0.5
#: tmpfs mounts one episode can hold: two sandboxes (Countdown's python and bash), two mounts each
MOUNTS_PER_EPISODE = 4


def tmpfs_budget_mib() -> int:
    """The tmpfs budget: ``$AGENT_ENVS_TMPFS_BUDGET_MIB``, else half the host's RAM."""
    override = os.environ.get("AGENT_ENVS_TMPFS_BUDGET_MIB")
    if override:
        if not override.strip().isdigit() or int(override) < 1:  # "1.5", "1e3", "12 MiB", "0", "-5"
            raise ValueError(f"AGENT_ENVS_TMPFS_BUDGET_MIB must be a whole number of MiB >= 1, got {override!r}")
        return int(override)
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 1 << 20  # unknown: 1 TiB, no cap in practice
    return max(1, int(pages * size * TMPFS_BUDGET_FRACTION) >> 20)


def tmpfs_mib(limits: SandboxLimits) -> int:
    """Size of each writable tmpfs (``/tmp``, ``/workspace``) of a new sandbox: ``workspace_mib``,
    or less, so that the mounts of every episode a runner has in flight fit the budget together
    (docs/reliability.md#limits).  Their files live in RAM: 64 Countdown episodes could otherwise
    pin 64 x 4 GiB."""
    return max(1, min(limits.workspace_mib, tmpfs_budget_mib() // (MOUNTS_PER_EPISODE * in_flight())))


class SandboxConfig(BaseModel):
    """How to build an episode's sandbox.  Passed through ``gym.make(..., sandbox=...)``."""

    model_config = ConfigDict(extra="forbid")

    backend: str = "bwrap"  # "bwrap" | "docker" | "none"
    mode: str = "persistent"  # "persistent" (one shell per episode) | "fresh" (one sandbox per command)
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    #: host paths bound into the sandbox (an environment adds its task's files, e.g. a page image)
    mounts: list[Mount] = Field(default_factory=list)
    #: extra environment variables inside the sandbox
    env: dict[str, str] = Field(default_factory=dict)
    #: Docker image for the docker backend
    docker_image: str = "agent-envs-sandbox:latest"
    #: extra runtime prefixes bound read-only (bwrap), before the running Python's own prefixes
    runtime_prefixes: list[str] = Field(default_factory=list)


class Sandbox(abc.ABC):
    """One episode's sandbox.  ``run`` never raises for anything a command does.

    Beyond ``run``, a backend declares its ``capabilities``; tools that need one say so in their
    declaration (:attr:`agent_envs.core.spec.ToolSpec.needs`) and an environment checks them when
    it is made, so a missing one is refused there, by name.
    """

    config: SandboxConfig
    capabilities: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def __init__(self, config: SandboxConfig) -> None:
        """Every backend is built from its config alone (:func:`agent_envs.sandbox.factory.make_sandbox`)."""

    @classmethod
    def check(cls, config: SandboxConfig) -> None:
        """Raise :class:`SandboxUnavailable` (with the fix) when this backend cannot run ``config``
        here: what a run asks once before its first episode (default: nothing to ask)."""

    @abc.abstractmethod
    def run(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run ``command`` with bash; ``timeout`` overrides ``config.limits.timeout_s``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Kill everything the episode started and remove every trace.  Idempotent."""

    def popen(self, program: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        """Start a long-lived tool process (capability :data:`PROCESSES`) with the sandbox's mounts
        and limits; stdin, stdout and stderr are pipes.  End it with :meth:`stop`."""
        raise SandboxUnavailable(f"the {self.config.backend!r} sandbox backend cannot start long-lived processes")

    def sweep(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill every process ``proc`` started, which lives on (backends without :data:`PID_NAMESPACE`)."""
        raise SandboxUnavailable(f"the {self.config.backend!r} sandbox backend cannot sweep a process")

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill ``proc`` and everything it started, and reap it."""
        raise SandboxUnavailable(f"the {self.config.backend!r} sandbox backend cannot stop a process")

    def process_ids(self, proc: subprocess.Popen[bytes]) -> list[int]:
        """Host pids of ``proc`` (started by :meth:`popen`) and every process below it."""
        raise SandboxUnavailable(f"the {self.config.backend!r} sandbox backend cannot list a process's tree")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxUnavailable(InfrastructureError):
    """The requested backend cannot run on this machine (message says what to install)."""


def staged_mounts(config: SandboxConfig, needs_copy: Callable[[Path], bool]) -> tuple[list[Mount], list[str]]:
    """The config's mounts with existing, absolute host paths, and the staging folders made.

    A read-only file for which ``needs_copy(path)`` holds (the sandbox uid could not read it) is
    replaced by a world-readable private copy; the caller removes the returned folders on close.
    A missing host path raises FileNotFoundError before anything starts.
    """
    out: list[Mount] = []
    folders: list[str] = []
    try:
        for m in config.mounts:
            host = Path(m.host)
            if not host.exists():
                raise FileNotFoundError(f"mount source not found: {host} (for {m.target})")
            host = host.resolve()
            if m.read_only and host.is_file() and needs_copy(host):
                host, folder = _stage_readable(host)
                folders.append(folder)
            out.append(Mount(str(host), m.target, m.read_only))
    except BaseException:
        remove_folders(folders)
        raise
    return out, folders


def remove_folders(folders: list[str]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _stage_readable(path: Path) -> tuple[Path, str]:
    folder = tempfile.mkdtemp(prefix="ae-mount-")
    copy = Path(folder) / path.name
    shutil.copyfile(path, copy)
    copy.chmod(0o444)
    Path(folder).chmod(0o755)
    return copy, folder
