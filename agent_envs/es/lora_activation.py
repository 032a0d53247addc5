"""vLLM's per-step adapter activation without its quadratic membership test (docs/scaling.md#folded-into-the-matmul).

Before every engine step with adapters, vLLM's LRU worker LoRA manager (``LRUCacheWorkerLoRAManager``,
vLLM 0.26 to 0.32) passes each of the step's adapters to its ``add_adapter``, which first asks whether the
adapter is loaded by building the set of every loaded adapter (``list_adapters()``: a copy of the
manager's dict, then a set of it).  A step of an ES population asks for all P members, so that is P sets
of P entries a step: on a 2-core host 0.11 ms at P = 16, 1.2 ms at 64 and 16 ms at 256
(``benchmarks/bench_lora_activation.py``), before every one of a generation's several hundred steps, on
the host the device waits for.

:func:`apply_adapters` walks the step's adapters as vLLM does and hands each one to vLLM's own
``add_adapter``, but that method's membership test reads a set built once a step, and built again only
after an adapter was loaded (the one branch of ``add_adapter`` that changes what is loaded: it may also
evict).  Every call into the adapter manager is vLLM's own, in vLLM's order, so the slots and both LRU
orders come out as vLLM's (``benchmarks/bench_lora_activation.py`` checks the call logs equal).
:func:`install` puts it in place; the worker extension (:mod:`agent_envs.es.worker`) does so as it is
imported, in every process that builds an ES engine's workers.
"""

from __future__ import annotations

from typing import Any

#: the class whose ``_apply_adapters`` is replaced (module, class)
MANAGER = ("vllm.lora.worker_manager", "LRUCacheWorkerLoRAManager")


def apply_adapters(self: Any, lora_requests: set[Any]) -> None:
    """``LRUCacheWorkerLoRAManager._apply_adapters`` with the loaded set built once a step (:mod:`lora_activation`)."""
    requested = {request.lora_int_id: request for request in lora_requests if request}
    slots = self._adapter_manager.lora_slots
    if len(requested) > slots:
        raise RuntimeError(
            f"{len(requested)} adapters asked for in one step, more than the engine's {slots} LoRA slots"
        )
    vllms_list = type(self).list_adapters
    loaded: set[int] | None = None

    def list_adapters() -> set[int]:
        nonlocal loaded
        if loaded is None:
            loaded = vllms_list(self)
        return loaded

    self.list_adapters = list_adapters  # what add_adapter's membership test calls, for this step
    try:
        for request in requested.values():
            # add_adapter's own test: a load (which may evict) where the adapter is not loaded or is reloaded
            loads = request.lora_int_id not in list_adapters() or getattr(request, "load_inplace", False)
            self.add_adapter(request)
            if loads:
                loaded = None  # loaded, maybe evicting another: list again
    finally:
        del self.list_adapters


def install() -> bool:
    """Replace vLLM's ``_apply_adapters`` in this process (False: this vLLM has no such manager)."""
    import importlib

    module, name = MANAGER
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    if not all(callable(getattr(cls, method, None)) for method in ("_apply_adapters", "add_adapter", "list_adapters")):
        return False
    cls._apply_adapters = apply_adapters
    return True
