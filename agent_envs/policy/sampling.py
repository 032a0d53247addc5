"""Protocol sampling settings (reference protocol 1.6).

One config per policy; the per-request parts (seed, ``max_tokens``, stop strings) come from each
:class:`~agent_envs.policy.base.GenerationRequest`, because the environment derives the seed from the
episode and turn.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..protocol.budget import context_detail, exceeds_context
from ..protocol.messages import STOP
from .base import CONTEXT_LENGTH_EXCEEDED, Completion, GenerationRequest

PROTOCOL_STOP = list(STOP)


class SamplingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    #: 0 or -1 disables top-k
    top_k: int = Field(40, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = 2.0
    repetition_penalty: float = Field(1.0, gt=0.0)
    #: used when a request carries no stop strings of its own
    stop: list[str] = Field(default_factory=lambda: list(PROTOCOL_STOP))
    enable_thinking: bool = False
    #: keep generating past the end-of-sequence token (vLLM only): fixed-length outputs for benchmarks
    ignore_eos: bool = False

    def stop_for(self, request: GenerationRequest) -> list[str]:
        return list(request.stop) if request.stop else list(self.stop)

    def for_request(self, request: GenerationRequest) -> SamplingConfig:
        """These settings with the request's own on top (``GenerationRequest.sampling``), checked."""
        return self if not request.sampling else SamplingConfig(**{**self.model_dump(), **request.sampling})


def context_overflow(
    prompt_tokens: int, max_tokens: int | None, max_model_len: int | None, engine: str
) -> Completion | None:
    """The ``context_length_exceeded`` completion for a prompt that cannot fit, else None."""
    if not exceeds_context(prompt_tokens, max_tokens, max_model_len):
        return None
    return Completion(
        error=CONTEXT_LENGTH_EXCEEDED,
        prompt_tokens=prompt_tokens,
        engine=engine,
        error_message=context_detail(prompt_tokens, max_tokens, max_model_len),
    )


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Drop the earliest stop string and everything after it (the engines exclude it from output)."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    if not hits:
        return text, False
    return text[: min(hits)], True
