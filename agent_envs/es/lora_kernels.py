"""Tuned settings for vLLM's multi-LoRA Triton kernels, used only for the shape they were measured on.

A low-rank ES generation (docs/protocol.md#low-rank-es) runs every member through its own adapter, so
each engine step runs a LoRA shrink and expand kernel per packed linear layer.  vLLM reads their tile
settings from ``VLLM_TUNED_CONFIG_FOLDER`` (``{GPU}_SHRINK.json``, ``{GPU}_EXPAND_TRUE.json``) and
otherwise uses generic defaults, which for a 16-member population of the 4B shape on an H200 cost
twice what tuned settings do (docs/scaling.md#lora-kernels-tuned-for-the-population).  The folder
shipped here holds those files and ``tuned_for.json``: the model shape, adapter slots and rank slot
``scripts/tune_lora_kernels.py`` searched at.  An engine gets it only when it matches all of them
(a GPU without files of its own falls back to vLLM's defaults inside vLLM); anything else keeps
vLLM's defaults, and a user's own ``VLLM_TUNED_CONFIG_FOLDER`` always wins.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "VLLM_TUNED_CONFIG_FOLDER"
SHIPPED = Path(__file__).with_name("lora_kernel_configs")
#: what a LoRA kernel's shapes depend on in a dense decoder (``config.json`` keys)
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")


def model_shape(config: Mapping[str, Any]) -> dict[str, int]:
    """The :data:`SHAPE_KEYS` of a Hugging Face ``config.json`` (``head_dim`` defaults to hidden / heads)."""
    values = {k: config.get(k) for k in SHAPE_KEYS}
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    if values["head_dim"] is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        values["head_dim"] = hidden // heads
    shape = {k: v for k, v in values.items() if isinstance(v, int)}
    if len(shape) < len(SHAPE_KEYS):
        raise ValueError(f"config.json lacks {', '.join(k for k in SHAPE_KEYS if k not in shape)}")
    return shape


def local_model_shape(model: str | None) -> dict[str, int] | None:
    """The shape of a model folder's ``config.json``; None for a hub name or a config without the keys."""
    path = Path(model or "") / "config.json"
    try:
        return model_shape(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class KernelChoice:
    """``folder``: the value for :data:`ENV` (None: leave the environment as it is); ``reason``: a log line."""

    folder: str | None
    reason: str


def choose(
    shape: Mapping[str, int] | None,
    max_loras: int,
    max_lora_rank: int,
    environ: Mapping[str, str],
    folder: Path = SHIPPED,
) -> KernelChoice:
    """The tuned folder when this engine is the one it was tuned for, else vLLM's defaults (with why)."""
    if environ.get(ENV):
        return KernelChoice(None, f"LoRA kernel settings from {ENV}={environ[ENV]}")
    tuned = json.loads((folder / "tuned_for.json").read_text())
    if shape is None:
        return KernelChoice(
            None, "vLLM's default LoRA kernel settings (the model's shape is unknown: no local config.json)"
        )
    want = {"shape": dict(shape), "max_loras": max_loras, "max_lora_rank": max_lora_rank}
    differ = [k for k, v in want.items() if tuned[k] != v]
    if differ:
        return KernelChoice(
            None,
            f"vLLM's default LoRA kernel settings (the shipped ones were tuned for another {' and '.join(differ)}; "
            f"scripts/tune_lora_kernels.py tunes them for this engine, then set {ENV})",
        )
    return KernelChoice(
        str(folder),
        f"LoRA kernel settings tuned for this shape on {', '.join(tuned['gpus'])} ({folder.name}; vLLM's defaults elsewhere)",
    )


def use_tuned(
    model: str | None, max_loras: int, max_lora_rank: int, environ: MutableMapping[str, str] = os.environ
) -> str:
    """Point vLLM at the shipped settings when :func:`choose` says so (before the engine starts); the reason."""
    choice = choose(local_model_shape(model), max_loras, max_lora_rank, environ)
    if choice.folder is not None:
        environ[ENV] = choice.folder
    return choice.reason
