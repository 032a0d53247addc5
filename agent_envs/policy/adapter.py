"""A view of a policy whose every request is generated through one named adapter.

Runners and environments know nothing of adapters; an ES member served as a LoRA adapter is just
this view handed to the rollout.  Requests keep their seeds; their episode keys get the adapter's
name in front, so members running the same tasks on one policy at once never share a prompt cache
entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import Completion, GenerationRequest, Policy


class AdapterPolicy(Policy):
    """``policy`` with ``GenerationRequest.adapter = adapter`` on every request.  Closing the view
    leaves the wrapped policy open (it belongs to the caller)."""

    def __init__(self, policy: Policy, adapter: str) -> None:
        if not adapter:
            raise ValueError("AdapterPolicy needs a non-empty adapter name")
        self.policy, self.adapter = policy, adapter
        self.name = policy.name

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    @property
    def processor(self) -> Any:
        return self.policy.processor

    @property
    def max_model_len(self) -> int | None:  # type: ignore[override]
        return self.policy.max_model_len

    def route(self, request: GenerationRequest) -> GenerationRequest:
        key = f"{self.adapter}/{request.key}" if request.key else ""
        return request.model_copy(update={"adapter": self.adapter, "key": key})

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return self.policy.generate([self.route(r) for r in requests])

    async def agenerate(self, request: GenerationRequest) -> Completion:
        return await self.policy.agenerate(self.route(request))

    def warm(self, request: GenerationRequest) -> None:
        self.policy.warm(self.route(request))

    def describe(self) -> dict[str, Any]:
        return {**self.policy.describe(), "adapter": self.adapter}
