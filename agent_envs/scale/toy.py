"""A deterministic policy whose replies depend on the weights of a tiny torch model.

For CPU tests of the pool and of ES over many engines: the same :class:`SeededPerturber` maths a
vLLM worker runs perturbs and updates real tensors here, so member rewards, records and weight
checksums are real, yet an episode costs milliseconds.  Made for ``MATH-ReAct-v0``: the first turn
runs ``python3 -c 'print(k)'`` in the sandbox, with ``k`` the model's argmax on features drawn from
the request seed; the next turn answers the number the tool printed.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from agent_envs.es.perturb import SeededPerturber
from agent_envs.policy.base import Completion, GenerationRequest, Policy
from agent_envs.policy.sampling import cut_at_stop

from .engines import Engine
from .gpu_memory import DeviceMemory


class WeightChoicePolicy(Policy):
    """Picks a number in ``0 .. choices-1`` with a torch model, runs it through the tool, answers it."""

    name = "toy-torch"

    def __init__(self, model: nn.Module, features: int) -> None:
        self.model, self.features = model, features

    def choose(self, seed: int | None) -> int:
        gen = torch.Generator().manual_seed(int(seed or 0))
        with torch.no_grad():
            return int(self.model(torch.randn(self.features, generator=gen)).argmax())

    def reply(self, request: GenerationRequest) -> str:
        if not any(m["role"] == "assistant" for m in request.messages):
            command = f"python3 -c 'print({self.choose(request.seed)})'"
            return "Action:\n" + json.dumps({"name": "bash", "arguments": {"command": command}})
        body = request.messages[-1]["content"].partition("\n")[2]
        found = re.findall(r"-?\d+", body) or ["0"]
        return f"Final answer: \\boxed{{{found[0]}}}"

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return [
            Completion(text=cut_at_stop(self.reply(r), r.stop)[0], finish_reason="stop", engine=self.name)
            for r in requests
        ]


def simulated_gpu_file(folder: str, gpu: str) -> Path:
    """A GPU's memory for CPU tests of the pool: ``{"total": bytes, "used": bytes}``, kept in the node
    folder the pool's start locks use (``EnginePool(start_lock_dir=...)``)."""
    return Path(folder) / f"toy-gpu-{gpu}.json"


def simulated_gpu_memory(gpu: str, folder: str | None = None) -> DeviceMemory | None:
    """The pool's memory probe (``EngineSpec.memory_probe``) over :func:`simulated_gpu_file`."""
    path = simulated_gpu_file(folder or tempfile.gettempdir(), gpu)
    if not path.exists():
        return None
    device = json.loads(path.read_text())
    return DeviceMemory(free=device["total"] - device["used"], total=device["total"])


class TorchToyEngine(Engine):
    """A float32 two-layer network (seeded init) behind :class:`WeightChoicePolicy`.

    ``start_seconds`` makes building it take that long, as a real engine's start does (its memory
    profiling), so tests can see whether engines sharing a GPU start one after another.  With
    ``simulated_gpu`` (a folder, see :func:`simulated_gpu_file`) it starts as a vLLM engine does on a
    GPU: it refuses unless ``gpu_memory_share`` of the GPU is free, then takes ``gpu_footprint`` bytes."""

    def __init__(
        self,
        choices: int = 4,
        features: int = 8,
        hidden: int = 16,
        init_seed: int = 0,
        start_seconds: float = 0.0,
        simulated_gpu: str | None = None,
        gpu_memory_share: float | None = None,
        gpu_footprint: int = 0,
    ) -> None:
        torch.manual_seed(init_seed)
        self.model = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, choices))
        self.policy = WeightChoicePolicy(self.model, features)
        self.gpu_memory_share = gpu_memory_share
        time.sleep(start_seconds)
        if simulated_gpu is not None:
            self._take_gpu_memory(simulated_gpu, gpu_footprint)

    def _take_gpu_memory(self, folder: str, footprint: int) -> None:
        path = simulated_gpu_file(folder, os.environ["CUDA_VISIBLE_DEVICES"])  # Ray's GPU of this actor
        device = json.loads(path.read_text())
        free, ask = device["total"] - device["used"], (self.gpu_memory_share or 0) * device["total"]
        if free < ask:
            raise ValueError(f"free memory {free} is less than the {ask:.0f} this engine asks for")
        path.write_text(json.dumps({**device, "used": device["used"] + footprint}))

    def es_init(self, scope: str = "full", exact_revert: bool = False, revert_copy: str = "auto") -> None:
        self.es = SeededPerturber(self.model, scope, exact_revert=exact_revert, revert_copy=revert_copy)
