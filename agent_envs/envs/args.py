"""The environments' own arguments, checked strictly at ``gym.make`` and ``reset``.

A mistyped argument (``max_turns=1.5``, ``max_tokens_per_turn="x"``, ``row_index=True``) is
refused with a ValueError naming it, instead of being coerced or surfacing turns later.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_envs.core.validation import ChatProcessor, WholeNumber, invalid


C = TypeVar("C", bound="Checked")


class Checked(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def checked(cls: type[C], what: str, values: dict[str, Any]) -> C:
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise invalid(what, exc) from None


class EnvOptions(Checked):
    """An environment's own arguments (none here): each environment subclasses it with its
    fields, which ``gym.make`` validates and the config hash includes (``Field(exclude=True)``
    keeps a field out of the hash: it cannot change an outcome's identity)."""


class EnvArgs(Checked):
    max_turns: WholeNumber = Field(ge=1)
    #: <= 0 means no per-turn cap (the request carries no max_tokens), as in the protocol
    max_tokens_per_turn: WholeNumber
    #: 0 or None: no trajectory cap
    max_trajectory_tokens: WholeNumber | None = Field(ge=0)
    max_model_len: WholeNumber | None = Field(ge=1)
    enable_thinking: bool = Field(strict=True)
    compat: Literal["es", "http_eval"]
    render_mode: Literal["ansi"] | None
    #: counts image tokens exactly (docs/protocol.md#image-token-counts)
    processor: ChatProcessor = None
    #: keep the episode as token ids and send them as the prompt (docs/rl.md#token-trajectories)
    token_trajectories: bool = Field(default=False, strict=True)


class ResetOptions(Checked):
    task: Any = None
    row_index: WholeNumber | None = Field(default=None, ge=0)
    sample_index: WholeNumber = Field(default=0, ge=0)
    base_seed: WholeNumber | None = None
    #: the trajectory seed itself, instead of the formula (a frozen key-to-seed map)
    seed_base: WholeNumber | None = None
