"""A GPU's memory through NVML, and whether k engines sharing one GPU can all start (docs/scaling.md).

Engines that share a GPU start one after another (:mod:`agent_envs.scale.pool`), and a vLLM engine
refuses to start unless its share of the GPU (``gpu_memory_utilization``, split k ways) is free.  Each
engine holds more than that share once built: its CUDA context and graphs sit outside vLLM's budget.
On an H100 80 GB (2026-12-06, SmolLM2-135M shape) eight engines at 0.85 split eight ways each held about
1.8 GiB over their 8.41 GiB share, and the eighth found 7.44 GiB free: vLLM refused it after four minutes
of builds.  The first engine's build already says what every later one will take, so the pool checks
then, and refuses at once with the share that would fit.

vLLM checks only the share when an engine starts; the rest comes during the build.  So each engine must
find its whole footprint free, not its share: on an H100 (2026-12-07) the share this check used to offer,
0.824 split eight ways, passed vLLM's start check for all eight, and the eighth ran out of memory in its
sampler's warm-up with 9.54 GiB of its 9.94 GiB taken and 37.5 MiB left on the card.

NVML, not CUDA: reading the memory through CUDA would make a context (hundreds of MiB) in every actor.
vLLM reads it through CUDA, which sees a little less free memory than NVML, and later engines took a
little more than the first: on the H100 the check predicted 8.29 GiB free for the eighth engine (the
first took 10.12 GiB, 2026-12-06) where vLLM had found 7.44 GiB, about 1% of the card less.  So an
engine counts as starting only with :data:`MARGIN` of the GPU to spare beyond what it takes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any, NamedTuple

GIB = 2**30
#: of the GPU's total memory, what an engine must have to spare beyond what it takes to count as starting:
#: twice the gap seen between this check's prediction and vLLM's own reading (above)
MARGIN = 0.02


def nvml_bindings() -> Any:
    """NVML's Python bindings: ``pynvml`` where installed, else the copy vLLM ships (loaded from its
    file, so that vLLM itself is not imported: a GPU host's staged vLLM may bring no ``pynvml``)."""
    try:
        import pynvml

        return pynvml
    except ImportError:
        spec = importlib.util.find_spec("vllm")
        if spec is None or spec.origin is None:
            raise
        path = Path(spec.origin).parent / "third_party" / "pynvml.py"
        loader = importlib.util.spec_from_file_location("_vllm_pynvml", path)
        if loader is None or loader.loader is None:
            raise
        module = importlib.util.module_from_spec(loader)
        sys.modules[loader.name] = module  # the bindings look themselves up there as they load
        loader.loader.exec_module(module)
        return module


def nvml() -> Any:
    """The bindings, initialised (NVML counts its inits, so calling this again is harmless); raises
    where there are no bindings or no NVIDIA driver."""
    pynvml = nvml_bindings()
    pynvml.nvmlInit()
    return pynvml


class DeviceMemory(NamedTuple):
    """A GPU's free and total memory, bytes."""

    free: int
    total: int


def nvml_memory(gpu: str, folder: str | None = None) -> DeviceMemory | None:
    """GPU ``gpu``'s memory (the id Ray gives an actor, which is the index NVML takes, as vLLM assumes
    too); None where NVML or the GPU is not there.  ``folder`` (the node's per-GPU files) is unused:
    the signature is the pool's memory probe (``EngineSpec.memory_probe``)."""
    try:
        pynvml = nvml()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(int(gpu)))
    except Exception:  # no bindings, no driver, no such GPU (Ray's GPUs declared on a CPU host)
        return None
    return DeviceMemory(free=int(info.free), total=int(info.total))


@dataclasses.dataclass(frozen=True)
class BuildMemory:
    """The GPU's memory around one engine's build, and the share of it the engine needs free to start."""

    total: int
    free_before: int
    free_after: int
    #: of ``total``, what the engine must find free when it starts (vLLM: its ``gpu_memory_utilization``)
    share: float

    @property
    def footprint(self) -> int:
        return self.free_before - self.free_after


def shared_gpu_shortfall(first: BuildMemory, engines: int) -> str | None:
    """None when ``engines`` engines like ``first`` can be built on its GPU one after another, each finding
    what the first took (and :data:`MARGIN` to spare) free when it starts; else why not, with the largest
    share per engine that would fit."""
    ask, spare = first.share * first.total, MARGIN * first.total
    step = max(first.footprint, 0)
    need = max(step, ask) + spare  # vLLM's start check asks for the share; the build takes the footprint
    free = [first.free_after - (j - 2) * step for j in range(2, engines + 1)]  # at engine j's start
    short = [j for j, f in enumerate(free, start=2) if f < need]
    if not short:
        return None
    over = max(step - ask, 0)  # what an engine holds beyond its share: context, graphs
    # engine n starts with free_before - (n - 1) * (share' * total + over) and builds to share' * total + over
    fits = (first.free_before - engines * over - spare) / (engines * first.total)
    fits = math.floor(fits * 1000) / 1000
    advice = (
        f"a share of at most {fits:.3f} per engine fits (gpu_memory_utilization {fits * engines:.3f} split "
        f"{engines} ways), or fewer engines per GPU"
        if fits > 0
        else "no share fits: what each engine holds beyond its share alone fills the GPU; use fewer engines per GPU"
    )
    return (
        f"{engines} engines cannot all be built on one GPU: the first took {step / GIB:.2f} GiB, "
        f"{over / GIB:.2f} GiB beyond its share ({first.share:.4f} of {first.total / GIB:.2f} GiB), so engine "
        f"{short[0]} would find about {free[short[0] - 2] / GIB:.2f} GiB free where it needs {need / GIB:.2f} GiB "
        f"(its build, with {MARGIN:.0%} of the GPU to spare); {advice}"
    )
