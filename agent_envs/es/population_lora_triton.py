"""The Triton kernels of :mod:`population_lora` (docs/scaling.md#population-kernels): two launches per packed
linear layer, grids over the batch's tokens in their members' order (never tokens x adapter slots).

The tokens are visited in the order vLLM sorts them by adapter slot for its own kernels
(``token_indices_sorted_by_lora_ids``; the first ``n`` positions are this step's, ``n`` being the largest of
``lora_token_start_loc``), so a tile of tokens holds one member or a few, and each member's factors are read
once per tile and shared by its tokens, not gathered token by token: at P = 16 x B = 16 a token tile of 32
would otherwise read 32 copies of 2-3 members' factors.  Rows past ``n`` (a CUDA graph's padding) and tokens
without a member's slot are never written.

- shrink, grid ``(token tiles, slices, feature splits)``: ``h[split, s, p] = x[t(p), split] @ a_s[slot, :rank, split]^T``
  in float32 for sorted position ``p``, each part written whole (no buffer to zero, no atomics: the sums stay
  in a fixed order); a decode step has few token tiles, so the input features are split until the GPU is busy;
- expand, grid ``(token tiles, column tiles of all slices)``: ``y[t(p), cols] (+)= (sum of h's parts)[s, p] @ b_s[slot, cols, :rank]^T``,
  read-modify-write of the layer's output, rounded once.

Both are ``tl.dot`` tiles, the rank padded to 16 with masked (unread) rows: the shrink on tensor cores in
the layer's dtype (bfloat16 products are exact in float32, the float32 accumulator is the same as a plain
sum's), the expand in float32 (``h`` is not rounded before it).  Under ``TRITON_INTERPRET=1`` the shrink
takes float32 too: the interpreter multiplies bfloat16 tiles wrongly (Triton 3.9: 2.5e10 off on a 16 x 16
product of unit normals), and the upcast gives the same exact products.  A slice's
factors come in as an argument of their own (at most three), not through a table of pointers, so the same
code runs under ``TRITON_INTERPRET=1`` on a CPU, where the tests check it.

A third kernel serves the folded path (:mod:`population_matmul`): ``widen`` writes ``[x | h]`` for the
layer's widened matmul, ``x`` copied and, per slice, the token's ``h`` in its member's ``rank`` columns of a
block of ``slots x rank`` (zeros elsewhere, and for tokens without a member and a graph's padding rows).  By
default in two launches: a grid ``(token tiles, feature steps)`` copies its step of ``x`` and writes each
slice's partial ``h`` (``tl.dot`` per member of the tile, as the shrink), then a grid ``(token tiles, slices,
column blocks)`` adds the parts in a fixed order and writes the columns, ``h`` rounded once to the layer's
dtype.  The one-launch form (each program walks all of the input features for a few tokens, products on CUDA
cores) stays for the benchmark's comparison: its dependent steps, not its bytes, set its time.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

#: tile sizes (tokens per block, output columns per expand block, input features per shrink step) by the
#: step's token count, each for counts up to its bound: what benchmarks/bench_lora_kernels.py's 12-setting
#: grid found best on one H200 (2026-12-03, 4B and 135M shapes, P = 16, 64, 256; docs/scaling.md#population-kernels).
#: Decode steps want thin token tiles and long feature steps, prefill chunks wide token tiles; one fixed
#: setting (32,64,128) was 1.5-1.7x slower than these on the 4B rows.  ``population_lora.BLOCKS_ENV`` overrides.
BLOCKS_BY_TOKENS: tuple[tuple[float, dict[str, int]], ...] = (
    (1024, {"tokens": 16, "columns": 128, "features": 256}),
    (4096, {"tokens": 32, "columns": 128, "features": 128}),
    (float("inf"), {"tokens": 64, "columns": 128, "features": 128}),
)
#: the smallest tile side of a ``tl.dot``: the rank is padded to it (masked loads read only the rank's rows)
MIN_DOT = 16
#: ``widen``'s tiles (tokens per program, input features per step, split) by the step's token count.  Split 1,
#: the default: the two-launch form (a program per token tile and step of features, then the parts added), which
#: took the 4B P = 16 x B = 16 ES generation from 10.11 to 9.01 s on one H200 (2026-12-04, ninth session; the
#: one-launch kernel's 75,168 launches a generation had 1.04 s of device time, 13.9 us each); split 0, the one
#: launch whose programs walk every input feature for a few tokens, is what benchmarks/bench_lora_kernels.py
#: compares it with (a program per token and 1,024 features a step was that kernel's best on the 4B shape)
WIDEN_BY_TOKENS: tuple[tuple[float, dict[str, int]], ...] = (
    (float("inf"), {"tokens": 16, "features": 256, "split": 1}),
)
#: widened columns written per step (a block of ``slots x rank`` per slice)
WIDEN_COLUMNS = 128
#: ``widen``'s feature steps from which each step's products are summed at once (a step of thousands of
#: features would otherwise keep them all in registers)
SUM_EACH_STEP_FROM = 2048


@triton.jit
def _token_tile(order_ptr, starts_ptr, slots_ptr, pid_t, L, STARTS: tl.constexpr, BLOCK_T: tl.constexpr):
    """A tile of sorted positions: the tokens at them (at and past ``n``, a CUDA graph's padding rows, the row
    of the same number), which are this step's members' (position below ``n``, a slot in ``[0, L)``), their
    slots, and the smallest and largest slot among them."""
    starts = tl.load(starts_ptr + tl.arange(0, STARTS), mask=tl.arange(0, STARTS) < L + 2, other=0)
    n = tl.max(starts, axis=0)  # the step's token count: the last of the cumulative counts per slot
    pos = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    in_step = pos < n
    tok = tl.where(in_step, tl.load(order_ptr + pos, mask=in_step, other=0), pos)
    slot = tl.load(slots_ptr + tok, mask=in_step, other=-1)
    valid = in_step & (slot >= 0) & (slot < L)
    slot = tl.where(valid, slot, L)
    return pos, tok, slot, valid, tl.min(slot, axis=0), tl.max(tl.where(valid, slot, -1), axis=0)


@triton.jit
def _next_member(slot, valid, m, L):
    """The smallest slot in the tile above ``m`` (``L`` when none): members are visited, not slot numbers."""
    return tl.min(tl.where(valid & (slot > m), slot, L), axis=0)


@triton.jit
def _shrink_kernel(
    x_ptr,
    order_ptr,
    starts_ptr,
    slots_ptr,
    h_ptr,
    a0_ptr,
    a1_ptr,
    a2_ptr,
    K,
    L,
    stride_x,
    stride_al,
    stride_ar,
    stride_hk,
    stride_hs,
    stride_hp,
    K_SPLIT,
    FLOAT32: tl.constexpr,
    R: tl.constexpr,
    RANK: tl.constexpr,
    STARTS: tl.constexpr,
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
    pos, tok, slot, valid, m, last = _token_tile(order_ptr, starts_ptr, slots_ptr, pid_t, L, STARTS, BLOCK_T)
    offs_r = tl.arange(0, R)
    in_rank = offs_r < RANK
    acc = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    while m <= last:  # each member in the tile: its factors once, its tokens' rows of x
        mine = valid & (slot == m)
        for k0 in range(pid_k * K_SPLIT, tl.minimum(K, (pid_k + 1) * K_SPLIT), BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            in_k = offs_k < K
            xt = tl.load(  # rows of other members are 0
                x_ptr + tok[:, None] * stride_x + offs_k[None, :], mask=mine[:, None] & in_k[None, :], other=0.0
            )
            a_at = a_ptr + m * stride_al + offs_k[:, None] + offs_r[None, :] * stride_ar
            acc = _dot_step(xt, a_at, in_k[:, None] & in_rank[None, :], acc, FLOAT32)
        m = _next_member(slot, valid, m, L)
    h_at = h_ptr + pid_k * stride_hk + s * stride_hs + pos[:, None] * stride_hp + offs_r[None, :]
    tl.store(h_at, acc, mask=valid[:, None] & in_rank[None, :])


@triton.jit
def _expand_kernel(
    h_ptr,
    order_ptr,
    starts_ptr,
    slots_ptr,
    y_ptr,
    b0_ptr,
    b1_ptr,
    b2_ptr,
    L,
    N0,
    N1,
    N2,
    SPLITS,
    stride_hk,
    stride_hs,
    stride_hp,
    stride_hm,
    stride_y,
    stride_bn,
    R: tl.constexpr,
    RANK: tl.constexpr,
    STARTS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ADD: tl.constexpr,
    H_BY_TOKEN: tl.constexpr,
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
    pos, tok, slot, valid, m, last = _token_tile(order_ptr, starts_ptr, slots_ptr, pid_t, L, STARTS, BLOCK_T)
    offs_r = tl.arange(0, R)
    in_rank = offs_r < RANK
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    in_cols = offs_n < width
    if H_BY_TOKEN:  # h as columns of a matmul's output: the token's row, its member's block of the slice
        rows = tok[:, None] * stride_hp + slot[:, None] * stride_hm
    else:  # the shrink's buffer: the sorted position's row
        rows = pos[:, None] * stride_hp
    h = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    for split in range(SPLITS):  # the shrink's partial sums over the input features
        h += tl.load(
            h_ptr + split * stride_hk + s * stride_hs + rows + offs_r[None, :],
            mask=valid[:, None] & in_rank[None, :],
            other=0.0,
        ).to(tl.float32)
    delta = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    while m <= last:  # each member in the tile: its columns of b once, for its tokens
        mine = valid & (slot == m)
        bt = tl.load(
            b_ptr + m * (width * stride_bn) + offs_r[:, None] + offs_n[None, :] * stride_bn,
            mask=in_rank[:, None] & in_cols[None, :],
            other=0.0,
        ).to(tl.float32)
        delta = tl.dot(tl.where(mine[:, None], h, 0.0), bt, delta, input_precision="ieee")
        m = _next_member(slot, valid, m, L)
    mask = valid[:, None] & in_cols[None, :]
    y_at = y_ptr + tok[:, None] * stride_y + (first_col + offs_n)[None, :]
    if ADD:
        delta += tl.load(y_at, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_at, delta.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _widen_kernel(
    x_ptr,
    order_ptr,
    starts_ptr,
    slots_ptr,
    w_ptr,
    a0_ptr,
    a1_ptr,
    a2_ptr,
    T,
    K,
    L,
    stride_x,
    stride_w,
    stride_wp,
    stride_al,
    stride_ar,
    R: tl.constexpr,
    RANK: tl.constexpr,
    SLICES: tl.constexpr,
    PLANES: tl.constexpr,
    STARTS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    SUM_EACH_STEP: tl.constexpr,
):
    # the step's tokens in member order; a CUDA graph's padding rows (at and past n) copied as they are
    pos, tok, slot, valid, first, last = _token_tile(
        order_ptr, starts_ptr, slots_ptr, tl.program_id(0), L, STARTS, BLOCK_T
    )
    in_rows = pos < T
    offs_r = tl.arange(0, R)
    in_rank = offs_r < RANK
    # per slice, the products x * a[slot] of every step, summed over the features once at the end; with
    # SUM_EACH_STEP (feature steps of thousands, a layer in one or a few steps) summed at every step instead,
    # which keeps the registers of a (tokens, rank) sum rather than of every product
    PARTS: tl.constexpr = 1 if SUM_EACH_STEP else BLOCK_K
    parts0 = tl.zeros((BLOCK_T, R, PARTS), dtype=tl.float32)
    parts1 = tl.zeros((BLOCK_T, R, PARTS), dtype=tl.float32)
    parts2 = tl.zeros((BLOCK_T, R, PARTS), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # x read once: copied, and multiplied by each slice's factor
        offs_k = k0 + tl.arange(0, BLOCK_K)
        in_k = offs_k < K
        mask = in_rows[:, None] & in_k[None, :]
        xt = tl.load(x_ptr + tok[:, None] * stride_x + offs_k[None, :], mask=mask, other=0.0)
        _copy_x(w_ptr + tok[:, None] * stride_w + offs_k[None, :], xt, mask, stride_wp, SLICES, PLANES)
        xt = xt.to(tl.float32)
        a_at = offs_r[:, None] * stride_ar + offs_k[None, :]
        a_mask = in_rank[:, None] & in_k[None, :]
        m = first
        while m <= last:  # each member in the tile: its factors once, for its tokens' rows
            xm = tl.where((valid & (slot == m))[:, None], xt, 0.0)[:, None, :]
            parts0 += _products(xm, a0_ptr + m * stride_al + a_at, a_mask, SUM_EACH_STEP)
            if SLICES > 1:
                parts1 += _products(xm, a1_ptr + m * stride_al + a_at, a_mask, SUM_EACH_STEP)
            if SLICES > 2:
                parts2 += _products(xm, a2_ptr + m * stride_al + a_at, a_mask, SUM_EACH_STEP)
            m = _next_member(slot, valid, m, L)
    E = L * RANK
    _widened_block(w_ptr, tok, slot, valid, in_rows, tl.sum(parts0, axis=2), K, 0, E, stride_w, L, R, RANK, BLOCK_E)
    if SLICES > 1:
        w1, k1 = _slice_at(w_ptr, K, E, stride_wp, 1, PLANES)
        _widened_block(w1, tok, slot, valid, in_rows, tl.sum(parts1, axis=2), k1, 0, E, stride_w, L, R, RANK, BLOCK_E)
    if SLICES > 2:
        w2, k2 = _slice_at(w_ptr, K, E, stride_wp, 2, PLANES)
        _widened_block(w2, tok, slot, valid, in_rows, tl.sum(parts2, axis=2), k2, 0, E, stride_w, L, R, RANK, BLOCK_E)


@triton.jit
def _slice_at(w_ptr, K, E, stride_wp, s, PLANES: tl.constexpr):
    """Where slice ``s``'s block of ``slots x rank`` columns starts: ``(plane, column)``.  One plane holding
    every slice's block after ``x`` (``[x | h_0 | h_1 | ...]``), or with ``PLANES`` a plane per slice, each
    ``[x | h_s]``."""
    if PLANES:
        return w_ptr + s * stride_wp, K
    return w_ptr, K + s * E


@triton.jit
def _copy_x(w_at, xt, mask, stride_wp, SLICES: tl.constexpr, PLANES: tl.constexpr):
    """``x``'s tile into the widened rows: once, or with ``PLANES`` into each slice's plane."""
    tl.store(w_at, xt, mask=mask)
    if PLANES:
        if SLICES > 1:
            tl.store(w_at + stride_wp, xt, mask=mask)
        if SLICES > 2:
            tl.store(w_at + 2 * stride_wp, xt, mask=mask)


@triton.jit
def _products(xm, a_at, a_mask, SUM_EACH_STEP: tl.constexpr):
    """A step's products of ``xm`` (tokens, 1, features) and the factor rows at ``a_at`` (rank, features):
    kept per feature, or summed over the step's features (a trailing axis of 1)."""
    products = xm * tl.load(a_at, mask=a_mask, other=0.0).to(tl.float32)[None, :, :]
    if SUM_EACH_STEP:
        products = tl.sum(products, axis=2)[:, :, None]
    return products


@triton.jit
def _widened_block(
    w_ptr, tok, slot, valid, in_rows, h, start, e_first, e_end, stride_w, L,
    R: tl.constexpr, RANK: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    """Columns ``[e_first, e_end)`` of one slice's ``slots x rank`` from ``start``: the token's ``h`` (tokens x
    rank) in its member's columns, zeros elsewhere (and everywhere for a token of no member)."""
    offs_r = tl.arange(0, R)
    for e0 in range(e_first, e_end, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        pick = (offs_e % RANK)[None, None, :] == offs_r[None, :, None]
        value = tl.sum(tl.where(pick, h[:, :, None], 0.0), axis=1)  # h's column for each widened column
        value = tl.where(valid[:, None] & ((offs_e // RANK)[None, :] == slot[:, None]), value, 0.0)
        mask = in_rows[:, None] & (offs_e < e_end)[None, :]
        tl.store(w_ptr + tok[:, None] * stride_w + start + offs_e[None, :], value.to(w_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _widen_parts_kernel(
    x_ptr, order_ptr, starts_ptr, slots_ptr, w_ptr, parts_ptr, a0_ptr, a1_ptr, a2_ptr,
    T, K, L, stride_x, stride_w, stride_wp, stride_al, stride_ar, stride_pk, stride_ps, stride_pp,
    FLOAT32: tl.constexpr, R: tl.constexpr, RANK: tl.constexpr, SLICES: tl.constexpr, PLANES: tl.constexpr,
    STARTS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The split widening's first launch, grid ``(token tiles, feature steps)``: a step of ``x``'s features
    copied, and each slice's partial ``h`` over them (``tl.dot`` per member of the tile) written whole."""
    pid_t = tl.program_id(0)
    pid_k = tl.program_id(1)
    pos, tok, slot, valid, m, last = _token_tile(order_ptr, starts_ptr, slots_ptr, pid_t, L, STARTS, BLOCK_T)
    in_rows = pos < T
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    in_k = offs_k < K
    mask = in_rows[:, None] & in_k[None, :]
    xt = tl.load(x_ptr + tok[:, None] * stride_x + offs_k[None, :], mask=mask, other=0.0)
    _copy_x(w_ptr + tok[:, None] * stride_w + offs_k[None, :], xt, mask, stride_wp, SLICES, PLANES)
    offs_r = tl.arange(0, R)
    in_rank = offs_r < RANK
    a_at = offs_k[:, None] + offs_r[None, :] * stride_ar
    a_mask = in_k[:, None] & in_rank[None, :]
    acc0 = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    while m <= last:  # each member in the tile: its factors' step once, for its tokens' rows
        xm = tl.where((valid & (slot == m))[:, None], xt, tl.zeros_like(xt))
        acc0 = _dot_step(xm, a0_ptr + m * stride_al + a_at, a_mask, acc0, FLOAT32)
        if SLICES > 1:
            acc1 = _dot_step(xm, a1_ptr + m * stride_al + a_at, a_mask, acc1, FLOAT32)
        if SLICES > 2:
            acc2 = _dot_step(xm, a2_ptr + m * stride_al + a_at, a_mask, acc2, FLOAT32)
        m = _next_member(slot, valid, m, L)
    p_at = parts_ptr + pid_k * stride_pk + pos[:, None] * stride_pp + offs_r[None, :]
    p_mask = valid[:, None] & in_rank[None, :]
    tl.store(p_at, acc0, mask=p_mask)
    if SLICES > 1:
        tl.store(p_at + stride_ps, acc1, mask=p_mask)
    if SLICES > 2:
        tl.store(p_at + 2 * stride_ps, acc2, mask=p_mask)


@triton.jit
def _dot_step(xm, a_at, a_mask, acc, FLOAT32: tl.constexpr):
    """``acc + xm @ a^T`` for a step of features (the shrink's and the split widening's): bfloat16 tiles on
    tensor cores (exact products, float32 sums), float32 with ``FLOAT32`` (a float32 layer, or Triton's
    interpreter: the module's note on bfloat16 there)."""
    at = tl.load(a_at, mask=a_mask, other=0.0)
    if FLOAT32:
        return tl.dot(xm.to(tl.float32), at.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(xm, at.to(xm.dtype), acc)


@triton.jit
def _widen_finish_kernel(
    parts_ptr, order_ptr, starts_ptr, slots_ptr, w_ptr,
    T, K, L, SPLITS, stride_w, stride_wp, stride_pk, stride_ps, stride_pp,
    R: tl.constexpr, RANK: tl.constexpr, PLANES: tl.constexpr, STARTS: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
):  # fmt: skip
    """The split widening's second launch, grid ``(token tiles, slices, column blocks)``: the partial sums
    added in order of their feature steps (the same sum every run), the block of the slice's ``slots x rank``
    columns written as the one-launch kernel writes them."""
    pid_t = tl.program_id(0)
    s = tl.program_id(1)
    pid_e = tl.program_id(2)
    pos, tok, slot, valid, _, _ = _token_tile(order_ptr, starts_ptr, slots_ptr, pid_t, L, STARTS, BLOCK_T)
    in_rows = pos < T
    offs_r = tl.arange(0, R)
    h_at = parts_ptr + s * stride_ps + pos[:, None] * stride_pp + offs_r[None, :]
    h_mask = valid[:, None] & (offs_r < RANK)[None, :]
    h = tl.zeros((BLOCK_T, R), dtype=tl.float32)
    for split in range(SPLITS):
        h += tl.load(h_at + split * stride_pk, mask=h_mask, other=0.0)
    e_first = pid_e * BLOCK_E
    e_end = tl.minimum(e_first + BLOCK_E, L * RANK)
    w_at, start = _slice_at(w_ptr, K, L * RANK, stride_wp, s, PLANES)
    _widened_block(w_at, tok, slot, valid, in_rows, h, start, e_first, e_end, stride_w, L, R, RANK, BLOCK_E)


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


def tiles_for(tokens: int) -> dict[str, int]:
    """The tile sizes of :data:`BLOCKS_BY_TOKENS` for a step of ``tokens`` tokens (each CUDA graph vLLM
    captures is launched with its own batch size, so each gets its own)."""
    return dict(next(tiles for bound, tiles in BLOCKS_BY_TOKENS if tokens <= bound))


def member_order(slots: torch.Tensor, tokens: int, n_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, starts)`` as vLLM's kernel metadata gives them, for a caller without it (tests, a CPU
    wrapper): the first ``tokens`` indices sorted by slot (stable), and cumulative counts whose largest is
    ``tokens``, padded to ``n_slots + 2`` entries."""
    order = torch.sort(slots[:tokens], stable=True).indices.to(torch.int32)
    starts = torch.zeros(n_slots + 2, dtype=torch.int32, device=slots.device)
    starts[1] = tokens
    return order, starts


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
    order: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """:func:`population_lora.reference`'s contract, in two launches (no host synchronisation: CUDA graphs
    capture it).  ``order``: vLLM's ``(token_indices_sorted_by_lora_ids, lora_token_start_loc)`` for this
    step (:func:`member_order` when None); ``blocks`` overrides :func:`tiles_for` (the benchmark's comparisons)."""
    tokens, features = x.shape
    b = {**tiles_for(tokens), **(blocks or {})}
    n_slices = len(output_slices)
    n_slots = lora_a[0].shape[0]
    rank_slot = lora_b[0].shape[-1]
    r_pad = max(MIN_DOT, triton.next_power_of_2(rank))
    if not (x.is_contiguous() and y.stride(-1) == 1 and all(t.is_contiguous() for t in (*lora_a, *lora_b))):
        raise ValueError("population LoRA kernels: x, the factors and y's rows must be contiguous")
    if rank > rank_slot or lora_a[0].shape[-2] != rank_slot:
        raise ValueError(f"population LoRA kernels: rank {rank} within a rank slot of {rank_slot}")
    if min(b.values()) < MIN_DOT:
        raise ValueError(f"population LoRA kernels: tiles {b} below {MIN_DOT}, the smallest a tl.dot takes")
    if tokens == 0:
        return
    sorted_tokens, starts = order if order is not None else member_order(slots, tokens, n_slots)
    if starts.numel() != n_slots + 2:
        raise ValueError(f"population LoRA kernels: {starts.numel()} token starts for {n_slots} slots (want slots + 2)")
    token_tiles = triton.cdiv(tokens, b["tokens"])
    k_split = split_features(features, token_tiles * n_slices, b["features"], programs(x.device))
    splits = triton.cdiv(features, k_split)
    h = torch.empty((splits, n_slices, tokens, r_pad), dtype=torch.float32, device=x.device)
    a = [*lora_a, *[lora_a[0]] * (3 - n_slices)]
    _shrink_kernel[(token_tiles, n_slices, splits)](
        x, sorted_tokens, starts, slots, h, a[0], a[1], a[2], features, n_slots,
        x.stride(0), lora_a[0].stride(0), lora_a[0].stride(2), h.stride(0), h.stride(1), h.stride(2), k_split,
        FLOAT32=x.dtype == torch.float32 or not x.is_cuda, BLOCK_K=b["features"], **_tile_meta(rank, n_slots, b),
    )  # fmt: skip
    strides = (h.stride(0), h.stride(1), h.stride(2), 0)
    _expand(y, h, strides, splits, False, tokens, slots, lora_b, output_slices, rank, add, b, sorted_tokens, starts)


def _expand(
    y: torch.Tensor,
    h: torch.Tensor,
    h_strides: tuple[int, int, int, int],
    splits: int,
    by_token: bool,
    tokens: int,
    slots: torch.Tensor,
    lora_b: Sequence[torch.Tensor],
    output_slices: Sequence[int],
    rank: int,
    add: bool,
    b: dict[str, int],
    sorted_tokens: torch.Tensor,
    starts: torch.Tensor,
) -> None:
    """The expand launch of :func:`launch` and :func:`expand_columns`: ``h_strides`` (split, slice, row,
    member) locate a token's ``h``, its row the sorted position or (``by_token``) the token itself."""
    n_slices, n_slots, rank_slot = len(output_slices), lora_b[0].shape[0], lora_b[0].shape[-1]
    bs = [*lora_b, *[lora_b[0]] * (3 - n_slices)]
    widths = [*output_slices, *[0] * (3 - n_slices)]
    column_tiles = sum(triton.cdiv(w, b["columns"]) for w in output_slices)
    _expand_kernel[(triton.cdiv(tokens, b["tokens"]), column_tiles)](
        h, sorted_tokens, starts, slots, y, bs[0], bs[1], bs[2], n_slots, widths[0], widths[1], widths[2], splits,
        *h_strides, y.stride(0), rank_slot,
        BLOCK_N=b["columns"], ADD=add, H_BY_TOKEN=by_token, **_tile_meta(rank, n_slots, b),
    )  # fmt: skip


def _tile_meta(rank: int, n_slots: int, b: dict[str, int]) -> dict[str, int]:
    """The kernels' shared compile-time sizes: the rank padded for ``tl.dot``, the rank, the starts' width
    and the token tile."""
    r_pad = max(MIN_DOT, triton.next_power_of_2(rank))
    return dict(R=r_pad, RANK=rank, STARTS=triton.next_power_of_2(n_slots + 2), BLOCK_T=b["tokens"])


def expand_columns(
    y: torch.Tensor,
    h: torch.Tensor,
    slots: torch.Tensor,
    lora_b: Sequence[torch.Tensor],
    output_slices: Sequence[int],
    rank: int,
    add: bool = True,
    order: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """The expand alone, with ``h`` given as a matmul's output columns: ``h[t, (s * slots + slot) * rank_slot + k]``
    for slice ``s``, what one GEMM of ``x`` with every member's ``A`` stacked under the layer's weight gives
    (``y`` and ``h`` may be the two column ranges of that GEMM's output).  Measured by
    benchmarks/bench_lora_kernels.py (``stacked``) to see what folding the shrink into the layer's matmul
    would save before building it into an engine."""
    tokens = h.shape[0]
    n_slices, n_slots, rank_slot = len(output_slices), lora_b[0].shape[0], lora_b[0].shape[-1]
    if h.stride(-1) != 1 or y.stride(-1) != 1 or h.shape[1] != n_slices * n_slots * rank_slot:
        raise ValueError(f"population LoRA kernels: h of {tuple(h.shape)} for {n_slices} x {n_slots} x {rank_slot}")
    if tokens == 0:
        return
    b = tiles_for(tokens)
    sorted_tokens, starts = order if order is not None else member_order(slots, tokens, n_slots)
    strides = (0, n_slots * rank_slot, h.stride(0), rank_slot)
    _expand(y, h, strides, 1, True, tokens, slots, lora_b, output_slices, rank, add, b, sorted_tokens, starts)


def widen(
    x: torch.Tensor,
    slots: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    rank: int,
    order: tuple[torch.Tensor, torch.Tensor] | None = None,
    blocks: dict[str, int] | None = None,
    planes: bool = False,
) -> torch.Tensor:
    """``population_matmul.widen_reference``'s contract: ``[x | h]``, ``h`` a block of ``slots x rank``
    columns per slice (or with ``planes``, ``(slices, tokens, ...)``: a plane ``[x | h_s]`` per slice), in
    two launches (:func:`_widen_split`) or one.  ``order`` as for :func:`launch`; ``blocks`` (tokens,
    features, split: 0 when left out) overrides :data:`WIDEN_BY_TOKENS` (the benchmark's comparisons,
    ``population_matmul.WIDEN_BLOCKS_ENV``)."""
    tokens, features = x.shape
    n_slots, rank_slot = lora_a[0].shape[0], lora_a[0].shape[-2]
    if not (x.stride(-1) == 1 and all(a.is_contiguous() for a in lora_a)) or rank > rank_slot:
        raise ValueError(f"population widen: x's rows and the factors contiguous, rank {rank} within {rank_slot}")
    b = {"split": 0, **blocks} if blocks else next(t for bound, t in WIDEN_BY_TOKENS if tokens <= bound)
    n_slices = len(lora_a)
    if planes:
        out = torch.empty((n_slices, tokens, features + n_slots * rank), dtype=x.dtype, device=x.device)
    else:
        out = torch.empty((tokens, features + n_slices * n_slots * rank), dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    sorted_tokens, starts = order if order is not None else member_order(slots, tokens, n_slots)
    a = [*lora_a, *[lora_a[0]] * (3 - n_slices)]
    strides_w = (out.stride(-2), out.stride(0) if planes else 0)
    if b.get("split"):
        _widen_split(x, out, strides_w, planes, sorted_tokens, starts, slots, a, n_slices, n_slots, rank, b)
        return out
    _widen_kernel[(triton.cdiv(tokens, b["tokens"]),)](
        x, sorted_tokens, starts, slots, out, a[0], a[1], a[2], tokens, features, n_slots,
        x.stride(0), *strides_w, lora_a[0].stride(0), lora_a[0].stride(2),
        R=triton.next_power_of_2(rank), RANK=rank, SLICES=n_slices, PLANES=planes,
        STARTS=triton.next_power_of_2(n_slots + 2),
        BLOCK_T=b["tokens"], BLOCK_K=b["features"], BLOCK_E=WIDEN_COLUMNS,
        SUM_EACH_STEP=b["features"] >= SUM_EACH_STEP_FROM,
        num_warps=8 if b["tokens"] * b["features"] >= 1024 else 4,  # each slice's products: 16-64 per thread
    )  # fmt: skip
    return out


def _widen_split(
    x: torch.Tensor,
    out: torch.Tensor,
    strides_w: tuple[int, int],
    planes: bool,
    sorted_tokens: torch.Tensor,
    starts: torch.Tensor,
    slots: torch.Tensor,
    a: list[torch.Tensor],
    n_slices: int,
    n_slots: int,
    rank: int,
    b: dict[str, int],
) -> None:
    """:func:`widen` in two launches: ``(token tiles, feature steps)`` programs copy ``x`` and write each
    step's partial ``h`` (``tl.dot``, the members of a tile one after another), then ``(token tiles, slices,
    column blocks)`` programs add the parts in a fixed order and write the widened columns.  A program per
    step of features instead of one walking all of them: the one-launch kernel's time is its programs'
    dependent steps (10 on the 4B ``down`` at 1,024 features), not its bytes."""
    tokens, features = x.shape
    if b["tokens"] < MIN_DOT:
        raise ValueError(f"population widen: split tiles of {b['tokens']} tokens, below {MIN_DOT} (a tl.dot's side)")
    tiles, steps = triton.cdiv(tokens, b["tokens"]), triton.cdiv(features, b["features"])
    r_sum = triton.next_power_of_2(rank)
    parts = torch.empty((steps, n_slices, tokens, r_sum), dtype=torch.float32, device=x.device)
    common = dict(RANK=rank, STARTS=triton.next_power_of_2(n_slots + 2), BLOCK_T=b["tokens"])
    _widen_parts_kernel[(tiles, steps)](
        x, sorted_tokens, starts, slots, out, parts, a[0], a[1], a[2], tokens, features, n_slots,
        x.stride(0), *strides_w, a[0].stride(0), a[0].stride(2), parts.stride(0), parts.stride(1), parts.stride(2),
        FLOAT32=x.dtype == torch.float32 or not x.is_cuda, R=max(MIN_DOT, r_sum), SLICES=n_slices,
        PLANES=planes, BLOCK_K=b["features"], **common,
    )  # fmt: skip
    _widen_finish_kernel[(tiles, n_slices, triton.cdiv(n_slots * rank, WIDEN_COLUMNS))](
        parts, sorted_tokens, starts, slots, out, tokens, features, n_slots, steps,
        *strides_w, parts.stride(0), parts.stride(1), parts.stride(2),
        R=r_sum, PLANES=planes, BLOCK_E=WIDEN_COLUMNS, **common,
    )  # fmt: skip
