"""Tuned settings for vLLM's multi-LoRA Triton kernels, picked per model shape and population.

A low-rank ES generation (docs/protocol.md#low-rank-es) runs every member through its own adapter,
so each engine step runs a LoRA shrink and expand kernel per packed linear layer.  vLLM reads their tile
settings from ``VLLM_TUNED_CONFIG_FOLDER`` (``{GPU}_SHRINK.json``, ``{GPU}_EXPAND_TRUE.json``) and
otherwise uses generic defaults, which for a 16-member population of the 4B shape on an H200 cost
twice what tuned settings do (docs/scaling.md#lora-kernels-tuned-for-the-population).

The shipped folder holds any number of *tuned sets*, one subfolder each: the files one run of
``scripts/tune_lora_kernels.py --out`` writes, with ``tuned_for.json`` naming the model shape, adapter
slots (``max_loras``: the population) and rank slot it searched at, the GPUs whose files the set holds
and the batches (M, rows of a kernel call) it timed.  The GPU is not part of the choice: vLLM itself
opens the files named after the GPU it runs on (a GPU without files in the set gets vLLM's defaults),
so the choice needs no CUDA in this process, before the engine starts.

:func:`choose` takes a set whose shape and rank slot equal the engine's (other shapes and rank slots
are other kernel calls: their sizes K and N would not be in the files).  Among those it takes the set
tuned for this population, else the *nearest* population: the smallest ``|log(max_loras / P)|``, a tie
to the larger.  That is safe because vLLM's own lookup (``get_lora_op_configs`` in
``vllm/lora/ops/triton_ops/utils.py``) already keys a file by adapter slots and batch M and, for a
value that is not in it, takes the key nearest in absolute difference.  So an untuned population of
this shape reads the set's files like the tuned one does: its prefill chunks get the tuned chunk's
setting, and its P x B decode batch the entry of the nearest batch in the files, which is a tuned
batch or, where the tuner did not time one (it writes vLLM's own default at 1, 32, 96, 1024 and 4096),
vLLM's default.  A tile setting changes how the kernel walks its blocks (partial tiles are masked),
never which products it sums (``split_k`` only regroups the sums, as in any tuned set), and the
replay of a generation runs on the same engine with the same settings; what may differ from the tuned
population is speed, and the returned reason says so.
A user's own ``VLLM_TUNED_CONFIG_FOLDER`` always wins.
"""

from __future__ import annotations

import json
import math
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


def set_name(shape: Mapping[str, int], max_loras: int, max_lora_rank: int) -> str:
    """The subfolder a tuned set is shipped under (one per shape, population and rank slot)."""
    dims = "-".join(f"{short}{shape[k]}" for short, k in zip(("h", "i", "a", "kv", "d"), SHAPE_KEYS, strict=True))
    return f"{dims}_loras{max_loras}_rank{max_lora_rank}"


def tuned_sets(folder: Path = SHIPPED) -> list[tuple[Path, dict[str, Any]]]:
    """Every subfolder of ``folder`` with a ``tuned_for.json``, with what it was tuned for (sorted by name)."""
    return [(p.parent, json.loads(p.read_text())) for p in sorted(folder.glob("*/tuned_for.json"))]


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
    """The tuned set for this engine's shape and rank slot at the nearest population, else vLLM's defaults."""
    if environ.get(ENV):
        return KernelChoice(None, f"LoRA kernel settings from {ENV}={environ[ENV]}")
    if shape is None:
        return KernelChoice(
            None, "vLLM's default LoRA kernel settings (the model's shape is unknown: no local config.json)"
        )
    sets = tuned_sets(folder)
    fits = [(p, t) for p, t in sets if t["shape"] == dict(shape) and t["max_lora_rank"] == max_lora_rank]
    if not fits:
        differ = "max_lora_rank" if any(t["shape"] == dict(shape) for _, t in sets) else "shape"
        return KernelChoice(
            None,
            f"vLLM's default LoRA kernel settings (the shipped ones were tuned for another {differ}; "
            f"scripts/tune_lora_kernels.py tunes them for this engine: docs/scaling.md#adding-a-tuned-set)",
        )
    path, tuned = min(fits, key=lambda f: (abs(math.log(f[1]["max_loras"] / max_loras)), -f[1]["max_loras"]))
    gpus = ", ".join(tuned["gpus"])
    if tuned["max_loras"] == max_loras:
        return KernelChoice(
            str(path), f"LoRA kernel settings tuned for this shape and population on {gpus} ({path.name})"
        )
    return KernelChoice(
        str(path),
        f"LoRA kernel settings tuned for this shape on {gpus} at the nearest population, {tuned['max_loras']} "
        f"(not {max_loras}: vLLM takes the nearest tuned batch; tune this one for full speed) ({path.name})",
    )


def use_tuned(
    model: str | None, max_loras: int, max_lora_rank: int, environ: MutableMapping[str, str] = os.environ
) -> str:
    """Point vLLM at the chosen tuned set when :func:`choose` finds one (before the engine starts); the reason."""
    choice = choose(local_model_shape(model), max_loras, max_lora_rank, environ)
    if choice.folder is not None:
        environ[ENV] = choice.folder
    return choice.reason
