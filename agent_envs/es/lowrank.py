"""Low-rank ES noise: each member perturbs every targeted 2-D weight by a rank-R product drawn from
its seed (docs/protocol.md#low-rank-es; the idea of EGGROLL, arXiv 2511.16652).

For a weight ``W`` (out x in) named ``name`` and member seed ``s``, the factors are
``A = N(0,1)^(out x R) / sqrt(R)`` and ``B = N(0,1)^(in x R)``, drawn in that order, in float32, from
NumPy's PCG64 seeded with ``(s XOR blake2b-8(name)) mod 2**64``: the same bits on every machine
and device (no torch generator, whose streams depend on the device and the SIMD path), so adapters
written by the driver, the in-place update inside the workers and a replay on another host all use
the very same factors.  ``E = A B^T`` has unit element variance, so sigma keeps the reference's
meaning of a per-element noise scale.

- member i is served as ``W + sigma * A_i B_i^T``: a LoRA adapter (``lora_B = sigma * A_i``,
  ``lora_A = B_i^T``, scaling 1), so the base weights never change during a generation; the second
  member of a mirrored pair (agent_envs.es.update_rule) is ``W - sigma * A_i B_i^T`` (``lora_B``
  negated: the same bits as ``-sigma * A_i``);
- the update is ``W += alpha / (N * sigma) * sum_i w_i A_i B_i^T``: per target one float32 product
  ``[c_1 A_1 | ... | c_N A_N] @ [B_1 | ... | B_N]^T`` (``c_i = float32(alpha * w_i / (N * sigma))``),
  cast once to the weight's dtype and added in place; with Adam the product is taken with
  ``alpha = 1`` (the direction ``g``) and ``alpha * m_hat / (sqrt(v_hat) + eps)`` is added instead.

Targets are named as the unpacked Hugging Face weights (``model.layers.0.self_attn.q_proj.weight``)
even where vLLM packs them (``qkv_proj``, ``gate_up_proj``: rows split by the layer's
``output_sizes``), so the same names seed the adapters, the engine update and
:func:`replay_onto` a plain checkpoint folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from .draw_memory import DrawMemory, new_file
from .drawn_members import DrawnMembers, MemberDraw
from .fingerprint import fingerprint
from .normalize import weight_norm
from .lowrank_factors import DRAW_THREADS, Layout, Target, adapter_arrays, factors, request
from .perturb import SquareSum
from . import update_graph
from .pinned_staging import PinnedStaging
from .update_rule import Adam, optimizer_settings

T = TypeVar("T")
R = TypeVar("R")

PERTURBATION = "lowrank"
#: the decoder's linear weights in Hugging Face names (PEFT's "all-linear" for Llama/Qwen-style models)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: vLLM's fused layers and the weights they hold, row-stacked in this order
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
#: the values vLLM accepts for ``max_lora_rank``
LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: threads that draw factors: NumPy's generators release the GIL, so a 4B model's population of
#: factors (about 130 million normals at P=16, rank 4) is drawn in parallel rather than in seconds
FACTOR_THREADS = max(1, min(32, os.cpu_count() or 1))
#: the folder that holds the agent_envs package: the drawing process imports it from there
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Slot:
    """Where a target lives in a model: rows ``row .. row + out_features`` of ``param``."""

    target: Target
    param: torch.Tensor
    row: int

    def rows(self) -> torch.Tensor:
        return self.param.data[self.row : self.row + self.target.out_features]


def check_rank(rank: Any) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"the low-rank perturbation's rank must be an integer >= 1, got {rank!r}")
    return rank


def lora_rank_slot(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``rank``."""
    rank = check_rank(rank)
    for slot in LORA_RANK_SLOTS:
        if slot >= rank:
            return slot
    raise ValueError(f"rank {rank} exceeds vLLM's largest LoRA rank {LORA_RANK_SLOTS[-1]}")


def lora_engine_keywords(slots: int, rank: int, targets: Sequence[str] = DEFAULT_TARGETS) -> dict[str, Any]:
    """``vllm.LLM`` keywords of an engine that serves ``slots`` resident adapters of rank ``rank`` on the
    layers ``targets``.  ``lora_target_modules`` keeps vLLM's LoRA wrappers to those layers: without it vLLM
    wraps every module it supports, the token embedding (and, on a model with its own output head, the
    logits) included, and each of those runs its LoRA kernels on every step with adapters, for adapters that
    hold nothing there, and keeps a vocabulary-sized factor per slot (0.6 GB at 256 slots on Qwen3-4B)."""
    return {
        "enable_lora": True,
        "max_loras": slots,
        "max_cpu_loras": slots,
        "max_lora_rank": lora_rank_slot(rank),
        "lora_target_modules": list(targets),
    }


def update_coefficients(weights: Sequence[float], alpha: float, sigma: float) -> list[float]:
    """``alpha * w_i / (N * sigma)`` for each member (float64; cast to float32 where applied)."""
    if not weights:
        raise ValueError("a low-rank update needs at least one member weight")
    for label, value in (("alpha", alpha), ("sigma", sigma)):
        if not math.isfinite(float(value)) or float(value) < 0:
            raise ValueError(f"{label} must be finite and >= 0, got {value!r}")
    if float(sigma) == 0.0:
        raise ValueError("the low-rank update divides by sigma; sigma must be > 0")
    bad = [w for w in weights if not math.isfinite(float(w))]
    if bad:
        raise ValueError(f"update weights must be finite, got {bad[:3]}")
    n = len(weights)
    return [float(alpha) * float(w) / (n * float(sigma)) for w in weights]


#: where an update's factors come from: :func:`factors`, or arrays already drawn from it
FactorSource = Callable[[int, Target, int], tuple[np.ndarray, np.ndarray]]


def update_terms(
    seeds: Sequence[int], target: Target, rank: int, draw: FactorSource = factors
) -> tuple[torch.Tensor, torch.Tensor]:
    """``([A_1 | ... | A_N], [B_1 | ... | B_N])`` of ``target``: float32 host tensors, unscaled (the
    coefficients are applied by :func:`product`, on its device)."""
    pairs = [draw(s, target, rank) for s in seeds]
    return (
        torch.from_numpy(np.concatenate([a for a, _ in pairs], axis=1)),
        torch.from_numpy(np.concatenate([b for _, b in pairs], axis=1)),
    )


def coefficient_row(coefs: Sequence[float], rank: int) -> torch.Tensor:
    """``[c_1] * R + ... + [c_N] * R`` in float32: the column scales of ``[A_1 | ... | A_N]``."""
    return torch.from_numpy(np.repeat(np.asarray(coefs, dtype=np.float32), rank))


def product(
    stacked_a: torch.Tensor, stacked_b: torch.Tensor, coef_row: torch.Tensor, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``(stacked_a * coef_row) @ stacked_b^T`` on ``device`` at full float32 matmul precision (each
    column scaled by one correctly rounded float32 multiply: the same bits on any device)."""
    # from page-locked factors (pinned_staging) the copies queue behind each other without waiting
    left = stacked_a.to(device, non_blocking=True) * coef_row.to(device)
    right = stacked_b.to(device, non_blocking=True)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # no TF32: the same bits on every run of this device
    try:
        return left @ right.T
    finally:
        torch.set_float32_matmul_precision(previous)


def delta(
    seeds: Sequence[int], coefs: Sequence[float], target: Target, rank: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``sum_i coef_i A_i B_i^T`` as one float32 product on ``device`` (full float32 matmul precision)."""
    return product(*update_terms(seeds, target, rank), coefficient_row(coefs, rank), device)


#: where an update's stacked factors come from, by target: :func:`update_terms`, or already stacked
TermSource = Callable[[Target], tuple[torch.Tensor, torch.Tensor]]


def deltas(
    seeds: Sequence[int],
    coefs: Sequence[float],
    targets: Sequence[Target],
    rank: int,
    devices: Sequence[Any],
    draw: FactorSource = factors,
    stacked: TermSource | None = None,
    rows: Mapping[torch.device, torch.Tensor] | None = None,
) -> Iterator[torch.Tensor]:
    """:func:`delta` of each target in order (on ``devices[k]``): the factors drawn (by ``draw``) and
    stacked on :data:`FACTOR_THREADS` threads a few targets ahead of the products, or taken from
    ``stacked``; the same bits as one :func:`delta` after another.  ``rows``: the coefficient row already
    on each device (an update graph's, rewritten before each replay; ``coefs`` is then not read)."""
    terms = map(stacked, targets) if stacked else in_parallel(lambda t: update_terms(seeds, t, rank, draw), targets)
    row = coefficient_row(coefs, rank) if rows is None else None
    # the row copied to each device once: a copy from pageable memory per target would make the host
    # wait for the device 252 times an update on the 4B shape (0.22 s at P = 16, 16 members)
    placed: dict[torch.device, torch.Tensor] = dict(rows or {})
    for (stacked_a, stacked_b), device in zip(terms, devices):
        place = torch.device(device)
        if place not in placed:
            if row is None:
                raise ValueError(f"no coefficient row given for {place}")
            placed[place] = row.to(place)
        yield product(stacked_a, stacked_b, placed[place], device)


def in_parallel(fn: Callable[[T], R], items: Sequence[T], threads: int | None = None) -> Generator[R, None, None]:
    """``map(fn, items)`` on a thread pool, results in order, at most twice the threads in flight
    (a 4B model's terms held all at once would be gigabytes)."""
    threads = threads or FACTOR_THREADS
    if threads == 1 or len(items) < 2:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="es-factors") as pool:
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


@dataclass(frozen=True)
class DrawnAhead:
    """What :meth:`LowRankPerturber.prefetch` drew: each member's draw by seed (its views made when asked
    for), each target's factors stacked in member order (:func:`update_terms`) for the update of the same
    seeds, and the staged copy those stacked factors are views of (:mod:`pinned_staging`; None where they
    are the draws' own memory)."""

    draws: DrawnMembers
    stacked: dict[str, tuple[torch.Tensor, torch.Tensor]]
    staged: torch.Tensor | None = None


def draw_ahead(
    seeds: Sequence[int],
    targets: Sequence[Target],
    rank: int,
    sigma: float,
    staging: PinnedStaging | None = None,
    busy: torch.Tensor | None = None,
    threads: int = DRAW_THREADS,
    memory: DrawMemory | None = None,
) -> DrawnAhead:
    """Members ``seeds``' draws and stacked factors, drawn by ``python -m agent_envs.es.lowrank_factors``
    into an anonymous memory file: the same bits as :func:`member_draw` and :func:`update_terms`, without
    waiting on this process's interpreter lock.  The file is one of ``memory``'s that nothing maps any
    more, else a new one (gone with its last mapping where ``memory`` does not keep it).  With ``staging``
    the stacked factors are copied into its page-locked buffer that ``busy`` is not.  ``threads``: the
    drawing process's."""
    layout = Layout(tuple(targets), len(seeds), rank)
    fd, kept = memory.file(layout.nbytes) if memory is not None else (new_file(layout.nbytes), False)
    try:
        child = subprocess.run(
            [sys.executable, "-m", "agent_envs.es.lowrank_factors"],
            input=request(fd, [int(s) for s in seeds], layout, float(sigma), threads) + "\n",
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])),
            },
            check=False,
        )
        if child.returncode != 0:
            raise RuntimeError(
                f"drawing {len(seeds)} members' factors failed (exit {child.returncode}): {child.stderr[-2000:]}"
            )
        # page tables filled here, in the background, rather than page by page during the refresh and update
        buffer = mmap.mmap(fd, layout.nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    finally:
        if not kept:
            os.close(fd)
    if memory is not None and kept:
        memory.mapped(fd, buffer)
    draws = DrawnMembers(layout, buffer, seeds)
    if staging is None:
        stacked = {
            t.name: tuple(map(torch.from_numpy, layout.stacked(buffer, i))) for i, t in enumerate(layout.targets)
        }
        return DrawnAhead(draws, stacked)
    staged = staging.stage(np.frombuffer(buffer, dtype=np.float32, count=layout.values // 2), busy)
    stacked = {
        t.name: tuple(staged[at : at + rows * cols].view(rows, cols) for at, (rows, cols) in layout.stacked_spans(i))
        for i, t in enumerate(layout.targets)
    }
    return DrawnAhead(draws, stacked, staged)


def member_draw(targets: Sequence[Target], seed: int, sigma: float, rank: int) -> MemberDraw:
    """Member ``seed``'s factors of every target and the adapter tensors made of them."""
    drawn = {t.name: factors(seed, t, rank) for t in targets}
    return drawn, {name.removesuffix(".weight"): adapter_tensors(a, b, sigma) for name, (a, b) in drawn.items()}


def signed(
    tensors: Mapping[str, tuple[torch.Tensor, torch.Tensor]], sign: int
) -> Mapping[str, tuple[torch.Tensor, torch.Tensor]]:
    """A member's adapter tensors for the perturbation ``sign * sigma * A B^T`` (``lora_B`` negated)."""
    return tensors if sign > 0 else {name: (lora_a, -lora_b) for name, (lora_a, lora_b) in tensors.items()}


def _stacked_from(kept: dict[str, tuple[torch.Tensor, torch.Tensor]] | None) -> TermSource | None:
    """:func:`deltas`'s ``stacked``: each target's factors from ``kept`` (stacked ahead), or None to stack them."""
    return None if kept is None else (lambda target: kept[target.name])


def update_changes(
    targets: Sequence[Target],
    products: Iterable[torch.Tensor],
    alpha: float,
    adam: Adam | None,
) -> Iterator[torch.Tensor]:
    """What each target gets added: ``products`` as they are (drawn with ``alpha`` in the coefficients),
    or with Adam (drawn with ``alpha = 1``) ``alpha`` times Adam's direction (float32)."""
    if adam is None:
        yield from products
        return
    corrections = adam.begin()
    for target, g in zip(targets, products, strict=True):
        yield adam.direction(target.name, g, g.numel(), corrections) * float(alpha)


def find_slots(model: nn.Module, target_modules: Sequence[str] | None = None) -> list[Slot]:
    """The targeted weights of ``model`` (a torch model or a vLLM one, LoRA-wrapped or not), in
    module order.  A fused vLLM layer is split into its unpacked weights by ``output_sizes``."""
    wanted = set(target_modules or DEFAULT_TARGETS)
    packed = {**PACKED, **{k: tuple(v) for k, v in dict(getattr(model, "packed_modules_mapping", {}) or {}).items()}}
    slots: list[Slot] = []
    for module_name, module in model.named_modules():
        weight = module._parameters.get("weight")
        if weight is None or weight.dim() != 2:
            continue
        path = module_name.removesuffix(".base_layer")  # vLLM's LoRA wrapper holds the layer as base_layer
        parent, _, leaf = path.rpartition(".")
        prefix = f"{parent}." if parent else ""
        if leaf in packed and wanted & set(packed[leaf]):
            slots.extend(_split_packed(module, weight, prefix, packed[leaf], wanted, path))
        elif leaf in wanted:
            slots.append(Slot(Target(f"{path}.weight", int(weight.shape[0]), int(weight.shape[1])), weight, 0))
    if not slots:
        raise ValueError(f"no 2-D weight of the model matches the low-rank targets {sorted(wanted)}")
    empty = [s.target.name for s in slots if s.param.numel() == 0]
    if empty:
        raise RuntimeError(
            f"{len(empty)} targeted weights are empty (e.g. {empty[:3]}): the engine moved them into "
            "packed kernels, so an update would change nothing"
        )
    return slots


def _split_packed(
    module: nn.Module, weight: torch.Tensor, prefix: str, subs: Sequence[str], wanted: set[str], path: str
) -> Iterable[Slot]:
    sizes = [int(x) for x in getattr(module, "output_sizes", [])]
    if len(sizes) != len(subs) or sum(sizes) != weight.shape[0]:
        raise ValueError(
            f"{path}: cannot split the fused weight {tuple(weight.shape)} into {list(subs)} "
            f"(output_sizes {sizes}); the low-rank perturbation supports tensor_parallel_size=1 only"
        )
    row = 0
    for sub, size in zip(subs, sizes):
        if sub in wanted:
            yield Slot(Target(f"{prefix}{sub}.weight", size, int(weight.shape[1])), weight, row)
        row += size


def targets_checksum(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over (name, raw bytes) of each target, sorted by name: the same value for a vLLM engine
    and a plain checkpoint holding the same weights in the same dtype."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda item: item[0]):
        digest.update(name.encode("utf-8"))
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


class Alongside:
    """What :func:`alongside` ran: its own seconds (None until it has run)."""

    seconds: float | None = None


@contextmanager
def alongside(work: Callable[[], None] | None, devices: Sequence[torch.device]) -> Iterator[Alongside]:
    """Run ``work`` on a thread of its own while the body runs; wait for it at the end (its error
    raised then, unless the body's own is on the way).  The thread queues its device work on the
    streams current here, so it stays ordered with this thread's (a thread's current CUDA stream is
    its own, the default one unless set)."""
    ran = Alongside()
    if work is None:
        yield ran
        return
    streams = [torch.cuda.current_stream(d) for d in dict.fromkeys(devices) if d.type == "cuda"]

    def run() -> None:
        start = time.perf_counter()
        with ExitStack() as stack:
            for stream in streams:
                stack.enter_context(torch.cuda.stream(stream))
            work()
        ran.seconds = time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="es-alongside") as pool:
        future = pool.submit(run)
        try:
            yield ran
        except BaseException:
            wait([future])
            raise
        future.result()


class LowRankPerturber:
    """Low-rank merge/restore (for checks) and in-place updates on a model's targeted weights.

    Serving a member needs no weight change (its adapter does that); :meth:`apply` merges a member's
    perturbation into the weights only to compare the two, and keeps a copy so :meth:`revert`
    restores them bit for bit."""

    perturbation_kind = PERTURBATION
    tp_size = 1

    def __init__(self, model: nn.Module, rank: int, target_modules: Sequence[str] | None = None) -> None:
        self.rank = check_rank(rank)
        self.target_modules = list(target_modules or DEFAULT_TARGETS)
        self.slots = find_slots(model, self.target_modules)
        self.targets = [s.target for s in self.slots]
        self.updates: list[dict[str, Any]] = []
        self.merged: dict[str, Any] | None = None
        self._saved: list[torch.Tensor] = []
        #: factors drawn for resident adapters (:meth:`member_adapter`), by seed and target name,
        #: used by the next :meth:`update` instead of drawing them again, then dropped
        self.drawn: dict[int, Mapping[str, tuple[np.ndarray, np.ndarray]]] = {}
        #: how many members of the last update came from kept factors
        self.kept_factors = 0
        #: the last update's times: its products and adds issued, then the wait for the device
        #: (``stacked_ahead``: the factors came stacked from the prefetch)
        self.last_update_timing: dict[str, Any] = {}
        #: the draws :meth:`prefetch` started: (seeds, sigma, what it drew)
        self._ahead: tuple[tuple[int, ...], float, Future[DrawnAhead]] | None = None
        self._background: ThreadPoolExecutor | None = None
        #: the stacked factors of the members a refresh took from a prefetch: (seeds, by target name,
        #: the staged buffer they are views of or None)
        self._stacked: (
            tuple[tuple[int, ...], dict[str, tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None] | None
        ) = None
        #: page-locked buffers for the stacked factors where the weights are on a GPU (pinned_staging)
        self._staging: PinnedStaging | None = None
        #: the memory files the draws go into, kept from one prefetch to the next (draw_memory)
        self._memory = DrawMemory()
        #: Adam's moments once an update asked for Adam (agent_envs.es.update_rule); None: plain updates
        self.adam: Adam | None = None
        #: the update's CUDA graphs (update_graph)
        self._graph = update_graph.UpdateGraph()
        #: why this run's updates no longer try a graph (a capture the device refused), else ""
        self._graph_failed = ""
        #: the update as a CUDA graph: True or False for this perturber, None: as update_graph.ENV says
        self.wants_graph: bool | None = None

    def status(self) -> dict[str, Any]:
        return {
            "ok": True,
            "perturbation": self.perturbation_kind,
            "rank": self.rank,
            "n_targets": len(self.slots),
            "target_params": sum(s.target.out_features * s.target.in_features for s in self.slots),
            "update_history": len(self.updates),
            "merged": self.merged,
        }

    def checksum(self) -> str:
        return targets_checksum((s.target.name, s.rows()) for s in self.slots)

    def fingerprint(self) -> str:
        """The cheap exact fingerprint of the targeted weights, in target order (on their device)."""
        return fingerprint((s.target.name, s.rows()) for s in self.slots)

    def _devices(self) -> list[torch.device]:
        return [s.param.device for s in self.slots]

    def _add(self, products: Iterable[torch.Tensor]) -> SquareSum:
        """Add each target's float32 change (cast to the weight's dtype); the changes' sum of squares, on
        the devices (its ``norm()`` waits for them)."""
        squares = SquareSum()
        for slot, change in zip(self.slots, products, strict=True):
            rows = slot.rows()
            squares.add(change)
            rows.add_(change.to(rows.dtype))
        return squares

    def _check_unmerged(self, what: str) -> None:
        if self.merged is not None:
            raise RuntimeError(f"refusing to {what} while member {self.merged} is merged; revert it first")

    def apply(self, seed: int, sigma: float) -> dict[str, Any]:
        """Merge ``sigma * A B^T`` of member ``seed`` into the weights (a copy is kept for revert)."""
        self._check_unmerged("merge another member")
        coefs = [float(sigma)]
        with torch.no_grad():
            self._saved = [s.rows().clone() for s in self.slots]
            self._add(deltas([seed], coefs, self.targets, self.rank, self._devices()))
        self.merged = {"seed": int(seed), "sigma": float(sigma)}
        return {"ok": True, **self.merged, "n_targets": len(self.slots)}

    def revert(self) -> dict[str, Any]:
        """Restore the weights saved by :meth:`apply` (no-op when nothing is merged)."""
        if self.merged is None:
            return {"ok": True, "reverted": False}
        with torch.no_grad():
            for slot, saved in zip(self.slots, self._saved):
                slot.rows().copy_(saved)
        merged, self.merged, self._saved = self.merged, None, []
        return {"ok": True, "reverted": True, **merged}

    def prefetch(self, seeds: Sequence[int], sigma: float) -> dict[str, Any]:
        """Start drawing members ``seeds``' adapters at ``sigma`` (:func:`draw_ahead`, in a process of
        its own) while this generation's rollouts run; the seeds and sigma are pure functions of the
        run's config, so the refresh that asks for the same seeds and sigma only copies them, and the
        update of those seeds finds its factors stacked."""
        seeds_t, sigma_f, targets, rank = tuple(int(s) for s in seeds), float(sigma), tuple(self.targets), self.rank
        if self._background is None:
            self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="es-prefetch")
        if self._staging is None and any(d.type == "cuda" for d in self._devices()):
            self._staging = PinnedStaging()
        busy = self._stacked[2] if self._stacked else None  # what a pending update still reads
        job = self._background.submit(
            draw_ahead, distinct(seeds_t), targets, rank, sigma_f, self._staging, busy, memory=self._memory
        )
        self._ahead = (seeds_t, sigma_f, job)
        return {"ok": True, "prefetching": len(seeds_t)}

    def pending_draws(self, seeds: Sequence[int], sigma: float) -> Future[DrawnAhead] | None:
        """The draws :meth:`prefetch` started for exactly ``seeds`` at ``sigma``, left in place for
        :meth:`take_prefetched` (None: no such prefetch)."""
        ahead = self._ahead
        if ahead is None or ahead[0] != tuple(int(s) for s in seeds) or ahead[1] != float(sigma):
            return None
        return ahead[2]

    def take_prefetched(self, seeds: Sequence[int], sigma: float) -> Mapping[int, MemberDraw]:
        """The draws :meth:`prefetch` started for exactly ``seeds`` at ``sigma`` (waiting for them
        to finish), else ``{}``; a prefetch is used once either way.  Its stacked factors are kept
        for the next :meth:`update`."""
        job = self.pending_draws(seeds, sigma)
        self._ahead, self._stacked = None, None
        if job is None:
            return {}
        drawn = job.result()
        self._stacked = (distinct(seeds), drawn.stacked, drawn.staged)
        return drawn.draws

    def keep_drawn(self, ready: Mapping[int, MemberDraw], seeds: Sequence[int]) -> None:
        """Keep only members ``seeds``' factors from ``ready`` for the update of the same seeds: what
        :meth:`member_adapter` keeps one member at a time, for members written all at once."""
        self.drawn = {int(seed): ready[seed][0] for seed in distinct(seeds)}

    def member_adapter(
        self, seed: int, sigma: float, ready: Mapping[int, MemberDraw] | None = None, sign: int = 1
    ) -> Mapping[str, tuple[torch.Tensor, torch.Tensor]]:
        """Member ``seed``'s adapter tensors by module (from ``ready`` when it holds them, else
        drawn now; ``sign`` -1: the mirrored member); its factors are kept for the update of the same seeds."""
        drawn, tensors = (ready or {}).get(int(seed)) or member_draw(self.targets, seed, sigma, self.rank)
        self.drawn[int(seed)] = drawn
        return signed(tensors, sign)

    def _graph_for(
        self, kept: dict[str, tuple[torch.Tensor, torch.Tensor]] | None, staged: torch.Tensor | None
    ) -> tuple[update_graph.UpdateGraph | None, str]:
        """The update's graph, prepared (captured when its buffer and layout are new), where it applies and
        is asked for (:mod:`update_graph`), and what was done: "captured" or "replayed"; else None, and why."""
        if not (update_graph.enabled() if self.wants_graph is None else self.wants_graph):
            return None, "off" + (f" ({update_graph.ENV} is 0)" if self.wants_graph is None else "")
        devices = self._devices()
        reason = self._graph_failed or update_graph.why_not(devices, staged, kept, self.adam is None)
        if reason is not None or kept is None or staged is None:
            return None, f"eager: {reason}"
        stacked, device = kept, devices[0]

        def settle() -> None:  # before a capture: the next draws' staging synchronises the device
            if self._ahead is not None:
                wait([self._ahead[2]])

        def body(row: torch.Tensor) -> SquareSum:
            products = deltas(
                [], [], self.targets, self.rank, devices, stacked=lambda t: stacked[t.name], rows={device: row}
            )
            return self._add(products)

        try:
            with torch.no_grad():
                self._graph.prepare(body, device, staged, stacked, self.rank, settle)
        except RuntimeError as exc:  # a capture the device refused: this run's updates go eagerly, saying why
            self._graph = update_graph.UpdateGraph()
            self._graph_failed = f"the capture failed ({type(exc).__name__}: {exc})"
            return None, f"eager: {self._graph_failed}"
        return self._graph, self._graph.last

    def _kept_or_drawn(self, drawn: dict[int, Mapping[str, tuple[np.ndarray, np.ndarray]]]) -> FactorSource:
        """The factors of ``drawn`` (:attr:`drawn` as an update found it) where it holds them, else drawn."""

        def source(seed: int, target: Target, rank: int) -> tuple[np.ndarray, np.ndarray]:
            kept = drawn.get(seed)
            return kept[target.name] if kept is not None and rank == self.rank else factors(seed, target, rank)

        return source

    def update(
        self,
        seeds: Sequence[int],
        weights: Sequence[float],
        alpha: float,
        sigma: float,
        optimizer: dict[str, Any] | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """``W += alpha / (N * sigma) * sum_i w_i A_i B_i^T`` on every target (from the factors kept
        by :meth:`member_adapter` where there are some: the same arrays, so the same bits); with
        ``optimizer`` (Adam's settings) ``W += alpha * Adam(g)``, g the same sum with alpha 1.
        ``meanwhile``: host work run on a thread of its own while this one issues the products and adds
        and the device runs them (the next generation's refresh, ``ESWorkerExtension.es_lowrank_update``;
        :func:`alongside`); the update takes its factors apart from the state first, so ``meanwhile``
        may draw and keep the next members'."""
        self._check_unmerged("update")
        if len(seeds) != len(weights):
            raise ValueError(f"seeds and weights must be of equal length ({len(seeds)} vs {len(weights)})")
        seeds = [int(s) for s in seeds]
        if optimizer is not None:
            self.adam = self.adam or Adam(optimizer)
            self.adam.check(optimizer)
        elif self.adam is not None:
            raise ValueError("this model's earlier updates used Adam; a plain update cannot follow them")
        coefs = update_coefficients(weights, alpha, sigma)  # checks alpha, sigma and the weights
        if self.adam is not None:
            coefs = update_coefficients(weights, 1.0, sigma)
        ahead = self._stacked if self._stacked and self._stacked[0] == tuple(seeds) else None
        kept, staged = (ahead[1], ahead[2]) if ahead else (None, None)
        # this update's factors, taken apart from the state: ``meanwhile`` may draw and keep the next ones
        drawn, self.drawn, self._stacked = self.drawn, {}, None
        # not in the result (that is recorded): how many members' factors were already drawn
        self.kept_factors = len(seeds) if kept else sum(s in drawn for s in seeds)
        started, started_cpu = time.perf_counter(), time.thread_time()
        # as one CUDA graph where it applies: prepared, then replayed (one launch) before ``meanwhile`` starts and
        # queues its own copies on the same stream
        graph, graph_how = self._graph_for(kept, staged)
        replayed = graph.run(coefficient_row(coefs, self.rank)) if graph is not None else None
        with alongside(meanwhile, self._devices()) as beside:
            with torch.no_grad():
                if replayed is not None:
                    squares = replayed
                else:
                    products = deltas(
                        seeds,
                        coefs,
                        self.targets,
                        self.rank,
                        self._devices(),
                        self._kept_or_drawn(drawn),
                        _stacked_from(kept),
                    )
                    squares = self._add(update_changes(self.targets, products, alpha, self.adam))
            issued, issued_cpu = time.perf_counter(), time.thread_time()
            self.updates.append(
                {"seeds": seeds, "weights": [float(w) for w in weights], "alpha": float(alpha), "sigma": float(sigma)}
            )
        joined = time.perf_counter()
        norm = squares.norm()
        # not in the result either (a record holds the result, and records repeat with their seeds)
        self.last_update_timing = {
            "stacked_ahead": kept is not None,
            "issue_s": issued - started,
            # this thread's CPU seconds while issuing: near issue_s when the host's own work bounds it, far
            # below when it waited (for the device, or for the interpreter lock)
            "issue_cpu_s": issued_cpu - started_cpu,
            # the update as one CUDA graph (update_graph): "captured" or "replayed", else why it ran eagerly
            "graph": graph_how,
            **({"meanwhile_s": beside.seconds, "joined_s": joined - started} if meanwhile is not None else {}),
            "device_s": time.perf_counter() - joined,
        }
        # this update's draws let go of on the drawing thread, not here: drawn ahead, they are views of one memory
        # file of both halves of the factors (1.06 GB at P = 16 on the 4B shape), and unmapping a populated file
        # costs about 0.2 s a GB, on the update call's path after the last answer (docs/scaling.md, fourteenth session)
        garbage: list[Any] = [drawn, ahead, kept, staged]
        drawn, ahead, kept, staged = {}, None, None, None
        self._let_go(garbage)
        return {
            "ok": True,
            "n": len(seeds),
            "alpha": float(alpha),
            "sigma": float(sigma),
            "weight_norm": weight_norm(weights),
            "update_norm": norm,
        }

    def _let_go(self, garbage: list[Any]) -> None:
        """Drop the last references in ``garbage`` on the drawing thread (queued after any draws there),
        where a prefetch made one; else here.  ``garbage`` is emptied either way, so the caller keeps none."""
        if self._background is None:
            garbage.clear()
            return
        self._background.submit(garbage.clear)


# -- adapters ---------------------------------------------------------------------------------------
def write_adapter(
    folder: str | os.PathLike[str], targets: Sequence[Target], seed: int, sigma: float, rank: int
) -> Path:
    """Member ``seed``'s perturbation as a PEFT-format LoRA folder (float32; scaling 1)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for target in targets:
        module = target.name.removesuffix(".weight")
        lora_a, lora_b = adapter_tensors(*factors(seed, target, rank), sigma)
        tensors[f"base_model.model.{module}.lora_A.weight"] = lora_a
        tensors[f"base_model.model.{module}.lora_B.weight"] = lora_b
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    modules = sorted({t.name.removesuffix(".weight").rpartition(".")[2] for t in targets})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,
        "target_modules": modules,
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "base_model_name_or_path": None,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder


def adapter_tensors(a: np.ndarray, b: np.ndarray, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`adapter_arrays` as torch tensors: what an adapter folder holds and what a resident
    adapter is rewritten with."""
    lora_a, lora_b = adapter_arrays(a, b, sigma)
    return torch.from_numpy(lora_a), torch.from_numpy(lora_b)


def adapter_root() -> Path:
    """Where a generation's adapters are written: memory-backed ``/dev/shm`` when there is one."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(os.environ.get("TMPDIR", "/tmp"))


# -- history ----------------------------------------------------------------------------------------
def distinct(seeds: Sequence[int]) -> tuple[int, ...]:
    """``seeds`` in order, each once (a mirrored pair's seed once)."""
    return tuple(dict.fromkeys(int(s) for s in seeds))


def history_perturbation(history: Sequence[dict[str, Any]]) -> tuple[str, int | None]:
    """``("full", None)`` for the reference's noise, ``("lowrank", R)`` for this module's."""
    from .history import history_config

    config = history_config(history)
    kind = str(config.get("perturbation", "full"))
    if kind == "full":
        return kind, None
    if kind != PERTURBATION:
        raise ValueError(f"unknown perturbation {kind!r} in the history's config (expected full or lowrank)")
    return kind, check_rank(config.get("rank"))


def lowrank_updates(history: Sequence[dict[str, Any]], generations: int | None = None) -> list[dict[str, Any]]:
    """The history's updates as ``{seeds, weights, alpha, sigma}``, weights recomputed from the
    stored rewards (docs/protocol.md#history), seeds checked against the history's seed stream; a
    mirrored run's as one term per pair (:func:`~agent_envs.es.update_rule.pair_update`)."""
    from .history import history_config, record_update, update_records
    from .seeds import check_seed_sequence

    kind, _ = history_perturbation(history)
    if kind != PERTURBATION:
        raise ValueError("this history was trained with full-rank noise; replay it with agent_envs.es.history.replay")
    config = history_config(history)
    records = update_records(history, generations)
    mirrored = bool(config.get("mirrored", False))
    check_seed_sequence([r["seeds"] for r in records], int(config["seed"]), int(config["population"]), mirrored)
    updates = []
    for r in records:
        seeds, weights = record_update(r, mirrored)
        updates.append({"seeds": seeds, "alpha": float(r["alpha"]), "sigma": float(r["sigma"]), "weights": weights})
    return updates


def history_targets(history: Sequence[dict[str, Any]]) -> list[Target]:
    from .history import history_config

    rows = history_config(history).get("lowrank_targets")
    if not rows:
        raise ValueError("the history's config lists no lowrank_targets")
    return [Target(str(n), int(o), int(i)) for n, o, i in rows]


def replay_onto(
    model_dir: str | os.PathLike[str],
    history: Sequence[dict[str, Any]] | str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    dtype: str | None = None,
    generations: int | None = None,
    after_update: Callable[[int, str], None] | None = None,
    check_every: int = 1,
) -> dict[str, Any]:
    """Rebuild a low-rank-trained model from a plain safetensors checkpoint folder and the history,
    on the CPU: the weights are cast to ``dtype`` (default: the run's, e.g. bfloat16 on a GPU) and
    each update is added exactly as the engine did.  ``out_dir`` gets every file of ``model_dir``
    with the weights replaced.  Returns the number of updates, the targets' checksum before and
    after, and whether the base matched the run's ``base_checksum``.  ``after_update(i, fp)`` is
    called after update ``i`` with the targets' fingerprint (the one a run records per generation as
    ``weights_fingerprint``, taken in the same target order), to compare the two as they go: after
    every ``check_every``-th update and the last (a fingerprint reads every target weight, which on
    a small model costs as much as the update itself; the weights after update ``i`` depend on all
    earlier ones, so one equal fingerprint vouches for every update before it)."""
    from safetensors.torch import load_file, save_file

    from .history import history_config, load_history

    records = load_history(history) if isinstance(history, (str, os.PathLike)) else list(history)
    config = history_config(records)
    updates = lowrank_updates(records, generations)  # refuses a full-rank history
    if int(check_every) < 1:
        raise ValueError(f"check_every must be >= 1, got {check_every!r}")
    rank = check_rank(config.get("rank"))
    targets = history_targets(records)
    source, out = Path(model_dir), Path(out_dir)
    torch_dtype = getattr(torch, dtype or str(config.get("dtype", "float32")))
    shards = sorted(source.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{source}: no *.safetensors checkpoint to replay onto")
    weights: dict[str, dict[str, torch.Tensor]] = {p.name: load_file(str(p)) for p in shards}
    where = {name: shard for shard, tensors in weights.items() for name in tensors}
    for target in targets:
        tensor = weights[where[target.name]][target.name] if target.name in where else None
        if tensor is None or tuple(tensor.shape) != (target.out_features, target.in_features):
            found = "missing" if tensor is None else f"shape {tuple(tensor.shape)}"
            raise ValueError(f"{source}: target {target.name} ({target.out_features}x{target.in_features}) is {found}")
    for tensors in weights.values():
        for name, tensor in tensors.items():
            if tensor.is_floating_point():
                tensors[name] = tensor.to(torch_dtype).contiguous()
    placed = [(t, weights[where[t.name]][t.name]) for t in targets]
    base = targets_checksum((t.name, tensor) for t, tensor in placed)
    settings = optimizer_settings(config)
    adam = Adam(settings) if settings else None
    with torch.no_grad():
        for index, update in enumerate(updates):
            coefs = update_coefficients(update["weights"], 1.0 if adam else update["alpha"], update["sigma"])
            products = deltas(update["seeds"], coefs, targets, rank, ["cpu"] * len(targets))
            changes = update_changes(targets, products, update["alpha"], adam)
            for (_, tensor), change in zip(placed, changes, strict=True):
                tensor.add_(change.to(tensor.dtype))
            if after_update is not None and ((index + 1) % check_every == 0 or index + 1 == len(updates)):
                after_update(index, fingerprint((t.name, x) for t, x in placed))
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, out / path.name)
    for shard, tensors in weights.items():
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
    _set_config_dtype(out / "config.json", torch_dtype)
    expected = config.get("base_checksum")
    return {
        "updates": len(updates),
        "base_checksum": base,
        "checksum": targets_checksum((t.name, tensor) for t, tensor in placed),
        "base_matches_run": None if expected is None else base == expected,
        "dtype": str(torch_dtype),
    }


def _set_config_dtype(path: Path, dtype: torch.dtype) -> None:
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    name = str(dtype).removeprefix("torch.")
    for key in ("dtype", "torch_dtype"):
        if key in config:
            config[key] = name
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
