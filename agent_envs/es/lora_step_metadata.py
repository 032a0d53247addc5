"""vLLM's per-step LoRA kernel metadata, prepared on the host (docs/scaling.md#population-kernels).

Whenever a step's request-to-adapter mapping changes (requests joining or leaving: every turn boundary of
an ES generation), vLLM's GPU Punica wrapper rebuilds its kernel metadata from each token's adapter slot
*on the device*: ``torch.all`` read back into a host flag and ``torch.unique``, whose output size the host
must wait for.  A read-back waits for every kernel already queued, so with async scheduling (vLLM's
default) the host stops preparing step N+1 until step N's forward has finished, and the GPU then idles
while the host builds the rest of the step.  The mapping is a host tuple to begin with, so here the same
tensors are computed from it with numpy and copied from pinned memory without waiting.

:func:`prepare` fills one ``LoRAKernelMeta`` exactly as its ``prepare_tensors`` does (vLLM 0.26 to 0.32;
tests/lora_step_metadata_cases.py compares every field), and :func:`update_metadata` is the GPU wrapper's
``update_metadata`` on it, which :func:`agent_envs.es.population_lora.install` puts in place.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def slots_of(lora_ids: Sequence[int], index: Mapping[int, int]) -> np.ndarray:
    """Each entry's adapter slot (-1: no adapter), the rule of vLLM's ``convert_mapping``: ids above 0 are
    adapters, looked up in the slot table."""
    return np.fromiter((index[i] if i > 0 else -1 for i in lora_ids), dtype=np.int32, count=len(lora_ids))


def _host_to(dst: torch.Tensor, values: np.ndarray) -> None:
    """Copy ``values`` into the front of ``dst`` without waiting: through pinned memory on a GPU (the
    caching host allocator keeps the block until the copy has run, so the next step cannot overwrite it)."""
    src = torch.from_numpy(values)
    if dst.is_cuda:
        src = src.pin_memory()
    dst[: len(values)].copy_(src, non_blocking=dst.is_cuda)


def prepare(meta: Any, slots: np.ndarray) -> None:
    """``meta.prepare_tensors`` for a token-to-slot mapping given on the host: the no-adapter flag, the
    tokens' slots, their order sorted by slot (stable), the slots present with their token counts and
    cumulative starts (the unused entries reset as vLLM resets them), and the count of active adapters
    rounded up to a captured CUDA graph's."""
    no_lora = bool((slots == -1).all())
    meta.no_lora_flag_cpu[0] = no_lora
    width = meta.active_lora_ids.numel()
    ids = np.full(width, -1, dtype=np.int32)
    counts = np.zeros(width, dtype=np.int32)
    starts = np.zeros(width + 1, dtype=np.int32)
    active = 0
    if not no_lora:
        present, per_slot = np.unique(slots, return_counts=True)
        active = len(present)
        ids[:active], counts[:active] = present, per_slot
        starts[1 : 1 + active] = np.cumsum(per_slot)
        _host_to(meta.token_lora_mapping, slots)
        _host_to(meta.token_indices_sorted_by_lora_ids, np.argsort(slots, kind="stable").astype(np.int32))
        captured = getattr(meta, "captured_lora_counts", None) or []
        at = bisect.bisect_left(captured, active)
        if at < len(captured):
            active = captured[at]
    _host_to(meta.active_lora_ids, ids)
    _host_to(meta.num_tokens_per_lora, counts)
    _host_to(meta.lora_token_start_loc, starts)
    meta.num_active_loras_cpu[0] = active


def update_metadata(
    wrapper: Any, mapping: Any, lora_index_to_id: list[int | None], max_loras: int, vocab_size: int, **kwargs: Any
) -> None:
    """``PunicaWrapperGPU.update_metadata`` (same arguments) with its kernel metadata from :func:`prepare`:
    the base indices stay vLLM's (already copied without waiting), the token and prompt metadata are
    computed from the mapping's host tuples."""
    wrapper.is_prefill = mapping.is_prefill
    wrapper._update_base_metadata(mapping, lora_index_to_id, max_loras, vocab_size)
    index = {lora_id: slot for slot, lora_id in enumerate(lora_index_to_id) if lora_id is not None}
    prepare(wrapper.token_mapping_meta, slots_of(mapping.index_mapping, index))
    prepare(wrapper.prompt_mapping_meta, slots_of(mapping.prompt_mapping, index))
