"""The contract between environments, policies and runners: what to generate, what came back.

It sits below both layers, so an environment and a policy share these types without importing
each other.  A failed generation is a :class:`Completion` carrying ``error`` (never an exception),
which ends its episode with the matching termination reason.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from agent_envs.core.content import Message  # noqa: F401  (string or content parts)


REQUEST_ERROR = "request_error"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
#: termination reason of an episode whose model text the environment could not handle (an
#: exception that was not a machine fault): the model's outcome, scored 0, never re-run
INVALID_OUTPUT = "invalid_output"


class InfrastructureError(RuntimeError):
    """A fault of the machine (a sandbox that cannot start), never of anything a model wrote."""


#: exceptions that count as the machine's fault when they leave an environment's ``step``: they
#: become ``env_error`` records (re-run by ``--resume``); every other exception raised while a
#: model's text is handled is the model's outcome (:data:`INVALID_OUTPUT`, docs/reliability.md)
MACHINE_FAULTS: tuple[type[Exception], ...] = (OSError, MemoryError, InfrastructureError)


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
    #: generate through this named adapter (e.g. a LoRA the policy registered); None: the base weights.
    #: A policy that does not know the name answers with a ``request_error``, never the base model.
    adapter: str | None = None
    #: the exact prompt: engines send these ids instead of rendering ``messages`` (token-in,
    #: token-out: the environment's token trajectory, docs/rl.md#token-trajectories)
    prompt_token_ids: list[int] | None = None
    #: return the log-probability of each sampled token (off by default: it costs throughput)
    logprobs: bool = False
    #: tool schemas (OpenAI ``tools`` entries) the chat template renders into the prompt
    #: (docs/protocol.md#native-tool-calls); None: no tools are shown
    tools: list[dict[str, Any]] | None = None
    #: sampling settings over the policy's own for this request (``SamplingConfig`` fields, e.g. an ES
    #: member's greedy decoding); None: the policy's.  The engine policies (vLLM, transformers,
    #: OpenAI-compatible) honour them; scripted policies do not sample.
    sampling: dict[str, Any] | None = None


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
    #: with ``request.logprobs``: the sampled tokens' log-probabilities, aligned with ``token_ids``
    logprobs: list[float] | None = None
    #: with ``request.logprobs``: the prompt ids as the engine reports having seen them
    prompt_token_ids: list[int] | None = None
    #: tool calls a server parsed out of the text (OpenAI ``message.tool_calls`` entries)
    tool_calls: list[dict[str, Any]] | None = None

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
