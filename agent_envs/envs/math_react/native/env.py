"""``MATH-Tools-v0``: the Math environment with native tool calls (docs/protocol.md#native-tool-calls)."""

from __future__ import annotations

from agent_envs.envs.math_react.env import MathReActEnv
from agent_envs.envs.math_react.native.spec import SPEC


class MathToolsEnv(MathReActEnv):
    env_spec = SPEC


Env = MathToolsEnv
