"""Views of a policy that change every request on its way: through one named adapter
(:class:`AdapterPolicy`), or with sampling settings of their own (:class:`SamplingPolicy`).

Runners and environments know nothing of adapters; an ES member served as a LoRA adapter is just
this view handed to the rollout.  Requests keep their seeds; their episode keys get the adapter's
name in front, so members running the same tasks on one policy at once never share a prompt cache
entry.  An ES member decoded greedily while held-out episodes keep the policy's sampling is the
sampling view over the same policy.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Completion, GenerationRequest, Policy
from .sampling import SamplingConfig


class PolicyView(Policy):
    """``policy`` with every request passed through :meth:`route`.  Closing the view leaves the
    wrapped policy open (it belongs to the caller)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
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

    @abc.abstractmethod
    def route(self, request: GenerationRequest) -> GenerationRequest:
        """The request as the wrapped policy gets it."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return self.policy.generate([self.route(r) for r in requests])

    async def agenerate(self, request: GenerationRequest) -> Completion:
        return await self.policy.agenerate(self.route(request))

    def warm(self, request: GenerationRequest) -> None:
        self.policy.warm(self.route(request))


class AdapterPolicy(PolicyView):
    """``policy`` with ``GenerationRequest.adapter = adapter`` on every request."""

    def __init__(self, policy: Policy, adapter: str) -> None:
        if not adapter:
            raise ValueError("AdapterPolicy needs a non-empty adapter name")
        super().__init__(policy)
        self.adapter = adapter

    def route(self, request: GenerationRequest) -> GenerationRequest:
        key = f"{self.adapter}/{request.key}" if request.key else ""
        return request.model_copy(update={"adapter": self.adapter, "key": key})

    def describe(self) -> dict[str, Any]:
        return {**self.policy.describe(), "adapter": self.adapter}


class SamplingPolicy(PolicyView):
    """``policy`` with ``GenerationRequest.sampling = settings`` on every request (checked here, so a
    bad setting fails before any episode runs)."""

    def __init__(self, policy: Policy, settings: Mapping[str, Any]) -> None:
        SamplingConfig(**dict(settings))
        super().__init__(policy)
        self.settings = dict(settings)

    def route(self, request: GenerationRequest) -> GenerationRequest:
        return request.model_copy(update={"sampling": {**(request.sampling or {}), **self.settings}})

    def describe(self) -> dict[str, Any]:
        return {**self.policy.describe(), "sampling_override": self.settings}
