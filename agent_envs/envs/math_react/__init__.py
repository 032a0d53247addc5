"""``MATH-ReAct-v0``: its spec, task model, loader, scorer and trace renderer live in this folder."""

from __future__ import annotations

from agent_envs.envs.math_react.env import MathReActEnv

__all__ = ["MathReActEnv"]
