"""The Triton kernels of :mod:`population_lora` (docs/scaling.md#population-kernels): two launches per packed
linear layer, grids over the batch's tokens (never tokens x adapter slots), each token reading its own
member's factors by its slot index.

- shrink, grid ``(token tiles, slices, feature splits)``: ``h[split, s, t] = x[t, split] @ a_s[slot(t), :rank, split]^T``
  in float32, each part written whole (no buffer to zero, no atomics: the sums stay in a fixed order); a
  decode step has few token tiles, so the input features are split until the GPU is busy;
- expand, grid ``(token tiles, column tiles of all slices)``: ``y[t, cols] (+)= (sum of h's parts)[s, t] @ b_s[slot(t), cols, :rank]^T``,
  read-modify-write of the layer's output, rounded once.

Rank 4 is far too thin for tensor cores, and each token's factors are a gather, so both are plain
multiply-and-sum tiles; the factors of a population (P x rank x width) stay in L2 while a layer runs.
A slice's factors come in as an argument of their own (at most three), not through a table of pointers,
so the same code runs under ``TRITON_INTERPRET=1`` on a CPU, where the tests check it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

#: tile sizes: tokens per block, output columns per expand block, input features per shrink step.  The
#: default was within 6% of the best of benchmarks/bench_lora_kernels.py's 12-setting grid on every row one
#: H200 measured (4B and 135M shapes, P = 16, 64, 256, decode and prefill; docs/scaling.md#population-kernels),
#: so no setting is chosen per shape (``population_lora.BLOCKS_ENV`` overrides it for an engine)
BLOCKS = {"tokens": 32, "columns": 64, "features": 128}


@triton.jit
def _token_slots(slots_ptr, pid_t, T, L, BLOCK_T: tl.constexpr):
    """A token tile's rows, which of them are in the batch, their adapter slots, and which slots are a
    member's (a missing or stale index reads slot 0 under a mask and is never written)."""
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    in_batch = offs_t < T
    slot = tl.load(slots_ptr + offs_t, mask=in_batch, other=-1)
    valid = in_batch & (slot >= 0) & (slot < L)
    return offs_t, in_batch, tl.where(valid, slot, 0), valid


@triton.jit
def _shrink_kernel(
    x_ptr,
    slots_ptr,
    h_ptr,
    a0_ptr,
    a1_ptr,
    a2_ptr,
    T,
    K,
    L,
    stride_x,
    stride_al,
    stride_ar,
    stride_hk,
    stride_hs,
    stride_ht,
    K_SPLIT,
    R: tl.constexpr,
    RANK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_t = tl.program_id(0)
    s = tl.program_id(1)
    pid_k = tl.program_id(2)
    if s == 0:
        a_ptr = a0_ptr
    elif s == 1:
        a_ptr = a1_ptr
    else:
        a_ptr = a2_ptr
    offs_t, in_batch, slot, valid = _token_slots(slots_ptr, pid_t, T, L, BLOCK_T)
    offs_r = tl.arange(0, R)
    in_rank = offs_r < RANK
    acc = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    for k0 in range(pid_k * K_SPLIT, tl.minimum(K, (pid_k + 1) * K_SPLIT), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        in_k = offs_k < K
        xt = tl.load(
            x_ptr + offs_t[:, None] * stride_x + offs_k[None, :], mask=valid[:, None] & in_k[None, :], other=0.0
        ).to(tl.float32)
        at = tl.load(
            a_ptr + slot[:, None, None] * stride_al + offs_r[None, :, None] * stride_ar + offs_k[None, None, :],
            mask=valid[:, None, None] & in_rank[None, :, None] & in_k[None, None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(xt[:, None, :] * at, axis=2)
    h_at = h_ptr + pid_k * stride_hk + s * stride_hs + offs_t[:, None] * stride_ht + offs_r[None, :]
    tl.store(h_at, acc, mask=in_batch[:, None])


@triton.jit
def _expand_kernel(
    h_ptr,
    slots_ptr,
    y_ptr,
    b0_ptr,
    b1_ptr,
    b2_ptr,
    T,
    L,
    N0,
    N1,
    N2,
    SPLITS,
    stride_hk,
    stride_hs,
    stride_ht,
    stride_y,
    stride_bn,
    R: tl.constexpr,
    RANK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ADD: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_n = tl.program_id(1)
    tiles0 = tl.cdiv(N0, BLOCK_N)
    tiles01 = tiles0 + tl.cdiv(N1, BLOCK_N)
    s = (pid_n >= tiles0).to(tl.int32) + (pid_n >= tiles01).to(tl.int32)  # the slice this column tile is in
    width = tl.where(s == 0, N0, tl.where(s == 1, N1, N2))
    first_col = tl.where(s == 0, 0, tl.where(s == 1, N0, N0 + N1))
    tile = pid_n - tl.where(s == 0, 0, tl.where(s == 1, tiles0, tiles01))
    if s == 0:
        b_ptr = b0_ptr
    elif s == 1:
        b_ptr = b1_ptr
    else:
        b_ptr = b2_ptr
    offs_t, in_batch, slot, valid = _token_slots(slots_ptr, pid_t, T, L, BLOCK_T)
    offs_r = tl.arange(0, R)
    in_rank = offs_r < RANK
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    in_cols = offs_n < width
    h = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    for split in range(SPLITS):  # the shrink's partial sums over the input features
        h += tl.load(
            h_ptr + split * stride_hk + s * stride_hs + offs_t[:, None] * stride_ht + offs_r[None, :],
            mask=valid[:, None] & in_rank[None, :],
            other=0.0,
        )
    bt = tl.load(
        b_ptr + slot[:, None, None] * (width * stride_bn) + offs_n[None, :, None] * stride_bn + offs_r[None, None, :],
        mask=valid[:, None, None] & in_cols[None, :, None] & in_rank[None, None, :],
        other=0.0,
    ).to(tl.float32)
    delta = tl.sum(h[:, None, :] * bt, axis=2)
    mask = valid[:, None] & in_cols[None, :]
    y_at = y_ptr + offs_t[:, None] * stride_y + (first_col + offs_n)[None, :]
    if ADD:
        delta += tl.load(y_at, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_at, delta.to(y_ptr.dtype.element_ty), mask=mask)


@functools.cache
def programs(device: torch.device) -> int:
    """Blocks that keep the device busy: two per multiprocessor (8 under the CPU interpreter)."""
    if device.type != "cuda":
        return 8
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def split_features(features: int, blocks: int, block_k: int, target: int) -> int:
    """Input features per shrink block: the sum over ``features`` is split until ``blocks`` x splits
    reaches ``target`` (a decode step has few token tiles, and one block per tile would leave most of the
    GPU idle walking all of a long ``down`` input), in whole ``block_k`` steps; the expand adds the parts."""
    steps = triton.cdiv(features, block_k)
    splits = max(1, min(steps, triton.cdiv(target, max(1, blocks))))
    return triton.cdiv(steps, splits) * block_k


def launch(
    y: torch.Tensor,
    x: torch.Tensor,
    slots: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    output_slices: Sequence[int],
    rank: int,
    add: bool = True,
    blocks: dict[str, int] | None = None,
) -> None:
    """:func:`population_lora.reference`'s contract, in two launches (no host synchronisation: CUDA graphs
    capture it).  ``blocks`` overrides :data:`BLOCKS` (the benchmark's comparisons)."""
    b = {**BLOCKS, **(blocks or {})}
    n_slices = len(output_slices)
    tokens, features = x.shape
    rank_slot = lora_b[0].shape[-1]
    r_pad = triton.next_power_of_2(rank)
    if not (x.is_contiguous() and y.stride(-1) == 1 and all(t.is_contiguous() for t in (*lora_a, *lora_b))):
        raise ValueError("population LoRA kernels: x, the factors and y's rows must be contiguous")
    if rank > rank_slot or lora_a[0].shape[-2] != rank_slot:
        raise ValueError(f"population LoRA kernels: rank {rank} within a rank slot of {rank_slot}")
    if tokens == 0:
        return
    token_tiles = triton.cdiv(tokens, b["tokens"])
    k_split = split_features(features, token_tiles * n_slices, b["features"], programs(x.device))
    splits = triton.cdiv(features, k_split)
    h = torch.empty((splits, n_slices, tokens, r_pad), dtype=torch.float32, device=x.device)
    a = [*lora_a, *[lora_a[0]] * (3 - n_slices)]
    bs = [*lora_b, *[lora_b[0]] * (3 - n_slices)]
    widths = [*output_slices, *[0] * (3 - n_slices)]
    _shrink_kernel[(token_tiles, n_slices, splits)](
        x, slots, h, a[0], a[1], a[2], tokens, features, lora_a[0].shape[0],
        x.stride(0), lora_a[0].stride(0), lora_a[0].stride(2), h.stride(0), h.stride(1), h.stride(2), k_split,
        R=r_pad, RANK=rank, BLOCK_T=b["tokens"], BLOCK_K=b["features"],
    )  # fmt: skip
    column_tiles = sum(triton.cdiv(w, b["columns"]) for w in output_slices)
    _expand_kernel[(token_tiles, column_tiles)](
        h, slots, y, bs[0], bs[1], bs[2], tokens, lora_b[0].shape[0], widths[0], widths[1], widths[2], splits,
        h.stride(0), h.stride(1), h.stride(2), y.stride(0), rank_slot,
        R=r_pad, RANK=rank, BLOCK_T=b["tokens"], BLOCK_N=b["columns"], ADD=add,
    )  # fmt: skip
