"""``Countdown-Tools-v0``: the Countdown environment with native tool calls (docs/protocol.md#native-tool-calls)."""
from __future__ import annotations

from typing import Any

from agent_envs.envs.countdown.env import CountdownReActEnv
from agent_envs.envs.countdown.native.spec import SPEC


class CountdownToolsEnv(CountdownReActEnv):
    """No single-turn mode: without tools there is nothing native about it (use ``Countdown-ReAct-v0``)."""

    env_spec = SPEC

    def __init__(self, **kwargs: Any):
        if kwargs.get("single_turn"):
            raise ValueError("Countdown-Tools-v0 has no single_turn mode; use Countdown-ReAct-v0 with single_turn=True")
        super().__init__(**kwargs)


Env = CountdownToolsEnv
