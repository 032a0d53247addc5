"""CUDA MPS for engines that share a GPU (docs/scaling.md#engines-sharing-a-gpu).

Without MPS, processes on one GPU take turns (time slicing): k engines decoding small batches
leave most of the GPU idle.  The MPS server lets their kernels run side by side.  It is used only
when the host offers it: an MPS control daemon already running, or ``nvidia-cuda-mps-control`` on
``PATH`` and startable.  A daemon started here gets private pipe and log folders (the engines find
it through ``CUDA_MPS_PIPE_DIRECTORY``), is probed with a one-tensor CUDA client before any engine
relies on it, and is shut down again by :meth:`MPS.stop`.  ``MPS.reason`` says what happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
#: where a host-wide MPS daemon listens unless CUDA_MPS_PIPE_DIRECTORY says otherwise
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
MODES = ("auto", "off")
_PROBE = "import torch; torch.ones(1, device='cuda').sum().item(); torch.cuda.synchronize()"


class MPS:
    """Whether engines on a shared GPU run under MPS, the environment they need, and why."""

    def __init__(
        self, active: bool, reason: str, env: dict[str, str] | None = None, folders: list[str] | None = None
    ) -> None:
        self.active, self.reason, self.env = active, reason, dict(env or {})
        self._folders = list(folders or [])

    def describe(self) -> str:
        return f"CUDA MPS {'on' if self.active else 'off'}: {self.reason}"

    def stop(self) -> None:
        """Quit a daemon started here (one found running is left alone) and remove its folders."""
        if self._folders:
            _control("quit", self.env)
            for folder in self._folders:
                shutil.rmtree(folder, ignore_errors=True)
            self._folders = []
        self.active = False


def _control(command: str, env: dict[str, str], timeout: float = 30.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(
            [CONTROL], input=command + "\n", capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def _running(env: dict[str, str]) -> bool:
    result = _control("get_server_list", env)
    return result is not None and result.returncode == 0


def start_mps(mode: str = "auto", probe_timeout_s: float = 180.0) -> MPS:
    """Use a running MPS daemon, or start one; else say why not (never raises for a missing MPS)."""
    if mode not in MODES:
        raise ValueError(f"mps must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return MPS(False, "turned off (mps='off')")
    if shutil.which(CONTROL) is None:
        return MPS(False, f"{CONTROL} is not on PATH")
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIR)
    if Path(pipe, "control").exists() and _running({}):
        return MPS(True, f"a daemon is already running on this host ({pipe})")
    pipe, logs = tempfile.mkdtemp(prefix="agent-envs-mps-pipe-"), tempfile.mkdtemp(prefix="agent-envs-mps-log-")
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logs}
    mps = MPS(True, f"started a daemon for this pool (pipe {pipe})", env, [pipe, logs])
    try:
        started = subprocess.run([CONTROL, "-d"], capture_output=True, text=True, timeout=30, env={**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        mps.stop()
        return MPS(False, f"{CONTROL} -d failed: {exc}")
    if started.returncode != 0:
        mps.stop()
        said = (started.stderr or started.stdout).strip()[:300]
        return MPS(False, f"{CONTROL} -d exited {started.returncode}: {said}")
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=probe_timeout_s,
            env={**os.environ, **env},
        )
        failed = probe.returncode != 0 and (probe.stderr.strip().splitlines() or ["no output"])[-1][:300]
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed = str(exc)[:300]
    if failed:
        mps.stop()
        return MPS(False, f"the daemon started but a CUDA client could not use it ({failed})")
    return mps
