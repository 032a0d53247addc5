"""Rewrite a LoRA adapter that a vLLM worker already holds, in place (docs/protocol.md#low-rank-es).

Loading P adapters per generation (``add_lora``: read, cast, pin, copy into the GPU slots, one
after another inside the engine) left an H200 idle for seconds per generation.  The low-rank
trainer therefore keeps its P adapters resident under stable ids and, each generation, overwrites
their weights here: the values are exactly what a fresh load of the same PEFT folder gives (same
float32 source, the same ``.to(lora_dtype)`` cast), so nothing recorded changes.

This is the one place that relies on vLLM internals (checked on vLLM 0.26 and 0.32):

- ``model_runner.lora_manager`` (the worker's LoRA manager) and its ``_adapter_manager``;
- ``get_adapter(id)``: the CPU ``LoRAModel`` vLLM loaded, whose ``loras[module]`` is a
  ``LoRALayerWeights`` (``lora_a`` R x in, ``lora_b`` out x R, ``scaling``) or, for a fused layer
  listed in ``packed_modules`` (``qkv_proj``, ``gate_up_proj``), a ``PackedLoRALayerWeights`` whose
  ``lora_a``/``lora_b``/``scaling`` are lists in that mapping's order;
- ``capacity`` (CPU adapters kept: an evicted adapter would be reloaded from its folder, which is
  gone), ``lora_index_to_id`` (the GPU slot of an active adapter), ``modules`` and
  ``_get_lora_layer_weights`` + ``set_lora``/``reset_lora``: the loop vLLM's ``activate_adapter``
  runs to copy an adapter into its slot.

Anything missing or of another shape raises :class:`Unsupported` before any tensor is written,
and the trainer goes back to loading adapter folders.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .lowrank import Target, in_parallel

MANAGER_ATTRS = ("get_adapter", "capacity", "lora_index_to_id", "modules", "packed_modules", "_get_lora_layer_weights")


class Unsupported(Exception):
    """This engine's LoRA structures are not the ones :mod:`lora_slots` knows how to rewrite."""


def adapter_manager(model_runner: Any) -> Any:
    """The worker's LoRA model manager (``model_runner.lora_manager._adapter_manager``)."""
    manager = getattr(getattr(model_runner, "lora_manager", None), "_adapter_manager", None)
    if manager is None:
        raise Unsupported("the worker has no LoRA manager (model_runner.lora_manager._adapter_manager)")
    missing = [name for name in MANAGER_ATTRS if not hasattr(manager, name)]
    if missing:
        raise Unsupported(f"the LoRA manager {type(manager).__name__} lacks {missing}")
    return manager


class AdapterTensors:
    """Where each target's ``(lora_a, lora_b)`` lives in one resident adapter's CPU ``LoRAModel``."""

    def __init__(self, manager: Any, lora_id: int, targets: Sequence[Target], rank: int) -> None:
        self.lora_id = int(lora_id)
        lora_model = manager.get_adapter(self.lora_id)
        if lora_model is None:
            raise Unsupported(f"adapter id {lora_id} is not resident in the worker")
        held = _unpacked(manager, lora_model)
        wanted = {t.name.removesuffix(".weight"): t for t in targets}
        if set(held) != set(wanted):
            extra, absent = sorted(set(held) - set(wanted)), sorted(set(wanted) - set(held))
            raise Unsupported(
                f"adapter {lora_id}: modules differ from the targets (extra {extra[:2]}, absent {absent[:2]})"
            )
        self.places: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for module, target in wanted.items():
            weights, index = held[module]
            a, b, scaling = (
                getattr(weights, k) if index is None else getattr(weights, k)[index]
                for k in ("lora_a", "lora_b", "scaling")
            )
            if scaling != 1:
                raise Unsupported(f"adapter {lora_id} {module}: scaling {scaling}, expected 1")
            if not (
                isinstance(a, torch.Tensor)
                and isinstance(b, torch.Tensor)
                and tuple(a.shape) == (rank, target.in_features)
                and tuple(b.shape) == (target.out_features, rank)
            ):
                got = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (a, b)]
                raise Unsupported(
                    f"adapter {lora_id} {module}: lora_a/lora_b are {got}, expected "
                    f"{(rank, target.in_features)} and {(target.out_features, rank)}"
                )
            self.places[module] = (a, b)

    def write_all(self, tensors: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Overwrite each module's factors with float32 ``(lora_a, lora_b)`` (R x in, out x R), cast
        as vLLM's load casts them, in one ``torch._foreach_copy_`` (its cast is the one ``.to``
        makes; thousands of small copies would otherwise each cost a Python round trip)."""
        unknown = sorted(set(tensors) - set(self.places))
        if unknown:
            raise KeyError(f"adapter {self.lora_id} has no modules {unknown[:3]}")
        places = [t for module in tensors for t in self.places[module]]
        values = [t for pair in tensors.values() for t in pair]
        for place, value in zip(places, values, strict=True):
            if place.shape != value.shape:
                raise ValueError(
                    f"adapter {self.lora_id}: a {tuple(value.shape)} tensor for a {tuple(place.shape)} place"
                )
        torch._foreach_copy_(places, values)


def _unpacked(manager: Any, lora_model: Any) -> dict[str, tuple[Any, int | None]]:
    """``{unpacked module name: (layer weights, index in a packed one or None)}``."""
    held: dict[str, tuple[Any, int | None]] = {}
    for name, weights in lora_model.loras.items():
        subs = manager.packed_modules.get(name)
        if subs:
            if not all(isinstance(getattr(weights, k, None), list) for k in ("lora_a", "lora_b", "scaling")):
                raise Unsupported(f"{name}: a packed module whose LoRA weights are not lists")
            for index, sub in enumerate(subs):
                if weights.lora_a[index] is not None:
                    held[sub] = (weights, index)
        else:
            held[name] = (weights, None)
    return held


def plan(manager: Any, lora_ids: Sequence[int], targets: Sequence[Target], rank: int) -> list[AdapterTensors]:
    """Every adapter's places, all checked before anything is written."""
    if manager.capacity < len(lora_ids):
        raise Unsupported(
            f"the engine keeps {manager.capacity} CPU adapters (max_cpu_loras), fewer than {len(lora_ids)}"
        )
    return [AdapterTensors(manager, lora_id, targets, rank) for lora_id in lora_ids]


def rewrite(
    manager: Any,
    places: Sequence[AdapterTensors],
    tensors_of: Callable[[int], Mapping[str, tuple[torch.Tensor, torch.Tensor]]],
) -> None:
    """Overwrite each of ``places``' CPU adapter with ``tensors_of(i)`` (``AdapterTensors.write_all``), in
    parallel, once the last refresh's copies out of them are done (:func:`settle`)."""
    with torch.no_grad():
        settle(manager)
        for _ in in_parallel(lambda i: places[i].write_all(tensors_of(i)), range(len(places))):
            pass


def copy_into_slots(manager: Any, lora_ids: Sequence[int], times: dict[str, float] | None = None) -> int:
    """Copy each active adapter's (rewritten) CPU weights into its GPU slot, as ``activate_adapter``
    does; an inactive one is copied from the CPU when next activated.  Returns the slots written;
    ``times`` (when given) gets the host's seconds per stage: :func:`stage_copy` then :func:`queue_copy`."""
    staged = stage_copy(manager, lora_ids, times)
    return 0 if staged is None else queue_copy(manager, staged, times)


class SlotCopy:
    """A copy into the GPU slots, gathered on the host and not issued yet (:func:`stage_copy`): the slots of
    ``lora_ids`` when it was gathered, the stacked writes with their places in a staging buffer, by device
    and dtype, and the layers that go through ``set_lora``/``reset_lora`` (``(layer, slot, weights or None)``)."""

    def __init__(
        self,
        lora_ids: list[int],
        slots: list[int],
        stacked: list[tuple[torch.device, list[_Write], list[torch.Tensor]]],
        one_by_one: list[tuple[Any, int, Any]],
    ) -> None:
        self.lora_ids, self.slots, self.stacked, self.one_by_one = lora_ids, slots, stacked, one_by_one

    def current(self, manager: Any) -> bool:
        """Whether every adapter still holds the slot it held when this was gathered (else: gather again)."""
        return self.slots == _active_slots(manager, self.lora_ids)


def _active_slots(manager: Any, lora_ids: Sequence[int]) -> list[int]:
    return [manager.lora_index_to_id.index(i) for i in lora_ids if i in manager.lora_index_to_id]


def stage_copy(manager: Any, lora_ids: Sequence[int], times: dict[str, float] | None = None) -> SlotCopy | None:
    """The host's half of :func:`copy_into_slots`: every active adapter's (rewritten) CPU weights gathered
    for their slots, nothing issued to the device (None: no adapter holds a GPU slot now; each is copied
    in when next activated).  Needs no device and no engine step: it may run while the engine generates,
    as long as the CPU adapters stay as they are until :func:`queue_copy`.

    A layer with vLLM's stacked slots (``lora_a_stacked``/``lora_b_stacked``: one tensor per slice,
    ``[slot, 1, rows, cols]``, tensor parallel size 1) gets every adapter's slot at once, where ``set_lora``
    per adapter costs a reset and a copy per slice each (16 adapters x 144 layers of small copies for a 4B
    model).  All such layers' values are stacked into one staging buffer on the host (pinned where there
    is a GPU, kept for the next refresh; :func:`_gather`), to be copied straight into each stacked tensor's
    slots.  A copy per stacked tensor from pageable memory made about 1,650 host-to-device copies that each
    waited for the device (4B: 504 stacked tensors x 3).  Any other layer goes through
    ``set_lora``/``reset_lora`` when the copy is queued."""
    ids = [int(i) for i in lora_ids]
    slots = _active_slots(manager, ids)
    if not slots:
        return None
    models = [manager.get_adapter(i) for i in ids if i in manager.lora_index_to_id]
    writes: list[_Write] = []
    one_by_one: list[tuple[Any, int, Any]] = []
    for module_name, module in manager.modules.items():
        weights = [manager._get_lora_layer_weights(lora_model, module_name) for lora_model in models]
        planned = _stacked_writes(module, weights) if all(weights) else None
        if planned is not None:
            writes += planned
        else:
            one_by_one += [(module, slot, w or None) for slot, w in zip(slots, weights)]
    groups: dict[tuple[torch.device, torch.dtype], list[_Write]] = {}
    for w in writes:  # a buffer per device and dtype of slot tensors (in practice one)
        groups.setdefault((w.target.device, w.target.dtype), []).append(w)
    stacked = [
        (device, group, _gather(manager, slots, group, device, dtype, times if times is not None else {}))
        for (device, dtype), group in groups.items()
    ]
    return SlotCopy(ids, slots, stacked, one_by_one)


def queue_copy(manager: Any, copy: SlotCopy, times: dict[str, float] | None = None) -> int:
    """The device's half of :func:`copy_into_slots`: issue ``copy``'s writes into the slots (nothing waits
    for the device; :func:`settle`).  Refused (``Unsupported``) where an adapter moved slots since it was
    gathered.  Returns the slots written; ``times`` gets ``queue_s``.

    Consecutive ascending slots (the resident adapters' usual case) take one slice per stacked tensor, so
    a widened layer's strided ``B`` views (:mod:`agent_envs.es.population_matmul`: written there, nothing
    else to copy) take the copy as they are and only padding beyond an adapter's rank is zeroed; other
    slots go through an index."""
    if not copy.current(manager):
        raise Unsupported(f"the adapters {copy.lora_ids} hold other slots than when their copy was gathered")
    start = time.perf_counter()
    for module, slot, w in copy.one_by_one:
        if w is not None:
            module.set_lora(slot, w.lora_a, w.lora_b)
        else:
            module.reset_lora(slot)
    for device, writes, places in copy.stacked:
        _issue(copy.slots, writes, places, device)
    if torch.cuda.is_available():  # this refresh's copies out of host memory, for the next one to wait on
        event = torch.cuda.Event()
        event.record()
        manager.__dict__[_COPIED] = event
    if times is not None:
        times["queue_s"] = times.get("queue_s", 0.0) + time.perf_counter() - start
    return len(copy.slots)


def settle(manager: Any) -> None:
    """Wait until the last refresh's copies out of host memory are done (the staging buffer's, and those
    vLLM's ``set_lora`` queues from the CPU adapters): before a refresh writes either again.  The copies
    themselves never wait: they queue on the stream the engine's next step runs on."""
    copied = manager.__dict__.pop(_COPIED, None)
    if copied is not None:
        copied.synchronize()


class _Write:
    """One stacked slot tensor's new values: ``parts`` (one ``rows x cols`` tensor per slot) into
    ``target[slot, 0, :rows, :cols]``, the rest of each slot's rows and columns zeroed; ``homes``: where
    each part lives in its CPU adapter (the layer weights, ``lora_a`` or ``lora_b``, the index in a
    packed layer's list or None), so the part can be made a view of the staging buffer."""

    def __init__(
        self, target: torch.Tensor, parts: list[torch.Tensor], homes: list[tuple[Any, str, int | None]]
    ) -> None:
        self.target, self.parts, self.homes = target, parts, homes
        self.rows, self.cols = parts[0].shape

    @property
    def size(self) -> int:
        return len(self.parts) * self.rows * self.cols

    def rehome(self, slot: int, view: torch.Tensor) -> None:
        """Make the CPU adapter hold ``view`` (its values already copied there) in place of part ``slot``."""
        weights, kind, index = self.homes[slot]
        if index is None:
            setattr(weights, kind, view)
        else:
            getattr(weights, kind)[index] = view
        self.parts[slot] = view


def _stacked_writes(module: Any, weights: list[Any]) -> list[_Write] | None:
    """The writes of ``weights`` (one per slot) into ``module``'s stacked slot tensors; None where the
    layer is not laid out as this expects (nothing is written then)."""
    stacks: dict[str, tuple[torch.Tensor, ...]] = {}
    for kind in ("lora_a", "lora_b"):
        stacked = getattr(module, f"{kind}_stacked", None)
        if not (isinstance(stacked, tuple) and stacked and all(isinstance(t, torch.Tensor) for t in stacked)):
            return None
        stacks[kind] = stacked
    if getattr(module, "tp_size", 1) != 1:
        return None
    writes = []
    for kind, stacked in stacks.items():
        packed = [isinstance(getattr(w, kind), list) for w in weights]
        per_slot = [getattr(w, kind) if p else [getattr(w, kind)] for w, p in zip(weights, packed)]
        if any(len(parts) != len(stacked) for parts in per_slot):
            return None
        for k, target in enumerate(stacked):
            parts = [parts[k] for parts in per_slot]
            if target.dim() != 4 or any(p is None or p.dim() != 2 or p.shape != parts[0].shape for p in parts):
                return None
            rows, cols = parts[0].shape
            if rows > target.shape[2] or cols > target.shape[3]:
                return None
            homes = [(w, kind, k if p else None) for w, p in zip(weights, packed)]
            writes.append(_Write(target, parts, homes))
    return writes


#: threads stacking the adapters into the host staging buffer (torch's copies let go of the interpreter
#: lock; at P = 256 on the 4B shape the buffer is 3.7 GB, about 0.6 s for one thread)
STACK_THREADS = 4
#: what a manager keeps between refreshes: host staging buffers by device, dtype and layout, and the event
#: after the last refresh's copies out of them (a refresh waits for it before it overwrites a buffer)
_STAGING, _COPIED = "_agent_envs_staging", "_agent_envs_staging_copied"


def _gather(
    manager: Any,
    slots: list[int],
    writes: list[_Write],
    device: torch.device,
    dtype: torch.dtype,
    times: dict[str, float],
) -> list[torch.Tensor]:
    """The writes' values gathered for ``slots`` (their slot tensors all on ``device``, in ``dtype``): one
    place per write in a host buffer kept on ``manager`` per device, dtype and layout (page-locked where
    there is a GPU).

    Each CPU adapter part gathered here becomes a view of its place in the buffer (:meth:`_Write.rehome`):
    the next refresh writes the adapters' new values (``AdapterTensors.write_all``, in place) straight
    into the buffer, and a part already there is not copied again.  A buffer is never shared by two
    layouts, so a view of one slot's place never overlaps another's.  Waits for the last refresh's copies
    out of the buffer first (:func:`settle`); ``times``: ``stack_s`` (that wait, then gathering what is not
    in place yet)."""
    start = time.perf_counter()
    settle(manager)  # the last refresh's copies have read the buffer
    layout = (tuple(slots), tuple((w.rows, w.cols, len(w.parts)) for w in writes))
    # each buffer with its places: made once per layout, since each view is a torch call that waits for the
    # interpreter lock beside the engine's loop (two per write, 1,008 a refresh on the 4B shape)
    buffers: dict[tuple[Any, ...], list[torch.Tensor]] = manager.__dict__.setdefault(_STAGING, {})
    places = buffers.get((device, dtype, layout))
    if places is None:  # a new layout: a buffer of its own (one no adapter part is a view of)
        for key in [k for k in buffers if k[:2] == (device, dtype)]:
            del buffers[key]  # freed once no adapter part is a view of it any more
        staging = torch.empty(sum(w.size for w in writes), dtype=dtype, pin_memory=device.type == "cuda")
        places, offset = [], 0
        for w in writes:
            places.append(staging[offset : offset + w.size].view(len(w.parts), w.rows, w.cols))
            offset += w.size
        buffers[device, dtype, layout] = places

    # which parts are not in place yet, found here: where none is (every refresh after a layout's first), no
    # thread is handed a job, each hand-over waiting for the interpreter lock beside the engine's loop
    jobs = [(w, place, away) for w, place in zip(writes, places) if (away := _away(w.parts, place))]

    def gather(job: tuple[_Write, torch.Tensor, list[int]]) -> None:
        w, place, away = job
        if len(away) == len(w.parts) and all(p.dtype == dtype for p in w.parts):
            torch.stack(w.parts, out=place)  # the first refresh of this layout: one copy for all slots
        else:
            for slot in away:
                place[slot].copy_(w.parts[slot])  # cast as the slot's own assignment would
        for slot in away:
            if w.parts[slot].dtype == dtype and w.parts[slot].device.type == "cpu":
                w.rehome(slot, place[slot])

    for _ in in_parallel(gather, jobs, STACK_THREADS):
        pass
    times["stack_s"] = times.get("stack_s", 0.0) + time.perf_counter() - start
    return places


def _issue(slots: list[int], writes: list[_Write], places: list[torch.Tensor], device: torch.device) -> None:
    """Copy each gathered place into its stacked slot tensor (:func:`queue_copy`)."""
    run = slice(slots[0], slots[0] + len(slots)) if slots == list(range(slots[0], slots[0] + len(slots))) else None
    index = None if run else torch.tensor(slots, dtype=torch.long).to(device)
    for w, place in zip(writes, places):
        if run:
            target = w.target[run, 0]
            target[:, : w.rows, : w.cols].copy_(place, non_blocking=True)
            if w.rows < target.shape[1]:  # vLLM's rank slot beyond the adapters' rank stays 0
                target[:, w.rows :].zero_()
            if w.cols < target.shape[2]:
                target[:, : w.rows, w.cols :].zero_()
        else:
            w.target.index_fill_(0, index, 0)
            w.target[index, 0, : w.rows, : w.cols] = place.to(device, non_blocking=True)


def _away(parts: list[torch.Tensor], place: torch.Tensor) -> list[int]:
    """The slots whose part is not ``place[slot]`` itself (a CPU adapter part made a view of its place),
    read from addresses and strides, not from a view made per slot to compare (which took about twice the
    host time of the refresh's stacking, ``benchmarks/bench_slot_writes.py``), under the interpreter's lock
    the engine's step loop needs while the refresh runs beside the rollouts."""
    base, step = place.data_ptr(), place.stride(0) * place.element_size()
    dtype, stride = place.dtype, place.stride()[1:]
    return [
        slot
        for slot, part in enumerate(parts)
        if part.data_ptr() != base + slot * step or part.dtype != dtype or part.stride() != stride
    ]


def slot_digest(manager: Any, lora_id: int) -> str:
    """SHA-256 over the adapter's CPU ``LoRAModel`` tensors and its GPU-slot tensors (every module's
    ``lora_a_stacked``/``lora_b_stacked`` row), in module order: equal for a rewritten adapter and a
    freshly loaded one of the same values, whatever their ids and slots."""
    import hashlib

    digest = hashlib.sha256()

    def add(label: str, tensor: torch.Tensor) -> None:
        digest.update(label.encode("utf-8"))
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())

    lora_model = manager.get_adapter(lora_id)
    for module, (weights, index) in sorted(_unpacked(manager, lora_model).items()):
        add(module, weights.lora_a if index is None else weights.lora_a[index])
        add(module, weights.lora_b if index is None else weights.lora_b[index])
    slot = manager.lora_index_to_id.index(lora_id)
    for module_name, module in manager.modules.items():
        for kind in ("lora_a_stacked", "lora_b_stacked"):
            stacks = getattr(module, kind, ())
            for k, stacked in enumerate((stacks,) if isinstance(stacks, torch.Tensor) else stacks):
                add(f"{module_name}.{kind}.{k}", stacked[slot])
    return digest.hexdigest()
