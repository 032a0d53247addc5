"""The plain low-rank update replayed as one CUDA graph (docs/scaling.md#folded-into-the-matmul).

On the H200 a 4B update at P = 16 took 0.15-0.22 s to issue: 252 targets, each a few copies and kernels
launched one by one from Python, while the device kept up (0.000 s waited after the last).  That issuing
is on every generation's critical path (the next generation's requests wait for the new weights), and at
P = 16 it is most of what separates a generation from 85% of raw generation.  Captured once, the same
calls are one launch a generation.

What is captured is exactly the eager update (``lowrank.deltas`` then ``LowRankPerturber._add``): each
target's factors copied from the page-locked staging buffer they lie in (``pinned_staging``), scaled by
the coefficient row, multiplied, squared and added, the same kernels in the same order on the same
weights, so the same bits.  Between generations of one run only the buffer's contents and the
coefficients change: the graph reads the buffer where it is (a graph per buffer: the staging alternates
between two) and the coefficients from a device row rewritten before each replay.  A graph is bound to
its buffer's address and layout (targets, members, rank); another layout captures anew.

It applies to the plain update rule (Adam keeps state per step) on one CUDA device, with the factors
stacked ahead in a page-locked buffer; anything else runs the eager update, and so does a run whose
capture the device refused (saying why).  On by default (:data:`ENV` = 0 turns it off): on the H200
(2026-12-05) the graph gave the eager update's bits (``tests/test_update_graph.py``) and was issued in
0.011-0.013 s against 0.17-0.21 s, and since the next generation's adapters are written during the
rollouts (:mod:`agent_envs.es.refresh_ahead`) nothing else beside it holds the update's call up.
``benchmarks/bench_es_generation.py --update-graph both`` times a generation both ways from one engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .perturb import SquareSum

#: 0 turns the update's CUDA graph off (on by default where it applies)
ENV = "AGENT_ENVS_ES_UPDATE_GRAPH"
#: graphs kept at once: one per staging buffer (pinned_staging alternates between two)
KEPT = 2

#: each target's stacked factors by target name: ``(A, B)``, views of the staging buffer
Stacked = Mapping[str, tuple[torch.Tensor, torch.Tensor]]
#: the update's calls: the coefficient row on the device -> the squares it summed
Body = Callable[[torch.Tensor], SquareSum]


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def why_not(
    devices: list[torch.device], staged: torch.Tensor | None, stacked: Stacked | None, plain: bool
) -> str | None:
    """Why this update cannot be replayed as a graph (None: it can)."""
    if not plain:
        return "Adam's update keeps state per step"
    places = set(devices)
    if len(places) != 1 or next(iter(places)).type != "cuda":
        return "the weights are not on one CUDA device"
    if staged is None or not stacked:
        return "the factors were not stacked ahead in a staging buffer"
    if not staged.is_pinned():
        return "the staging buffer is not page-locked (a graph cannot copy from pageable memory)"
    start = staged.data_ptr()
    end = start + staged.numel() * staged.element_size()
    for a, b in stacked.values():
        for view in (a, b):
            if not view.is_contiguous() or not start <= view.data_ptr() < view.data_ptr() + view.nbytes <= end:
                return "a target's factors do not lie in the staging buffer"
    return None


def _key(device: torch.device, staged: torch.Tensor, stacked: Stacked, rank: int) -> tuple[object, ...]:
    """What a graph is bound to: the device, the buffer's address, each target's factors in it."""
    base = staged.data_ptr()
    return (
        device,
        base,
        rank,
        tuple(
            (name, a.data_ptr() - base, tuple(a.shape), b.data_ptr() - base, tuple(b.shape))
            for name, (a, b) in stacked.items()
        ),
    )


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    #: the coefficient row the graph reads (rewritten before each replay)
    row: torch.Tensor
    #: the squares the graph sums (its outputs: read after each replay)
    squares: SquareSum


class UpdateGraph:
    """A perturber's update graphs, by buffer and layout: captured at a layout's first update, replayed after."""

    def __init__(self) -> None:
        self._graphs: dict[tuple[object, ...], _Captured] = {}
        self._ready: _Captured | None = None
        #: what the last :meth:`prepare` did: "captured" or "replayed"
        self.last = ""

    def prepare(
        self,
        body: Body,
        device: torch.device,
        staged: torch.Tensor,
        stacked: Stacked,
        rank: int,
        settle: Callable[[], None] = lambda: None,
    ) -> None:
        """The graph of this buffer and layout, captured from ``body`` unless kept (a capture runs nothing on
        the device: :meth:`run` does).  Called before other threads queue device work (the next adapters'
        refresh), and ``settle`` first ends what else could touch the device meanwhile (the next draws'
        staging): a capture must not meet another thread's synchronisation."""
        key = _key(device, staged, stacked, rank)
        kept = self._graphs.get(key)
        if kept is not None:
            self._ready, self.last = kept, "replayed"
            return
        if len(self._graphs) >= KEPT:  # another run's layouts: their memory goes before a new pool is taken
            self._graphs.clear()
        settle()
        row = torch.zeros(next(iter(stacked.values()))[0].size(1), dtype=torch.float32, device=device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # the side stream's matmul handle and workspace, made before the capture
            probe = torch.ones(8, 8, dtype=torch.float32, device=device)
            previous = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("highest")
            try:
                probe @ probe.T
            finally:
                torch.set_float32_matmul_precision(previous)
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        pool = next(iter(self._graphs.values())).graph.pool() if self._graphs else None  # never replayed together
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            squares = body(row)
        self._ready = self._graphs[key] = _Captured(graph, row, squares)
        self.last = "captured"

    def run(self, row: torch.Tensor) -> SquareSum:
        """The prepared graph with this update's coefficient row (its factors: in the buffer it was captured on)."""
        ready, self._ready = self._ready, None
        if ready is None:
            raise RuntimeError("no update graph prepared")
        ready.row.copy_(row)  # first: the stream is idle, so this small copy waits for nothing
        ready.graph.replay()
        return ready.squares
