"""A cheap, exact fingerprint of a model's weights, computed on the tensors' own device.

SHA-256 over the raw bytes needs the weights on the host (about 14 s for 4B parameters); a
fingerprint is taken after every ES generation, so it has to cost a fraction of a second.  It is
integer arithmetic over the raw bits, which makes it bit-sensitive and independent of how the sums
are split or ordered (integer addition is exact and associative, unlike float reductions):

* a tensor's bytes are read as little-endian signed 16-bit words ``x_i`` (signed bytes when the
  byte count is odd), ``i`` counting from 0 through the whole tensor;
* ``S1 = sum x_i`` and ``S2 = sum x_i * ((i mod 2**15) + 1)``, both exact integers: each word times
  its weight fits in int32, each chunk's sum in int64, and the chunk sums are added as Python ints;
* the fingerprint is ``wf1:`` + BLAKE2b-128 over every selected tensor's name, dtype, shape, S1, S2
  in selection order; with tensor parallelism, BLAKE2b over the ranks' fingerprints.

Flipping any one bit moves ``S1`` by a power of two, so it always changes the fingerprint; ``S2``
also sees most swaps of two words.  It is not a cryptographic digest: the full SHA-256
(``SeededPerturber.checksum``) is still there at the end of a run and on request.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable, Sequence

import torch

VERSION = "wf1"
#: words per reduction step: any value gives the same fingerprint, this one bounds the temporaries
WORDS_PER_STEP = 2**24
_PERIOD = 2**15


def raw_words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as signed 16-bit words (signed bytes for an odd byte count), no copy."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return raw.view(torch.int16) if raw.numel() % 2 == 0 else raw.view(torch.int8)


class _Weights:
    """``(i mod 2**15) + 1`` for one reduction step, kept per device (a step starting at a multiple
    of the period reuses it)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int], torch.Tensor] = {}

    def get(self, device: torch.device, start: int, count: int, step: int) -> torch.Tensor:
        if step % _PERIOD == 0 and start % _PERIOD == 0:
            key = (str(device), step)
            if key not in self._cache:
                self._cache[key] = (torch.arange(step, device=device, dtype=torch.int32) & (_PERIOD - 1)) + 1
            return self._cache[key][:count]
        index = torch.arange(start, start + count, device=device, dtype=torch.int64)
        return ((index & (_PERIOD - 1)) + 1).to(torch.int32)


_WEIGHTS = _Weights()


def _step_sums(words: torch.Tensor, step: int) -> list[torch.Tensor]:
    """Per reduction step, the two int64 sums (still on the device: one transfer at the end)."""
    sums: list[torch.Tensor] = []
    for start in range(0, words.numel(), step):
        count = min(step, words.numel() - start)
        x = words[start : start + count].to(torch.int32)
        sums.append(x.sum(dtype=torch.int64))
        sums.append((x * _WEIGHTS.get(words.device, start, count, step)).sum(dtype=torch.int64))
    return sums


def tensor_sums(tensor: torch.Tensor, step: int = WORDS_PER_STEP, kernel: bool | None = None) -> tuple[int, int]:
    """``(S1, S2)`` of one tensor (exact integers); ``kernel`` as for :func:`_tensor_parts`."""
    return _collect([tensor], step, kernel)[0]


def _tensor_parts(tensor: torch.Tensor, step: int, kernel: bool | None) -> list[torch.Tensor]:
    """A tensor's partial sums on its device, alternating S1 and S2: from one Triton launch where the
    tensor is on a GPU (``kernel`` None) or ``kernel`` asks for it and its words allow
    (:mod:`fingerprint_triton`: the same integers), else per reduction step."""
    if tensor.is_cuda if kernel is None else kernel:
        from . import fingerprint_triton  # Triton only where a kernel runs

        words = fingerprint_triton.as_rows(tensor)
        if words is not None:
            return list(fingerprint_triton.sums(words))
    return _step_sums(raw_words(tensor), step)


def _collect(tensors: Sequence[torch.Tensor], step: int, kernel: bool | None = None) -> list[tuple[int, int]]:
    if int(step) < 1:
        raise ValueError(f"step must be >= 1, got {step!r}")
    per_tensor: list[list[torch.Tensor]] = [_tensor_parts(t, int(step), kernel) for t in tensors]
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for sums in per_tensor:
        for s in sums:
            by_device.setdefault(s.device, []).append(s)
    values = {device: iter(torch.stack(items).tolist()) for device, items in by_device.items()}
    out = []
    for sums in per_tensor:
        got = [next(values[s.device]) for s in sums]
        out.append((sum(got[0::2]), sum(got[1::2])))
    return out


def fingerprint(
    named: Iterable[tuple[str, torch.Tensor]], step: int = WORDS_PER_STEP, kernel: bool | None = None
) -> str:
    """``wf1:<32 hex digits>`` of the named tensors, in the given order (``kernel`` as for
    :func:`_tensor_parts`: the same value either way)."""
    named = list(named)
    digest = hashlib.blake2b(digest_size=16)
    with torch.no_grad():
        sums = _collect([t for _, t in named], step, kernel)
    for (name, tensor), (s1, s2) in zip(named, sums):
        digest.update(f"{name}|{str(tensor.dtype)}|{tuple(tensor.shape)}|{s1}|{s2};".encode())
    return f"{VERSION}:{digest.hexdigest()}"


def _combine(per_rank: str | Sequence[str], digest: Callable[[bytes], str]) -> str:
    if isinstance(per_rank, str):
        return per_rank
    return per_rank[0] if len(per_rank) == 1 else digest("|".join(per_rank).encode())


def combine(per_rank: str | Sequence[str]) -> str:
    """One fingerprint for an engine whose weights are sharded over tensor-parallel ranks (a
    single rank's value is kept as it is)."""
    return _combine(per_rank, lambda b: f"{VERSION}:" + hashlib.blake2b(b, digest_size=16).hexdigest())


def combine_checksums(per_rank: str | Sequence[str]) -> str:
    """One SHA-256 for an engine whose weights are sharded over tensor-parallel ranks."""
    return _combine(per_rank, lambda b: hashlib.sha256(b).hexdigest())
