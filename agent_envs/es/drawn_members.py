"""The members the drawing process drew into one memory file (:func:`agent_envs.es.lowrank.draw_ahead`), by
seed, with a member's views made when they are asked for.

Made all at once, a generation's views were a torch tensor and a NumPy array per member, target and
factor: about 129,000 of each at P = 256 on the 4B shape, made on the drawing thread and let go of after
the update, both beside vLLM's scheduling loop in the same process.  Letting go of them beside a thread
that holds the interpreter lock took 12-36 s on a 2-core host, 0.2-0.6 s alone (docs/scaling.md, the
draws at P = 256).  What the engine uses at scale needs none of them: the refresh written ahead takes
each target's adapters of all members at once (:meth:`DrawnMembers.adapter_arrays`), the update the
stacked factors.  A member's views are made only where something asks for that member (a refresh that
writes its adapters member by member, an update without the stacked factors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from .lowrank_factors import Layout

V = TypeVar("V")
#: one member's factors by target name and its PEFT tensors ``(lora_A, lora_B)`` by module name
MemberDraw = tuple[Mapping[str, tuple[np.ndarray, np.ndarray]], Mapping[str, tuple[torch.Tensor, torch.Tensor]]]


class _Views(Mapping[str, V]):
    """Target index by name, and a member's views of a target made on each access (none kept)."""

    def __init__(self, indices: dict[str, int], view: Callable[[int], V]) -> None:
        self._indices, self._view = indices, view

    def __getitem__(self, name: str) -> V:
        return self._view(self._indices[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._indices)

    def __len__(self) -> int:
        return len(self._indices)


class DrawnMembers(Mapping[int, MemberDraw]):
    """``{seed: (factors by target name, adapter tensors by module name)}`` of the members drawn into
    ``buffer`` as ``layout`` lays them out, member ``m`` of the layout being ``seeds[m]``: the views of
    :meth:`Layout.member` and :meth:`Layout.adapter`, the same memory and bits as before, made per access."""

    def __init__(self, layout: Layout, buffer: Any, seeds: Sequence[int]) -> None:
        if len(seeds) != layout.members:
            raise ValueError(f"{len(seeds)} seeds for a layout of {layout.members} members")
        self.layout, self.buffer = layout, buffer
        #: each seed's member index in the layout
        self.index = {int(s): m for m, s in enumerate(seeds)}
        if len(self.index) != len(seeds):
            raise ValueError("the seeds drawn must be distinct")
        self._targets = {t.name: i for i, t in enumerate(layout.targets)}
        self._modules = {t.name.removesuffix(".weight"): i for i, t in enumerate(layout.targets)}

    def __getitem__(self, seed: int) -> MemberDraw:
        member = self.index[int(seed)]
        return (
            _Views(self._targets, lambda i: self.layout.member(self.buffer, member, i)),
            _Views(self._modules, lambda i: self._tensors(self.layout.adapter(self.buffer, member, i))),
        )

    def __iter__(self) -> Iterator[int]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def adapter_arrays(self, module: str) -> tuple[np.ndarray, np.ndarray]:
        """Every member's ``lora_A`` (members x R x in) and ``lora_B`` (members x out x R) of ``module``, in
        the layout's member order: one strided array each over the members' adapter arrays (no torch call:
        :mod:`agent_envs.es.adapter_blocks` makes its few views of them)."""
        return self.layout.adapters(self.buffer, range(self.layout.members), self._modules[module])

    @staticmethod
    def _tensors(arrays: tuple[np.ndarray, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1])
