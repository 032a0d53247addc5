"""benchmarks/machine_load.py: the host's busy CPUs over a block, read from /proc/stat, and a GPU row that
says why it was not read on a host without one (this one)."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from benchmarks.machine_load import CpuTimes, MachineLoad, busy_cpus, physical_cores


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_proc_stat_busy_is_all_but_idle_and_iowait() -> None:
    before = CpuTimes.parse("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    after = CpuTimes.parse("cpu  250 0 100 900 50 0 0 0 0 0\n")
    assert (before.busy, before.total) == (150, 1000)
    assert busy_cpus(before, after, 4) == pytest.approx(4 * 200 / 300)  # 200 busy of 300 ticks
    with pytest.raises(ValueError, match="no 'cpu' line"):
        CpuTimes.parse("intr 1 2 3\n")


def test_a_spinning_process_shows_as_a_busy_cpu() -> None:
    """One child spinning through the block: at least most of one CPU busy (other load only adds)."""
    child = multiprocessing.get_context("spawn").Process(target=_spin, args=(1.5,))
    with MachineLoad(interval=0.05) as load:
        child.start()
        child.join()
    assert child.exitcode == 0
    assert 0.7 <= load.host_busy() <= load.cpus
    line = load.describe()
    assert f"of {load.cpus}" in line, line


def test_without_a_gpu_the_line_says_why() -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this host has an NVIDIA driver: the GPU is read, not reported missing")
    with MachineLoad() as load:
        pass
    assert load.gpu_missing and load.describe().startswith("GPU not read ("), load.describe()


def test_physical_cores_are_at_most_the_logical_cpus() -> None:
    cores = physical_cores()
    assert cores is None or 1 <= cores <= len(os.sched_getaffinity(0))


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval must be > 0"):
        MachineLoad(interval=0)
