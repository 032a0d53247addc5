"""How busy the host's CPUs and the GPU were over a block of timed generations: where a row's scaling stops.

Full-rank ES runs k engines on one GPU, each decoding its own member at batch B.  On the H200 (fourth
session, SmolLM2-135M shape) k = 2 and 4 engines reached 0.90 and 0.87 x linear and k = 8 0.59 x, and the
table could not say whether the GPU or the host ran out: a decode step at batch 16 is mostly kernel
launches and host work, so neither the tokens per second (half of raw's at P x B) nor the engines'
count says it.  This measures both over the same block the row's walls come from:

- **the GPU**: NVML's utilization, the share of time one kernel or more was running, sampled every
  ``interval`` s on a thread of its own (its own time runs in NVML's C code, outside the interpreter's
  lock); also the SM clock, which drops when the GPU is held at its power limit;
- **the host**: the CPUs' busy time from ``/proc/stat`` at the block's two ends, as CPUs' worth of work
  against the logical CPUs there are, and the physical cores those share (two logical CPUs of one core
  do not make two cores' work).

A GPU busy close to all of the block is saturated in the sense that matters here: one more engine's
kernels can only run in time another engine's kernels already take.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from agent_envs.scale.gpu_memory import nvml


@dataclasses.dataclass(frozen=True)
class CpuTimes:
    """``/proc/stat``'s ``cpu`` line: busy and total clock ticks summed over the logical CPUs."""

    busy: int
    total: int

    @classmethod
    def parse(cls, stat: str) -> CpuTimes:
        """From ``/proc/stat``'s text.  Busy is all but idle and iowait; guest time is already in user's."""
        for line in stat.splitlines():
            fields = line.split()
            if fields and fields[0] == "cpu":
                ticks = [int(x) for x in fields[1:]]
                total = sum(ticks[:8])  # user nice system idle iowait irq softirq steal
                return cls(busy=total - ticks[3] - ticks[4], total=total)
        raise ValueError("/proc/stat has no 'cpu' line")

    @classmethod
    def now(cls) -> CpuTimes:
        return cls.parse(Path("/proc/stat").read_text())


def busy_cpus(before: CpuTimes, after: CpuTimes, cpus: int) -> float:
    """How many logical CPUs' worth of work ran between two readings, of ``cpus``."""
    total = after.total - before.total
    return cpus * (after.busy - before.busy) / total if total > 0 else 0.0


def physical_cores(root: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """Distinct (package, core) pairs of the logical CPUs this process may run on; None where sysfs does not say."""
    cores = set()
    for cpu in os.sched_getaffinity(0):
        topology = root / f"cpu{cpu}" / "topology"
        try:
            cores.add(
                ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
            )
        except OSError:
            return None
    return len(cores) or None


class MachineLoad:
    """``with MachineLoad() as load: ...`` then ``load.describe()``: the GPU's and the CPUs' busy shares."""

    def __init__(self, interval: float = 0.2, gpu_index: int = 0) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 s, got {interval!r}")
        self.interval, self.gpu_index = interval, gpu_index
        self.cpus = len(os.sched_getaffinity(0))
        self.cores = physical_cores()
        self.gpu_busy: list[int] = []
        self.sm_mhz: list[int] = []
        #: why the GPU was not read (no NVML, no device), or None
        self.gpu_missing: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu: tuple[CpuTimes, CpuTimes] | None = None
        self._wall = 0.0

    def _gpu(self) -> Any:
        """NVML's handle of the GPU, or None with :attr:`gpu_missing` saying why."""
        try:
            pynvml = nvml()
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
        except Exception as exc:  # no bindings, no driver, no such GPU: the host's share is still read
            self.gpu_missing = f"{type(exc).__name__}: {exc}"[:120]
            return None

    def _sample(self, pynvml: Any, handle: Any) -> None:
        while not self._stop.wait(self.interval):
            self.gpu_busy.append(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            self.sm_mhz.append(int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)))

    def __enter__(self) -> MachineLoad:
        gpu = self._gpu()
        if gpu is not None:
            self._thread = threading.Thread(target=self._sample, args=gpu, name="machine-load", daemon=True)
            self._thread.start()
        self._start, self._before = time.perf_counter(), CpuTimes.now()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._cpu = (self._before, CpuTimes.now())
        self._wall = time.perf_counter() - self._start
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def host_busy(self) -> float:
        """Logical CPUs' worth of work over the block (all processes on the host, not only this one)."""
        if self._cpu is None:
            raise RuntimeError("MachineLoad.host_busy before the block ended")
        return busy_cpus(*self._cpu, self.cpus)

    def describe(self) -> str:
        """One line for a row's notes."""
        cores = f", {self.cores} physical cores" if self.cores else ""
        host = f"host CPUs busy {self.host_busy():.1f} of {self.cpus}{cores} over {self._wall:.1f} s"
        if self.gpu_missing is not None:
            return f"GPU not read ({self.gpu_missing}); {host}"
        if not self.gpu_busy:
            return f"GPU not sampled (the block took {self._wall:.2f} s, under the {self.interval} s interval); {host}"
        busy = self.gpu_busy
        return (
            f"GPU busy (NVML: a kernel running) {statistics.mean(busy):.0f}% (median {statistics.median(busy):.0f}%, "
            f"{min(busy)}-{max(busy)}%, {len(busy)} samples), SM clock median {statistics.median(self.sm_mhz):.0f} MHz; "
            f"{host}"
        )
