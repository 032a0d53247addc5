"""A generation's members written into the resident CPU adapters with a handful of torch calls, not a few
per member and module (docs/scaling.md#folded-into-the-matmul).

The refresh written ahead (:mod:`agent_envs.es.refresh_ahead`) runs while vLLM's scheduling loop drives the
rollouts in the same process, and every torch call there, a view's included, lets go of the interpreter lock
and takes it back: beside a thread that holds the lock, each waits up to a switch interval (5 ms).  Written
member by member (``lora_slots.rewrite``: a view per member, module and factor, a negation per mirrored
member and module, a copy per member) that is thousands of calls a generation; at P = 256 on the 135M shape
beside a busy thread, 117 s of writing and 20 s of letting go (benchmarks/bench_refresh_write.py).

Once a refresh has gathered the adapters for their slots, each module's factor of every adapter is a view of
one place of the staging buffer, the adapters' parts evenly spaced in slot order (``lora_slots._gather``);
and the drawing process lays each member's factors out at the same steps every member (:class:`Layout`).
So the same module of consecutive decoder layers sits at a constant step in both memories, and a whole run
of them is one strided view of each: the write is one copy for every run of every module, each member's
factors broadcast over the adapters that take it (a mirrored pair: two), and one negation.  Only
addresses, shapes and strides are read to find the runs (none of those calls lets go of the lock), and the
views are made bounds-checked: the adapters' by ``as_strided`` over their storage, the draws' by NumPy over
the draws' memory, so nothing outside either is ever written or read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import lora_slots
from .drawn_members import DrawnMembers

#: a module's name with its layer index taken out: the same module of every layer, one run where its steps allow
_LAYER = re.compile(r"\.\d+(\.|$)")


@dataclass(frozen=True)
class Block:
    """One factor of one module in ``count`` adapters: the first adapter's part, and the elements from one
    adapter's part to the next's (each part ``first``'s shape and strides)."""

    first: torch.Tensor
    step: int
    count: int

    @property
    def reach(self) -> int:
        """Elements from a part's first to one past its last."""
        return 1 + sum((n - 1) * s for n, s in zip(self.first.shape, self.first.stride()))

    @property
    def extent(self) -> int:
        """Elements from the first part's first to one past the last part's last."""
        return (self.count - 1) * self.step + self.reach


def find(places: Sequence[lora_slots.AdapterTensors]) -> dict[str, tuple[Block, Block]] | None:
    """Each module's ``(lora_a, lora_b)`` blocks over ``places``' adapters in their order, where every module's
    parts lie evenly spaced in ascending order without overlapping (as a refresh's gathering leaves them);
    None where any module's do not (a layout's first refresh: the adapters are then written one by one)."""
    if not places:
        return None
    found: dict[str, tuple[Block, Block]] = {}
    for module in places[0].places:
        pair = [_spaced([p.places[module][k] for p in places]) for k in (0, 1)]
        if pair[0] is None or pair[1] is None:
            return None
        found[module] = (pair[0], pair[1])
    return found


def _spaced(parts: list[torch.Tensor]) -> Block | None:
    """``parts`` as a :class:`Block` where they share shape, strides and dtype and lie at one step apart, each
    past the last one's end; else None.  Whether they share a storage is checked when the block is viewed."""
    first = parts[0]
    size, shape, stride, dtype = first.element_size(), first.shape, first.stride(), first.dtype
    base = first.data_ptr()
    step = (parts[1].data_ptr() - base) // size if len(parts) > 1 else first.numel()
    block = Block(first, step, len(parts))
    if step < block.reach or any(
        p.data_ptr() != base + j * step * size or p.stride() != stride or p.dtype != dtype or p.shape != shape
        for j, p in enumerate(parts)
    ):
        return None
    return block


def runs(rows: Sequence[int], signs: Sequence[int]) -> tuple[int, list[int]] | None:
    """``(k, the places in a run of k whose sign is -1)`` where adapter ``j`` takes member ``j // k`` with sign
    ``signs[j % k]`` (mirrored pairs: k = 2; each member once: k = 1); None where they take members otherwise."""
    k = list(rows).count(0)
    if k == 0 or len(rows) % k or len(signs) != len(rows):
        return None
    if any(row != j // k or sign != signs[j % k] for j, (row, sign) in enumerate(zip(rows, signs))):
        return None
    return k, [i for i in range(k) if signs[i] == -1]


@dataclass
class _Run:
    """Consecutive modules of one name pattern whose blocks and draws both lie at constant steps."""

    block: Block
    draws: np.ndarray  # the first module's members x ... factor in the draws' memory
    modules: int = 1
    block_step: int = 0  # elements between one module's block and the next's
    draws_step: int = 0  # bytes between one module's draws and the next's


def plan(found: dict[str, tuple[Block, Block]], draws: DrawnMembers) -> list[list[_Run]]:
    """The runs of each factor (``[lora_a runs, lora_b runs]``): each module's block beside its draws,
    grouped by name pattern and shapes, consecutive modules of a group joined while both steps hold."""
    factors: list[list[_Run]] = [[], []]
    open_runs: dict[tuple[Any, ...], _Run] = {}
    for module, blocks in found.items():
        arrays, pattern = draws.adapter_arrays(module), _LAYER.sub(r".#\1", module)
        for factor in (0, 1):
            block, array = blocks[factor], arrays[factor]
            first = block.first
            key = (factor, pattern, first.dtype, first.shape, first.stride(), block.step, array.strides)
            run = open_runs.get(key)
            if run is not None and _extends(run, block, array):
                run.modules += 1
                continue
            open_runs[key] = _Run(block, array)
            factors[factor].append(open_runs[key])
    return factors


def _extends(run: _Run, block: Block, array: np.ndarray) -> bool:
    """Whether ``block`` and ``array`` are the next module of ``run``: the steps its second module set (a
    block step past a whole block, so the run's view never writes one place twice)."""
    size = run.block.first.element_size()
    block_step = (block.first.data_ptr() - run.block.first.data_ptr()) // size
    draws_step = _address(array) - _address(run.draws)
    if run.modules == 1:
        if block_step < run.block.extent or draws_step <= 0:
            return False
        run.block_step, run.draws_step = block_step, draws_step
        return True
    return block_step == run.block_step * run.modules and draws_step == run.draws_step * run.modules


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def write(
    manager: Any, found: dict[str, tuple[Block, Block]], draws: DrawnMembers, rows: Sequence[int], signs: Sequence[int]
) -> bool:
    """Write the members ``rows`` (each adapter's member index in ``draws``) into the ``found`` blocks, adapter
    ``j``'s ``lora_B`` times ``signs[j]``: one copy and at most one negation for all modules, once the last
    refresh's copies out of the adapters are done (``lora_slots.settle``).  The bits of
    ``AdapterTensors.write_all`` with each adapter's own signed tensors: the cast is the same copy's, and
    negating after it is exact, as negating before it is.  False (nothing written) where the adapters do not
    take the members in runs (:func:`runs`): the caller writes them one by one."""
    taken = runs(rows, signs)
    if taken is None:
        return False
    k, negated = taken
    members = len(rows) // k
    start = _address(np.frombuffer(draws.buffer, dtype=np.uint8))  # the draws' memory, where their views start
    places, values, negate = [], [], []
    for factor, factor_runs in enumerate(plan(found, draws)):
        for run in factor_runs:
            first, step = run.block.first, run.block.step
            try:  # bounds-checked against the first part's storage: parts elsewhere are written one by one
                place = first.as_strided(
                    (run.modules, members, k, *first.shape), (run.block_step, k * step, step, *first.stride())
                )
            except RuntimeError:
                return False
            places.append(place)
            values.append(torch.from_numpy(_draws_view(draws, start, run, members, k)))
            if factor == 1:
                negate += [place.select(2, i) for i in negated]
    with torch.no_grad():
        lora_slots.settle(manager)
        torch._foreach_copy_(places, values)
        if negate:
            torch._foreach_neg_(negate)
    return True


def _draws_view(draws: DrawnMembers, start: int, run: _Run, members: int, k: int) -> np.ndarray:
    """``run``'s first ``members`` members' draws as (modules x members x k x ...), each member's factor
    repeated k times by a zero step: made over the draws' whole memory (at address ``start``), so NumPy
    refuses a view that reaches past it."""
    first = run.draws
    return np.ndarray(
        (run.modules, members, k, *first.shape[1:]),
        dtype=first.dtype,
        buffer=draws.buffer,
        offset=_address(first) - start,
        strides=(run.draws_step, first.strides[0], 0, *first.strides[1:]),
    )
