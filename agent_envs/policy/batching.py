"""Lockstep batching shared by the in-process engines (reference protocol 4.7, 2.4 step 1).

Every request is rendered once to token ids, checked against the context window *before* the engine
sees it, grouped by ``rollout_token_budget``, and generated group by group.  A group that raises is
retried one request at a time so one bad prompt cannot fail its neighbours.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..core.content import has_images
from ..core.tokens import PromptCache, TokenCounter
from .vision import ImagePrompt, ProcessorRenderer
from .base import REQUEST_ERROR, Completion, GenerationRequest, Policy, batch_or_each
from ..protocol.budget import generation_reserve
from .sampling import SamplingConfig, context_overflow


def microbatch(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Group request indices in order.  A group closes once it reaches ``budget``; a request that
    would push it past the budget starts the next group; an oversized request stands alone;
    ``budget <= 0`` means a single group."""
    if not sizes:
        return []
    if budget <= 0:
        return [list(range(len(sizes)))]
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for index, size in enumerate(sizes):
        if current and used + size > budget:
            groups.append(current)
            current, used = [], 0
        current.append(index)
        used += size
        if used >= budget:
            groups.append(current)
            current, used = [], 0
    if current:
        groups.append(current)
    return groups


@dataclass
class Prepared:
    """A request rendered for an engine.  ``prompt_ids`` is what the model attends to (a chat's
    images expanded to their image tokens); ``image`` holds the rest of such a chat's inputs."""

    request: GenerationRequest
    prompt_ids: list[int]
    stop: list[str]
    image: ImagePrompt | None = None

    @property
    def size(self) -> int:
        return len(self.prompt_ids) + generation_reserve(self.request.max_tokens)


class EnginePolicy(Policy):
    """Base for engines that take token ids: renders prompts and checks the context window.

    With a ``processor`` (a vision-language model's), chats with image parts are rendered through
    it; without one they fail as a ``request_error`` that says so.  Text chats are unaffected."""

    def __init__(
        self, tokenizer: Any, sampling: SamplingConfig | None, max_model_len: int | None, processor: Any = None
    ) -> None:
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingConfig()
        self.counter = TokenCounter(tokenizer, enable_thinking=self.sampling.enable_thinking)
        self.prompts = PromptCache(self.counter)
        #: prompt caches of requests that carry tool schemas, by their schemas
        self._tool_prompts: dict[str, PromptCache] = {}
        self.max_model_len = max_model_len
        self.processor = processor
        self.renderer = ProcessorRenderer(processor, self.sampling.enable_thinking) if processor is not None else None
        #: adapters a request may name (``GenerationRequest.adapter``); engines that serve them fill it
        self.adapters: dict[str, Any] = {}

    def warm(self, request: GenerationRequest) -> None:
        """Tokenise the prompt into the episode's cache (thread-safe across episodes; the fast
        tokenizer releases the interpreter lock), so :meth:`prepare` finds it done.  Chats with
        images are rendered in :meth:`prepare` alone; a request with its own ids needs nothing."""
        if request.prompt_token_ids is None and not has_images(request.messages):
            self._prompts_for(request).prompt_ids(request.key, request.messages)

    def _prompts_for(self, request: GenerationRequest) -> PromptCache:
        """The prompt cache rendering the request's tool schemas (the plain one without tools)."""
        if not request.tools:
            return self.prompts
        key = json.dumps(request.tools, sort_keys=True)
        cache = self._tool_prompts.get(key)
        if cache is None:
            counter = TokenCounter(self.tokenizer, enable_thinking=self.sampling.enable_thinking, tools=request.tools)
            cache = self._tool_prompts.setdefault(key, PromptCache(counter))
        return cache

    def prepare(self, request: GenerationRequest) -> Prepared | Completion:
        """Render the prompt (an episode's next turn costs only its new messages; a chat with images
        goes through the processor), or take the request's own ``prompt_token_ids`` as they are; a
        prompt that cannot fit becomes a ``context_length_exceeded`` record, a request naming an
        adapter this policy does not hold a ``request_error``."""
        if request.adapter is not None and request.adapter not in self.adapters:
            known = ", ".join(sorted(self.adapters)) or "none registered"
            return Completion(
                error=REQUEST_ERROR,
                engine=self.name,
                error_message=(
                    f"ValueError: the {self.name} policy has no adapter named {request.adapter!r} ({known})"
                ),
            )
        image = None
        refusal = _unsupported(request, self.name)
        if refusal is not None:
            return refusal
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
        elif has_images(request.messages):
            if self.renderer is None:
                return Completion(
                    error=REQUEST_ERROR,
                    engine=self.name,
                    error_message=(
                        f"ValueError: the request has image parts but the {self.name} policy has no image "
                        "processor (load a vision-language model, or pass processor=)"
                    ),
                )
            try:
                image = self.renderer.render(request.messages)
            except Exception as exc:  # an image that does not decode ends its episode, not the batch
                return Completion.failed(exc, engine=self.name)
            ids = image.ids
        else:
            ids = self._prompts_for(request).prompt_ids(request.key, request.messages)
        overflow = context_overflow(len(ids), request.max_tokens, self.max_model_len, self.name)
        return overflow if overflow is not None else Prepared(request, ids, self.sampling.stop_for(request), image)


def _unsupported(request: GenerationRequest, engine: str) -> Completion | None:
    """A ``request_error`` for what an engine cannot do with a chat that has images: take its
    prompt as token ids (the images would be lost) or render tool schemas into it."""
    if not has_images(request.messages):
        return None
    if request.prompt_token_ids is not None:
        what = "prompt_token_ids (token trajectories cover text chats only)"
    elif request.tools:
        what = "tool schemas (native tool calls cover text chats only)"
    else:
        return None
    return Completion(
        error=REQUEST_ERROR, engine=engine, error_message=f"ValueError: a chat with images cannot take {what}"
    )


class BatchedEnginePolicy(EnginePolicy):
    """A lockstep engine: subclasses implement :meth:`_generate_group` (one engine call)."""

    def __init__(
        self,
        tokenizer: Any,
        sampling: SamplingConfig | None,
        max_model_len: int | None,
        rollout_token_budget: int,
        processor: Any = None,
    ):
        super().__init__(tokenizer, sampling, max_model_len, processor)
        self.rollout_token_budget = rollout_token_budget

    @abc.abstractmethod
    def _generate_group(self, group: list[Prepared]) -> list[Completion]:
        """One engine call for the whole group; may raise."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        results: list[Completion | None] = [None] * len(requests)
        pending: list[tuple[int, Prepared]] = []
        for index, request in enumerate(requests):
            item = self.prepare(request)
            if isinstance(item, Completion):
                results[index] = item
            else:
                pending.append((index, item))
        for group in microbatch([p.size for _, p in pending], self.rollout_token_budget):
            members = [pending[i] for i in group]
            for (index, _), completion in zip(members, self._run_group([p for _, p in members])):
                results[index] = completion
        return [r for r in results if r is not None]

    def _run_group(self, group: list[Prepared]) -> list[Completion]:
        """One engine call; a failure is retried prompt by prompt and recorded, never raised."""
        return batch_or_each(
            self._generate_group,
            group,
            lambda prepared, exc: Completion.failed(exc, prompt_tokens=len(prepared.prompt_ids), engine=self.name),
        )
