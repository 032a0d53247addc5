"""``MATH-ReAct-v0``: its spec, task model, loader, scorer and trace renderer live in this folder."""

from __future__ import annotations

from agent_envs.core.spec import EnvSpec
from agent_envs.envs.math_react.env import MathReActEnv

__all__ = ["MathReActEnv", "ORDER", "environments"]

#: first in the registry: eval's default environment (agent_envs.envs.registry)
ORDER = 0


def environments() -> tuple[EnvSpec, ...]:
    """MATH-ReAct-v0 and MATH-Tools-v0 (the registry finds this folder by this function)."""
    from agent_envs.envs.math_react.spec import SPEC
    from agent_envs.envs.math_react.native.spec import SPEC as VARIANT

    return (SPEC, VARIANT)
