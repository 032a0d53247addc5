"""CUDA MPS for engines sharing a GPU: used when the host offers it, and the pool says whether it did.

This machine has no GPU and no MPS, so ``nvidia-cuda-mps-control`` is a stand-in script here (the
one part that is a mock): it logs what it is asked and answers as told.  The probe that decides
whether a started daemon is usable is real: a CUDA client in a fresh interpreter, which fails on
this CPU-only torch exactly as it would under a broken MPS server.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agent_envs.scale import mps as mps_module
from agent_envs.scale.mps import start_mps


def fake_control(folder: Path, daemon_exit: int = 0, list_exit: int = 1) -> Path:
    """A control program that appends its arguments and stdin to ``calls.log``."""
    log = folder / "calls.log"
    script = folder / "nvidia-cuda-mps-control"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "-d" ]; then
  echo "daemon $CUDA_MPS_PIPE_DIRECTORY" >> {log}; echo "cannot start" >&2; exit {daemon_exit}
fi
read line; echo "$line" >> {log}
case "$line" in get_server_list) exit {list_exit};; *) exit 0;; esac
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return log


@pytest.fixture
def path_with(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(mps_module, "DEFAULT_PIPE_DIR", str(tmp_path / "no-host-daemon"))
    return bin_dir


def test_off_by_request_and_without_the_control_program(tmp_path, monkeypatch) -> None:
    assert start_mps("off").describe() == "CUDA MPS off: turned off (mps='off')"
    monkeypatch.setenv("PATH", str(tmp_path))
    result = start_mps("auto")
    assert not result.active and result.reason == "nvidia-cuda-mps-control is not on PATH"
    with pytest.raises(ValueError, match="mps must be one of"):
        start_mps("on")


def test_a_started_daemon_that_no_cuda_client_can_use_is_shut_down(path_with) -> None:
    log = fake_control(path_with)
    result = start_mps("auto", probe_timeout_s=120)
    assert not result.active and "a CUDA client could not use it" in result.reason
    calls = log.read_text().splitlines()
    assert calls[0].startswith("daemon ") and calls[1:] == ["quit"]
    pipe = calls[0].split()[1]
    assert "agent-envs-mps-pipe-" in pipe and not Path(pipe).exists()  # its folders are gone too


def test_a_daemon_that_does_not_start_is_reported(path_with) -> None:
    fake_control(path_with, daemon_exit=3)
    result = start_mps("auto")
    assert not result.active and result.reason == "nvidia-cuda-mps-control -d exited 3: cannot start"


def test_a_running_host_daemon_is_used_and_left_running(path_with, tmp_path, monkeypatch) -> None:
    pipe = tmp_path / "host-mps"
    pipe.mkdir()
    (pipe / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    log = fake_control(path_with, list_exit=0)
    result = start_mps("auto")
    assert result.active and result.env == {} and "already running" in result.reason
    result.stop()
    assert log.read_text().splitlines() == ["get_server_list"]  # no quit for a daemon it did not start
