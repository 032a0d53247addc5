"""``Countdown-ReAct-v0``: reach a target number with a persistent python tool and a bash tool
(docs/protocol.md#countdown).  ``single_turn=True`` is the common single-turn ES setup: one reply,
no tools, the single-turn prompt."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agent_envs.core.spec import EnvSpec
from agent_envs.envs.args import EnvOptions
from agent_envs.envs.countdown.scoring import countdown_score
from agent_envs.envs.countdown.spec import SINGLE_TURN_SPEC, SPEC
from agent_envs.envs.react import EpisodeState, ReActEnv
from agent_envs.scoring.result import ScoreResult


class CountdownOptions(EnvOptions):
    single_turn: bool = Field(default=False, strict=True)


class CountdownReActEnv(ReActEnv):
    """20 turns, 2048 tokens per turn; reward 1.0 for an exact expression using every number once."""

    env_spec = SPEC
    Options = CountdownOptions
    options: CountdownOptions

    def __init__(self, *, max_turns: int | None = None, **kwargs: Any):
        if kwargs.get("single_turn") is True and max_turns not in (None, 1):
            raise ValueError("single_turn=True means max_turns=1")
        super().__init__(max_turns=max_turns, **kwargs)

    def _spec_for(self, options: CountdownOptions) -> EnvSpec:
        return SINGLE_TURN_SPEC if options.single_turn else self.env_spec

    def _score(self, ep: EpisodeState) -> ScoreResult:
        return countdown_score(ep.last_completion, ep.task, termination_reason=ep.termination_reason)


Env = CountdownReActEnv
