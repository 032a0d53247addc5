"""The fingerprint's sums (:mod:`agent_envs.es.fingerprint`) in one launch per tensor, on its device.

The torch form takes a few kernels per reduction step of every tensor (a copy of a strided view, the
words widened to int32, two sums and a product) and a host that waits on none of them but issues
them all: on the 4B shape 84 ms an ES generation on one H200 (2026-12-04), for 7.2 GB of weights that
its memory bandwidth would read in about 2 ms.  Here a program per tile of ``(rows, columns)`` reads a
2-byte tensor's words where they lie (a strided view such as a widened layer's base weight included), and
each program writes its two partial sums, exact in int64; the parts are added on the device in int64
(exact: a tensor of fewer than 2**32 words cannot overflow it) and read back with every other tensor's in
one transfer.
The same integers as the torch form, so the same fingerprints, whatever the blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: rows and columns a program sums (a 64 x 256 tile of words: 32 KiB of bfloat16)
BLOCK_ROWS, BLOCK_COLS = 64, 256
#: the most words a tensor may have here: the int64 sums stay exact below it
MAX_WORDS = 2**32


@triton.jit
def _sums_kernel(w_ptr, out_ptr, rows, cols, stride_r, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)  # one grid axis: a GPU's second allows 65,535 blocks, a weight's columns need more
    col_blocks = tl.cdiv(cols, BLOCK_C)
    pid_r = pid // col_blocks
    pid_c = pid % col_blocks
    offs_r = (pid_r * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    offs_c = (pid_c * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
    mask = (offs_r < rows)[:, None] & (offs_c < cols)[None, :]
    x = tl.load(w_ptr + offs_r[:, None] * stride_r + offs_c[None, :], mask=mask, other=0).to(tl.int32)
    # the word's place in the tensor read whole, row after row: its weight (i mod 2**15) + 1
    weight = (((offs_r[:, None] * cols + offs_c[None, :]) & 32767) + 1).to(tl.int32)
    out = out_ptr + 2 * pid
    tl.store(out, tl.sum(tl.sum(x.to(tl.int64), axis=1), axis=0))
    tl.store(out + 1, tl.sum(tl.sum((x * weight).to(tl.int64), axis=1), axis=0))


def as_rows(tensor: torch.Tensor) -> torch.Tensor | None:
    """``tensor``'s 16-bit words as a matrix whose rows are contiguous, in the order of the whole
    tensor's bytes (what the fingerprint defines); None where that takes a copy or the words are not
    the elements (1-byte and 4-byte dtypes: the torch form serves those)."""
    if tensor.element_size() != 2 or tensor.numel() == 0 or tensor.numel() >= MAX_WORDS:
        return None
    words = tensor.detach().view(torch.int16)
    if words.is_contiguous():  # rows of the last dimension: whole tiles for a weight matrix
        return words.reshape(-1, words.shape[-1]) if words.dim() >= 2 else words.reshape(1, -1)
    if words.dim() == 2 and words.stride(1) == 1 and words.stride(0) >= words.shape[1]:
        return words
    return None


def sums(words: torch.Tensor) -> torch.Tensor:
    """``[S1, S2]`` of a matrix from :func:`as_rows`, as an int64 tensor on its device (not read back)."""
    rows, cols = words.shape
    programs = triton.cdiv(rows, BLOCK_ROWS) * triton.cdiv(cols, BLOCK_COLS)
    parts = torch.empty((programs, 2), dtype=torch.int64, device=words.device)
    _sums_kernel[(programs,)](words, parts, rows, cols, words.stride(0), BLOCK_R=BLOCK_ROWS, BLOCK_C=BLOCK_COLS)
    return parts.sum(dim=0)
