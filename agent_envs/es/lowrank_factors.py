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
#: members a drawing thread writes at once: each row of a target's stacked factors then gets 16 x R
#: consecutive values (whole cache lines), while the chunk's adapter arrays, read back for them, stay
#: in the cache (about 3 MB for a 4B model's widest target)
CHUNK = 16


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

    def adapters(self, buffer: Any, members: range, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Consecutive ``members``' ``lora_A`` (members x R x in) and ``lora_B`` (members x out x R) of
        target ``index``: one strided view each, a member's arrays one step of the first axis apart (for the
        drawing process; the engine's process makes one view per member with :meth:`adapter`, cheaper)."""
        step = self._before(len(self.targets)) * _FLOAT.itemsize
        lora_a, lora_b = self.adapter(buffer, members.start, index)
        return (
            np.lib.stride_tricks.as_strided(lora_a, (len(members), *lora_a.shape), (step, *lora_a.strides)),
            np.lib.stride_tricks.as_strided(lora_b, (len(members), *lora_b.shape), (step, *lora_b.strides)),
        )

    def draw_members(self, buffer: Any, members: range, seeds: list[int], sigma: float) -> None:
        """Write ``members`` (consecutive; member ``m``'s seed is ``seeds[m]``) into ``buffer``: their
        stacked columns and their adapter arrays, the bits of :func:`factors` and :func:`adapter_arrays`.

        One thread's block, so that threads do not write the same cache lines of the stacked columns at
        the same time.  Drawn :data:`CHUNK` members at a time, target by target: each member's ``A`` into
        its adapter's ``lora_B`` (scaled by ``sigma`` there by :func:`fill_adapter` once copied into its
        columns), its ``B`` into a scratch array reused for every target, then the chunk's columns of each
        row written at once.  Written member by member, a row of the stacked factors at P = 256 took one
        16-byte write per member, each on a page of its own: about as long as the draws themselves.
        """
        widest = max(t.in_features for t in self.targets)
        scratch = np.empty((min(CHUNK, len(members)), widest * self.rank), dtype=_FLOAT)
        for first in range(members.start, members.stop, CHUNK):
            chunk = range(first, min(first + CHUNK, members.stop))
            for index, target in enumerate(self.targets):
                lora_a, lora_b = self.adapters(buffer, chunk, index)
                b = scratch[: len(chunk), : target.in_features * self.rank]
                b = b.reshape(len(chunk), target.in_features, self.rank)
                for j, member in enumerate(chunk):
                    draw_factors(seeds[member], target, lora_b[j], b[j])
                columns_a, columns_b = self.columns(buffer, chunk, index)
                _whole(columns_a)[...] = _whole(lora_b).transpose(1, 0)
                _whole(columns_b)[...] = _whole(b).transpose(1, 0)
                for j in range(len(chunk)):
                    fill_adapter(lora_b[j], b[j], sigma, lora_a[j], lora_b[j])

    def columns(self, buffer: Any, members: range, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Consecutive ``members``' columns of target ``index``'s stacked factors, as (out x members x R)
        and (in x members x R) views."""
        a, b = self.stacked(buffer, index)
        columns = slice(members.start * self.rank, members.stop * self.rank)
        return (
            a[:, columns].reshape(a.shape[0], len(members), self.rank),
            b[:, columns].reshape(b.shape[0], len(members), self.rank),
        )


def _whole(factor: np.ndarray) -> np.ndarray:
    """``factor`` (... x R float32, the last axis contiguous) with each row of R values as one item: a
    transposing copy then moves R x 4 bytes a step, not 4 (at rank 4 on a 2-core host 0.4 against 7.4 ns
    a value)."""
    return factor.view(np.dtype((np.void, factor.shape[-1] * _FLOAT.itemsize)))[..., 0]


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
