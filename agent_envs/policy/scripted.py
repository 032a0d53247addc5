"""Deterministic policies: scripted replies for tests and baselines, and a simulated engine whose
only job is to take realistic time, for scheduling benchmarks."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Mapping, Sequence

from .base import Completion, GenerationRequest, Policy
from ..protocol.budget import token_cap
from .sampling import cut_at_stop

Reply = str | Completion
Script = Sequence[str] | Mapping[str, Sequence[str]] | Callable[[GenerationRequest], Reply]


class ScriptExhausted(RuntimeError):
    pass


class ScriptedPolicy(Policy):
    """Replies from a script, applying stop strings as an engine would.

    ``script`` is a list of replies played in turn order for every episode (one cursor per
    ``request.key``), a mapping from episode key to such a list, or ``fn(request) -> str | Completion``.
    Running out of script yields a ``request_error`` completion rather than an exception.
    """

    name = "scripted"

    def __init__(self, script: Script, *, tokenizer: Any = None, sampled: bool = True) -> None:
        self.script = script
        self.tokenizer = tokenizer
        #: whether a text reply stands for an engine's sample (its ids, as one); an environment's
        #: baseline is not the policy's sample: no ids, so a token trajectory keeps it out of the loss
        self.sampled = sampled
        self._cursor: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def _reply(self, request: GenerationRequest) -> Reply:
        if callable(self.script):
            return self.script(request)
        replies = self.script[request.key] if isinstance(self.script, Mapping) else self.script
        with self._lock:
            turn = self._cursor[request.key]
            self._cursor[request.key] = turn + 1
        if turn >= len(replies):
            raise ScriptExhausted(f"no scripted reply {turn} for episode {request.key!r} ({len(replies)} scripted)")
        return replies[turn]

    def complete(self, request: GenerationRequest) -> Completion:
        try:
            reply = self._reply(request)
        except (ScriptExhausted, KeyError) as exc:
            return Completion.failed(exc, engine=self.name)
        if isinstance(reply, Completion):
            return reply
        text, _ = cut_at_stop(reply, request.stop)
        ids = None
        if self.sampled and self.tokenizer is not None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Completion(text=text, token_ids=ids, finish_reason="stop", engine=self.name)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return [self.complete(r) for r in requests]

    async def agenerate(self, request: GenerationRequest) -> Completion:
        return self.complete(request)


class WrappedPolicy(Policy):
    """A policy in front of another: tokenizer, processor, window, warming and identity are the
    inner policy's, so runners and environments count tokens exactly as it does."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.tokenizer, self.processor = policy.tokenizer, policy.processor
        self.max_model_len, self.name = policy.max_model_len, policy.name

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return self.policy.generate(requests)

    async def agenerate(self, request: GenerationRequest) -> Completion:
        return await self.policy.agenerate(request)

    def warm(self, request: GenerationRequest) -> None:
        self.policy.warm(request)

    def describe(self) -> dict[str, Any]:
        return self.policy.describe()


class RecordingPolicy(WrappedPolicy):
    """Keeps every (request, completion) pair the inner policy handled: what a model was really
    sent (images, prompt lengths), for checks and debugging."""

    def __init__(self, policy: Policy):
        super().__init__(policy)
        self.calls: list[tuple[GenerationRequest, Completion]] = []
        self._lock = threading.Lock()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = self.policy.generate(requests)
        with self._lock:
            self.calls += list(zip(requests, out))
        return out

    async def agenerate(self, request: GenerationRequest) -> Completion:
        out = await self.policy.agenerate(request)
        with self._lock:
            self.calls.append((request, out))
        return out


class ScriptedOpening(WrappedPolicy):
    """The first turns of every episode from a list of replies, every later turn from ``policy``.

    A small or randomly initialised model rarely calls a tool by itself; opening its episodes with
    scripted tool calls puts real tool observations (a ``view`` image, command output) into the
    chats it then continues, so a plumbing run covers them.  The turn is the number of assistant
    messages already in the chat; a reply may be ``fn(request) -> str`` (e.g. an environment's
    scripted baseline, whose first reply is a tool call for the task at hand)."""

    def __init__(self, opening: Sequence[str | Callable[[GenerationRequest], str]], policy: Policy):
        super().__init__(policy)
        self.opening = list(opening)

    def _scripted(self, request: GenerationRequest) -> Completion | None:
        turn = sum(m.get("role") == "assistant" for m in request.messages)
        if turn >= len(self.opening):
            return None
        reply = self.opening[turn]
        text, _ = cut_at_stop(reply(request) if callable(reply) else reply, request.stop)
        return Completion(text=text, finish_reason="stop", engine="scripted")

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        scripted = [self._scripted(r) for r in requests]
        later = iter(self.policy.generate([r for r, s in zip(requests, scripted) if s is None]))
        return [s if s is not None else next(later) for s in scripted]

    async def agenerate(self, request: GenerationRequest) -> Completion:
        scripted = self._scripted(request)
        return scripted if scripted is not None else await self.policy.agenerate(request)

    def warm(self, request: GenerationRequest) -> None:
        if self._scripted(request) is None:
            self.policy.warm(request)

    def describe(self) -> dict[str, Any]:
        return {**self.policy.describe(), "scripted_opening": len(self.opening)}


class SimulatedPolicy(Policy):
    """A stand-in engine that costs realistic time.

    Each request's output length is drawn from a log-normal (long tail) seeded by the request seed and
    capped by ``max_tokens``; generating it "takes" ``length * per_token_s``.  ``generate`` models a
    lockstep batch, whose every request waits for the longest one; ``agenerate`` models continuous
    batching, where each request pays only for its own length.  The text comes from a
    :class:`ScriptedPolicy`.  Sleeping *is* the workload here.
    """

    name = "simulated"

    def __init__(
        self,
        script: Script,
        *,
        per_token_s: float = 1e-4,
        median_tokens: int = 200,
        sigma: float = 1.0,
        call_overhead_s: float = 0.0,
    ):
        self.scripted = ScriptedPolicy(script)
        self.per_token_s = per_token_s
        self.median_tokens = median_tokens
        self.sigma = sigma
        self.call_overhead_s = call_overhead_s

    def length(self, request: GenerationRequest) -> int:
        rng = random.Random(request.seed)
        tokens = max(1, round(self.median_tokens * math.exp(self.sigma * rng.gauss(0.0, 1.0))))
        cap = token_cap(request.max_tokens)
        return tokens if cap is None else min(tokens, cap)

    def _complete(self, request: GenerationRequest, length: int) -> Completion:
        completion = self.scripted.complete(request)
        if completion.ok:
            completion = completion.model_copy(update={"completion_tokens": length, "engine": self.name})
        return completion

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        lengths = [self.length(r) for r in requests]
        time.sleep(self.call_overhead_s + max(lengths, default=0) * self.per_token_s)
        return [self._complete(r, n) for r, n in zip(requests, lengths)]

    async def agenerate(self, request: GenerationRequest) -> Completion:
        length = self.length(request)
        await asyncio.sleep(self.call_overhead_s + length * self.per_token_s)
        return self._complete(request, length)
