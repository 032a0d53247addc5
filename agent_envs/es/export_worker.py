"""Inside a vLLM worker: the model's weights under Hugging Face names, hashed and saved (TP = 1).

vLLM fuses some checkpoint tensors into one parameter (``q_proj``/``k_proj``/``v_proj`` into
``qkv_proj``, ``gate_proj``/``up_proj`` into ``gate_up_proj``, every expert's projections into one
``w13_weight``/``w2_weight``) and pads the vocabulary rows of embeddings.  :func:`hf_tensors` undoes
that from the layers' own metadata (the model's ``packed_modules_mapping``, each merged layer's
``output_sizes``, each embedding's ``org_vocab_size``), so the saved folder is an ordinary
checkpoint that any loader reads.  Its hash (:func:`hf_checksum`) is what an export and its reload
compare: padded rows are never loaded (a fresh engine zeroes them), so they are not in it.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterator

import torch

from .worker import ESWorkerExtension, _tp_rank_and_size

EXPORT_EXTENSION = "agent_envs.es.export_worker.ExportWorkerExtension"
#: the default shard size of a saved checkpoint
MAX_SHARD_BYTES = 5 * 2**30
_EXPERT_PARTS = {"w13_weight": ("gate_proj", "up_proj"), "w2_weight": ("down_proj",)}


def hf_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, tensor view)`` for every parameter of a TP = 1 vLLM model."""
    packed = getattr(model, "packed_modules_mapping", None) or {}
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():
        owner_name, _, leaf = name.rpartition(".")
        owner = modules[owner_name]
        parent, _, last = owner_name.rpartition(".")
        prefix = f"{parent}." if parent else ""
        if last in packed and hasattr(owner, "output_sizes"):
            parts, sizes = packed[last], list(owner.output_sizes)
            if len(parts) != len(sizes):
                raise ValueError(f"{name}: {len(parts)} packed names {parts} for {len(sizes)} output sizes")
            yield from (
                (f"{prefix}{part}.{leaf}", view) for part, view in zip(parts, torch.split(param.data, sizes, dim=0))
            )
        elif leaf in _EXPERT_PARTS and param.dim() == 3:
            names = _EXPERT_PARTS[leaf]
            for expert in range(param.shape[0]):
                for part, view in zip(names, param.data[expert].chunk(len(names), dim=0)):
                    yield f"{owner_name}.{expert}.{part}.weight", view
        elif leaf.startswith(("w13_", "w2_")):
            raise ValueError(
                f"{name}: expert parameters other than plain weights cannot be exported "
                "as a checkpoint; save the sharded state instead"
            )
        elif hasattr(owner, "org_vocab_size") and leaf == "weight":
            yield name, param.data[: owner.org_vocab_size]
        else:
            yield name, param.data


def _digest_tensor(digest: Any, name: str, tensor: torch.Tensor) -> None:
    digest.update(json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode())
    digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())


def hf_checksum(model: torch.nn.Module) -> str:
    """SHA-256 over the checkpoint tensors (name, dtype, shape, bytes) in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(hf_tensors(model), key=lambda item: item[0]):
        _digest_tensor(digest, name, tensor)
    return digest.hexdigest()


def save_hf_safetensors(model: torch.nn.Module, path: str, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Write ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` plus the index) into
    ``path``; return the file names."""
    from safetensors.torch import save_file

    shards: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, tensor in sorted(hf_tensors(model), key=lambda item: item[0]):
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, tensor))
        size += nbytes
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map = {}
    for file, shard in zip(names, shards):
        save_file(
            {name: t.detach().contiguous().cpu() for name, t in shard},
            os.path.join(path, file),
            metadata={"format": "pt"},
        )
        weight_map.update({name: file for name, _ in shard})
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for s in shards for _, t in s)},
            "weight_map": weight_map,
        }
        with open(os.path.join(path, "model.safetensors.index.json"), "w", encoding="utf-8") as out:
            json.dump(index, out, indent=2)
        names.append("model.safetensors.index.json")
    return names


class ExportWorkerExtension(ESWorkerExtension):
    """The ES methods, plus checkpoint export (what ``agent-envs export-checkpoint`` builds its engines with)."""

    def _single_rank_model(self) -> torch.nn.Module:
        if _tp_rank_and_size()[1] != 1:
            raise RuntimeError(
                "a Hugging Face checkpoint is written from tensor_parallel_size=1; "
                "save the sharded state for tensor parallelism"
            )
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def export_hf_checksum(self) -> str:
        return hf_checksum(self._single_rank_model())

    def export_hf_safetensors(self, path: str, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
        return save_hf_safetensors(self._single_rank_model(), path, max_shard_bytes)
