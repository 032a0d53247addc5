"""Policies: something that turns generation requests into completions.

Light modules load eagerly; the engine-backed ones (vLLM, transformers) import their heavy
dependencies only when one of their names is first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import CONTEXT_LENGTH_EXCEEDED, REQUEST_ERROR, Completion, GenerationRequest, Policy
from .batching import microbatch
from .openai import OpenAIPolicy
from .sampling import SamplingConfig
from .scripted import RecordingPolicy, ScriptedOpening, ScriptedPolicy, SimulatedPolicy

_LAZY = {
    "VLLMPolicy": "vllm",
    "AsyncVLLMPolicy": "vllm",
    "TransformersPolicy": "hf",
    "default_cpu_policy": "hf",
    "PolicyServer": "server",
}

__all__ = [
    "CONTEXT_LENGTH_EXCEEDED",
    "REQUEST_ERROR",
    "Completion",
    "GenerationRequest",
    "Policy",
    "microbatch",
    "OpenAIPolicy",
    "RecordingPolicy",
    "SamplingConfig",
    "ScriptedOpening",
    "ScriptedPolicy",
    "SimulatedPolicy",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
