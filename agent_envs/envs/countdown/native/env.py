"""``Countdown-Tools-v0``: the Countdown environment with native tool calls (docs/protocol.md#native-tool-calls)."""

from __future__ import annotations

from agent_envs.core.spec import EnvSpec
from agent_envs.envs.countdown.env import CountdownOptions, CountdownReActEnv
from agent_envs.envs.countdown.native.spec import SPEC


class CountdownToolsEnv(CountdownReActEnv):
    """No single-turn mode: without tools there is nothing native about it (use ``Countdown-ReAct-v0``)."""

    env_spec = SPEC

    def _spec_for(self, options: CountdownOptions) -> EnvSpec:
        if options.single_turn:
            raise ValueError("Countdown-Tools-v0 has no single_turn mode; use Countdown-ReAct-v0 with single_turn=True")
        return self.env_spec


Env = CountdownToolsEnv
