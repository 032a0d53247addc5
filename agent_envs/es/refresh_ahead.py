"""The next generation's adapters written while this generation's rollouts run (docs/scaling.md).

A refresh (``ESWorkerExtension.es_lowrank_refresh``) has a host half: wait for the members' draws, write
them into the resident CPU adapters, gather those into the staging buffer in the GPU slots' layout
(:func:`lora_slots.stage_copy`); and a device half: the copy into the slots (:func:`lora_slots.queue_copy`).
Only the copy has to wait for the rollouts of the generation before to end, because they read the slots.
The host half needs nothing but the draws, which ``LowRankPerturber.prefetch`` starts when that
generation starts (its members' seeds and sigma are pure functions of the run's config).  On the 4B
shape at P = 16 the host half took 0.15-0.25 s after the last answer, the copy 0.01-0.02 s.
:class:`AheadWriter` runs the host half on a thread of its own once the draws are in, so the refresh
after the last answer only queues the copy.

Writing the CPU adapters while the engine generates is safe only because the engine reads them when it
activates an adapter into a slot, and the trainer's adapters are all active (an engine with a slot per
member, :func:`lowrank.lora_engine_keywords`): nothing is activated during its rollouts.  So the host
half is done ahead only where every member's adapter holds a GPU slot; elsewhere, or where anything
else fails, the refresh does it all itself, as before, and says why it was not written ahead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from . import adapter_blocks, lora_slots
from .drawn_members import DrawnMembers, MemberDraw
from .lowrank import DrawnAhead, LowRankPerturber, signed

#: a refresh's members: adapter ids, seeds, sigma and signs (+1 each where the call gave none)
RefreshKey = tuple[tuple[int, ...], tuple[int, ...], float, tuple[int, ...]]


def refresh_key(
    lora_ids: Sequence[int], seeds: Sequence[int], sigma: float, signs: Sequence[int] | None = None
) -> RefreshKey:
    """The key a refresh and the writes ahead of it are matched by."""
    if len(lora_ids) != len(seeds):
        raise ValueError(f"{len(lora_ids)} adapter ids for {len(seeds)} member seeds")
    if signs is not None and len(signs) != len(seeds):
        raise ValueError(f"{len(signs)} signs for {len(seeds)} member seeds")
    return (
        tuple(int(i) for i in lora_ids),
        tuple(int(s) for s in seeds),
        float(sigma),
        tuple(int(s) for s in signs) if signs is not None else (1,) * len(seeds),
    )


@dataclass(frozen=True)
class Written:
    """The host half of a refresh, done: the copy ready to queue, the members' draws (their factors are
    kept for the update of the same seeds), whether the CPU adapters were written a block per module
    (:mod:`adapter_blocks`) or one by one, and the seconds of the wait for the draws, of the
    writes into the CPU adapters and of the gathering (``stack_s``)."""

    key: RefreshKey
    copy: lora_slots.SlotCopy
    draws: DrawnMembers
    in_blocks: bool
    draw_wait_s: float
    write_s: float
    stack_s: float


def write_members(
    manager: Any,
    places: Sequence[lora_slots.AdapterTensors],
    ready: Mapping[int, MemberDraw],
    seeds: Sequence[int],
    signs: Sequence[int],
    tensors_of: Callable[[int], Mapping[str, tuple[torch.Tensor, torch.Tensor]]] | None = None,
) -> bool:
    """Write members ``seeds`` (adapter ``i`` member ``seeds[i]`` at ``signs[i]``) into ``places``' CPU
    adapters, for a refresh written ahead and one that writes itself alike: a block per module
    (:mod:`adapter_blocks`) where ``ready`` is one draw holding every member and the adapters lie and take
    their members in runs, else one adapter after another, adapter ``i`` as ``tensors_of(i)`` (default:
    its member's tensors in ``ready``, signed).  True: written in blocks."""
    if isinstance(ready, DrawnMembers) and all(int(s) in ready.index for s in seeds):
        found = adapter_blocks.find(places)
        if found is not None and adapter_blocks.write(
            manager, found, ready, [ready.index[int(s)] for s in seeds], signs
        ):
            return True
    lora_slots.rewrite(manager, places, tensors_of or (lambda i: signed(ready[seeds[i]][1], signs[i])))
    return False


def write_ahead(manager: Any, state: LowRankPerturber, key: RefreshKey, draws: Future[DrawnAhead]) -> Written:
    """The host half of the refresh ``key`` (:mod:`refresh_ahead`); raises ``Unsupported`` where an adapter
    holds no GPU slot, or where :func:`lora_slots.plan` refuses, before anything is written."""
    start = time.perf_counter()
    ready = draws.result().draws
    drawn = time.perf_counter()
    ids, seeds, sigma, signs = key
    idle = [i for i in ids if i not in manager.lora_index_to_id]
    if idle:
        raise lora_slots.Unsupported(
            f"adapters {idle[:3]} hold no GPU slot now (the engine would copy them in from the CPU adapters "
            "when it activates them, mid-generation): written when the refresh is asked for"
        )
    places = lora_slots.plan(manager, ids, state.targets, state.rank)
    missing = sorted(set(seeds) - set(ready))
    if missing:
        raise KeyError(f"the draws hold no members {missing[:3]}")
    in_blocks = write_members(manager, places, ready, seeds, signs)
    written = time.perf_counter()
    stages: dict[str, float] = {}
    with torch.no_grad():
        copy = lora_slots.stage_copy(manager, ids, stages)
    if copy is None:  # every adapter held a slot above: only an engine that moved them since gets here
        raise lora_slots.Unsupported("no adapter holds a GPU slot any more")
    return Written(key, copy, ready, in_blocks, drawn - start, written - drawn, time.perf_counter() - written)


class AheadWriter:
    """One refresh's host half at a time, on a thread of its own (:func:`write_ahead`)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[RefreshKey, Future[Written]] | None = None

    def start(self, manager: Any, state: LowRankPerturber, key: RefreshKey, draws: Future[DrawnAhead]) -> None:
        """Begin the host half of refresh ``key`` once ``draws`` are in (after any earlier one: one thread)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="es-write-ahead")
        self._pending = (key, self._pool.submit(write_ahead, manager, state, key, draws))

    def wait(self) -> None:
        """Until no host half is running (before anything else writes the CPU adapters, or captures a
        CUDA graph: a new staging buffer's page-locked allocation would break a capture)."""
        if self._pending is not None:
            self._pending[1].exception()

    def take(self, key: RefreshKey) -> tuple[Written | None, str | None]:
        """The host half done for ``key`` (waiting for it to finish), else None and why not (None: none was
        started); taken once either way."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None, None
        error = pending[1].exception()
        if error is not None:
            return None, f"{type(error).__name__}: {error}"
        if pending[0] != key:
            return None, "written ahead for other members"
        return pending[1].result(), None
