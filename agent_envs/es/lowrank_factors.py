"""A low-rank member's factors, drawn from its seed (docs/protocol.md#low-rank-es), and a process of
their own to draw a population's factors in.

Torch-free on purpose: the engine draws the next generation's members while vLLM's scheduling loop
runs in the same process, and there each of the draws (one per target, 252 per member on a 4B model)
waits for the interpreter lock after its fill: on a 2-core machine 19-41x slower than alone
(benchmarks/bench_lowrank_draw.py), on the H200 4.41 s of waiting at P = 256.  So
``python -m agent_envs.es.lowrank_factors`` draws them in a child process, straight into one shared
buffer laid out by :class:`Layout`, in the form both users want: each target's factors stacked in
member order (the update's ``[A_1 | ... | A_U]``) and each member's adapter arrays (the refresh's
``lora_A``, ``lora_B``).  The child draws with the very same :func:`draw_factors` as :func:`factors`,
into place, and fills the adapter arrays with the same :func:`fill_adapter` as :func:`adapter_arrays`,
so the bits are those of drawing in the engine's process (tests/test_lowrank_factors.py).
"""

from __future__ import annotations

import itertools
import json
import math
import mmap
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .tensor_seeds import tensor_seed

#: threads of the drawing process: NumPy's generators release the interpreter lock while they fill, but
#: the engine's loop and the driver need cores of their own meanwhile
DRAW_THREADS = max(1, (os.cpu_count() or 1) // 4)
_FLOAT = np.dtype(np.float32)


@dataclass(frozen=True)
class Target:
    """One perturbed weight: its unpacked name and shape."""

    name: str
    out_features: int
    in_features: int

    def as_list(self) -> list[Any]:
        return [self.name, self.out_features, self.in_features]


def draw_factors(seed: int, target: Target, a: np.ndarray, b: np.ndarray) -> None:
    """Fill ``a`` (out x R, float32, contiguous) with member ``seed``'s ``A`` of ``target``, already / sqrt(R),
    and ``b`` (in x R) with its ``B``: where they are drawn in place, not copied from arrays of their own."""
    rng = np.random.Generator(np.random.PCG64(tensor_seed(seed, target.name)))
    rng.standard_normal(dtype=np.float32, out=a)
    np.multiply(a, np.float32(1.0 / math.sqrt(a.shape[1])), out=a)
    rng.standard_normal(dtype=np.float32, out=b)


def factors(seed: int, target: Target, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)`` of member ``seed`` for ``target``: float32 arrays (out x R, already / sqrt(R)) and (in x R)."""
    a, b = np.empty((target.out_features, rank), dtype=_FLOAT), np.empty((target.in_features, rank), dtype=_FLOAT)
    draw_factors(seed, target, a, b)
    return a, b


def fill_adapter(a: np.ndarray, b: np.ndarray, sigma: float, lora_a: np.ndarray, lora_b: np.ndarray) -> None:
    """Fill PEFT's ``lora_A`` (R x in) with ``B^T`` and ``lora_B`` (out x R) with ``sigma * A``, in float32;
    ``lora_b`` may be ``a`` itself (scaled in place, as the drawing process does)."""
    np.multiply(a, np.float32(sigma), out=lora_b)
    lora_a[...] = b.T


def adapter_arrays(a: np.ndarray, b: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """PEFT's ``(lora_A, lora_B)`` of factors ``(A, B)`` (:func:`fill_adapter`), in arrays of their own."""
    lora_a, lora_b = np.empty((b.shape[1], b.shape[0]), dtype=_FLOAT), np.empty(a.shape, dtype=_FLOAT)
    fill_adapter(a, b, sigma, lora_a, lora_b)
    return lora_a, lora_b


@dataclass(frozen=True)
class Layout:
    """Where the factors of ``members`` members lie in one float32 buffer: first, per target, the
    stacked ``[A_1 | ... | A_U]`` (out x U R) and ``[B_1 | ... | B_U]`` (in x U R); then, per member and
    target, ``lora_A`` (R x in) and ``lora_B`` (out x R)."""

    targets: tuple[Target, ...]
    members: int
    rank: int

    @cached_property
    def _starts(self) -> tuple[int, ...]:
        """Float32 values of one member's factors of the targets before each index (and of all of them, last):
        summed once, not once per view (a P = 256 prefetch on the 4B shape takes about 130,000 views)."""
        return (0, *itertools.accumulate(self.rank * (t.out_features + t.in_features) for t in self.targets))

    def _before(self, index: int) -> int:
        """Float32 values of one member's factors of the targets before ``index``."""
        return self._starts[index]

    @property
    def values(self) -> int:
        """The buffer's length in float32 values."""
        return 2 * self.members * self._before(len(self.targets))

    @property
    def nbytes(self) -> int:
        return self.values * _FLOAT.itemsize

    def _view(self, buffer: Any, offset: int, shape: tuple[int, int]) -> np.ndarray:
        return np.ndarray(shape, dtype=_FLOAT, buffer=buffer, offset=offset * _FLOAT.itemsize)

    def stacked_spans(self, index: int) -> tuple[tuple[int, tuple[int, int]], tuple[int, tuple[int, int]]]:
        """Where target ``index``'s stacked ``A`` and ``B`` lie: (offset in float32 values, shape) each, all
        within the buffer's first half."""
        target, width = self.targets[index], self.members * self.rank
        start = self.members * self._before(index)
        return (start, (target.out_features, width)), (start + target.out_features * width, (target.in_features, width))

    def stacked(self, buffer: Any, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Target ``index``'s ``([A_1 | ... | A_U], [B_1 | ... | B_U])`` in ``buffer``."""
        (start_a, shape_a), (start_b, shape_b) = self.stacked_spans(index)
        return self._view(buffer, start_a, shape_a), self._view(buffer, start_b, shape_b)

    def member(self, buffer: Any, member: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Member ``member``'s ``(A, B)`` of target ``index``: its columns of the stacked factors."""
        columns = slice(member * self.rank, (member + 1) * self.rank)
        a, b = self.stacked(buffer, index)
        return a[:, columns], b[:, columns]

    def adapter(self, buffer: Any, member: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Member ``member``'s ``(lora_A, lora_B)`` of target ``index`` in ``buffer``."""
        target = self.targets[index]
        start = self.values // 2 + member * self._before(len(self.targets)) + self._before(index)
        return (
            self._view(buffer, start, (self.rank, target.in_features)),
            self._view(buffer, start + self.rank * target.in_features, (target.out_features, self.rank)),
        )

    def draw_member(self, buffer: Any, member: int, seed: int, sigma: float) -> None:
        """Write member ``member`` (seed ``seed``) into ``buffer``: its stacked columns and its adapter arrays.

        The bits of :func:`factors` and :func:`adapter_arrays`, with no array made per target: ``A`` is
        drawn into the adapter's ``lora_B`` (copied into its columns, then scaled by ``sigma`` there by
        :func:`fill_adapter`), ``B`` into one scratch array reused for every target.  A fresh array per
        draw is the memory traffic of a second copy of every factor.
        """
        scratch = np.empty(self.rank * max(t.in_features for t in self.targets), dtype=_FLOAT)
        for index, target in enumerate(self.targets):
            columns_a, columns_b = self.member(buffer, member, index)
            lora_a, lora_b = self.adapter(buffer, member, index)
            b = scratch[: target.in_features * self.rank].reshape(target.in_features, self.rank)
            draw_factors(seed, target, lora_b, b)
            columns_a[...] = lora_b
            fill_adapter(lora_b, b, sigma, lora_a, lora_b)
            columns_b[...] = b

    def draw_members(self, buffer: Any, members: range, seeds: list[int], sigma: float) -> None:
        """:meth:`draw_member` for each of ``members`` (consecutive) in order: one thread's block, so that
        threads do not write the same cache lines of the stacked columns (four members' columns of a row
        share one) at the same time."""
        for member in members:
            self.draw_member(buffer, member, seeds[member], sigma)


def request(fd: int, seeds: list[int], layout: Layout, sigma: float, threads: int) -> str:
    """The child's one line of input: draw ``seeds`` (one per member of ``layout``) into the memory file ``fd``."""
    return json.dumps(
        {
            "fd": fd,
            "seeds": seeds,
            "targets": [t.as_list() for t in layout.targets],
            "rank": layout.rank,
            "sigma": sigma,
            "threads": threads,
        }
    )


def main() -> None:
    """The child: read a :func:`request` and draw every member into the shared buffer (its exit status says how it went)."""
    asked = json.loads(sys.stdin.readline())
    layout = Layout(tuple(Target(*t) for t in asked["targets"]), len(asked["seeds"]), int(asked["rank"]))
    buffer = mmap.mmap(asked["fd"], layout.nbytes)  # not closed: the views drawn into it may outlive a close
    seeds, threads = [int(s) for s in asked["seeds"]], int(asked["threads"])
    blocks = [range(len(seeds) * k // threads, len(seeds) * (k + 1) // threads) for k in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        jobs = [pool.submit(layout.draw_members, buffer, block, seeds, float(asked["sigma"])) for block in blocks]
        for job in jobs:
            job.result()


if __name__ == "__main__":
    main()
