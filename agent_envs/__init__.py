"""agent-envs: Gymnasium environments for multi-turn LLM tool use.

Importing the package registers ``MATH-ReAct-v0`` and ``DocVQA-CLI-v0`` with Gymnasium.
"""
from __future__ import annotations

import gymnasium as gym

__version__ = "0.1.0"

ENV_IDS = ("MATH-ReAct-v0", "DocVQA-CLI-v0")


def _register() -> None:
    specs = {
        "MATH-ReAct-v0": "agent_envs.envs.math_react:MathReActEnv",
        "DocVQA-CLI-v0": "agent_envs.envs.docvqa:DocVQACLIEnv",
    }
    for env_id, entry_point in specs.items():
        if env_id not in gym.registry:
            # max_episode_steps is left unset: the environment enforces its own turn limit and
            # reports it as termination_reason="max_turns" (TimeLimit would hide the reason).
            gym.register(id=env_id, entry_point=entry_point, nondeterministic=False)


_register()
