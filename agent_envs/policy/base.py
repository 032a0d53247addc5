"""The policy interface: a batch of generation requests in, completions out.

Environments never call a policy; runners do.  An environment says what it wants generated next
(:class:`GenerationRequest`: messages, seed, token budget, stop strings) and consumes a
:class:`Completion` in ``step``.  A completion that failed carries ``error`` instead of text and ends
its episode with the matching termination reason rather than raising.
"""
from __future__ import annotations

import abc
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field

Message = dict[str, str]

REQUEST_ERROR = "request_error"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[Message]
    seed: int | None = None
    max_tokens: int | None = None
    stop: list[str] = Field(default_factory=list)
    #: opaque key the runner uses to route the completion back (episode id)
    key: str = ""
    #: the episode's position in the evaluated list and its sample number; multi-endpoint policies
    #: route job ``row_index * samples + sample_index`` like the protocol's engine assignment (4.7)
    row_index: int | None = None
    sample_index: int | None = None


class Completion(BaseModel):
    """One generation.  ``token_ids`` makes the environment's token budgets exact."""

    model_config = ConfigDict(extra="forbid")

    text: str = ""
    token_ids: list[int] | None = None
    #: the server-reported count (``usage.completion_tokens``) when token ids are not available
    completion_tokens: int | None = None
    finish_reason: str | None = None  # "stop" | "length" | ...
    prompt_tokens: int | None = None
    #: ``None`` on success; otherwise "request_error" or "context_length_exceeded"
    error: str | None = None
    error_message: str | None = None
    #: which engine or endpoint produced it
    engine: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def num_tokens(self) -> int | None:
        """Generated-token count: exact ids first, then the server's count, else unknown."""
        if self.token_ids is not None:
            return len(self.token_ids)
        return self.completion_tokens

    @classmethod
    def failed(cls, exc: BaseException, **fields: Any) -> "Completion":
        """The protocol's ``request_error`` record: ``<ExcType>: <msg>``."""
        return cls(error=REQUEST_ERROR, error_message=error_text(exc), **fields)


def error_text(exc: BaseException) -> str:
    """``<ExcType>: <msg>``, the protocol's way of writing a failure into records."""
    return f"{type(exc).__name__}: {exc}"


class Policy(abc.ABC):
    """Batched text generation.  ``generate`` must return one completion per request, in order,
    and must not raise for a single failing request (return ``Completion(error=...)``)."""

    #: a Hugging Face tokenizer when the policy has one (used for exact token budgets)
    tokenizer: Any = None
    #: maximum prompt + generation length, when known
    max_model_len: int | None = None
    name: str = "policy"

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        ...

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """Single-request async generation; backends with a real async engine override this."""
        import asyncio

        return (await asyncio.to_thread(self.generate, [request]))[0]

    def warm(self, request: GenerationRequest) -> None:
        """Host-side work for ``request`` ahead of its ``generate`` call (e.g. tokenising the prompt).

        The runner calls it from its env worker threads right after each episode's step, so that
        work overlaps the other episodes' steps instead of running serially while the engine waits.
        It may raise: the same error then surfaces from ``generate`` as usual."""

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        """Identity for records (model, engine, endpoint)."""
        return {"policy": self.name}
