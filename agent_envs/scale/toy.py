"""A deterministic policy whose replies depend on the weights of a tiny torch model.

For CPU tests of the pool and of ES over many engines: the same :class:`SeededPerturber` maths a
vLLM worker runs perturbs and updates real tensors here, so member rewards, records and weight
checksums are real, yet an episode costs milliseconds.  Made for ``MATH-ReAct-v0``: the first turn
runs ``python3 -c 'print(k)'`` in the sandbox, with ``k`` the model's argmax on features drawn from
the request seed; the next turn answers the number the tool printed.
"""

from __future__ import annotations

import json
import re
import time
from typing import Sequence

import torch
from torch import nn

from agent_envs.es.perturb import SeededPerturber
from agent_envs.policy.base import Completion, GenerationRequest, Policy
from agent_envs.policy.sampling import cut_at_stop

from .engines import Engine


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


class TorchToyEngine(Engine):
    """A float32 two-layer network (seeded init) behind :class:`WeightChoicePolicy`.

    ``start_seconds`` makes building it take that long, as a real engine's start does (its memory
    profiling), so tests can see whether engines sharing a GPU start one after another."""

    def __init__(
        self, choices: int = 4, features: int = 8, hidden: int = 16, init_seed: int = 0, start_seconds: float = 0.0
    ) -> None:
        torch.manual_seed(init_seed)
        self.model = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, choices))
        self.policy = WeightChoicePolicy(self.model, features)
        time.sleep(start_seconds)

    def es_init(self, scope: str = "full", exact_revert: bool = False, revert_copy: str = "auto") -> None:
        self.es = SeededPerturber(self.model, scope, exact_revert=exact_revert, revert_copy=revert_copy)
