"""The one registry of environments: env ids, ``gym.register`` calls and CLI choices derive from it.

Each entry names the module holding the environment's :class:`EnvSpec` (as ``SPEC``); it is
imported on first use, so importing the package stays light and free of cycles.  Adding an
environment is one line here plus its folder under ``agent_envs/envs/``.
"""
from __future__ import annotations

import importlib

from agent_envs.core.spec import EnvSpec

ENVIRONMENTS: dict[str, str] = {
    "MATH-ReAct-v0": "agent_envs.envs.math_react.spec",
    "DocVQA-CLI-v0": "agent_envs.envs.docvqa.spec",
    "Countdown-ReAct-v0": "agent_envs.envs.countdown.spec",
    "DocVQA-VL-v0": "agent_envs.envs.docvqa.vl.spec",
    # native tool calls (docs/protocol.md#native-tool-calls): registered variants, the ReAct ids stay the default
    "MATH-Tools-v0": "agent_envs.envs.math_react.native.spec",
    "Countdown-Tools-v0": "agent_envs.envs.countdown.native.spec",
}

ENV_IDS: tuple[str, ...] = tuple(ENVIRONMENTS)


def spec(env_id: str) -> EnvSpec:
    """The spec of a registered environment; an unknown id is an error naming the known ones."""
    module = ENVIRONMENTS.get(env_id)
    if module is None:
        raise KeyError(f"unknown environment {env_id!r}; registered: {', '.join(ENV_IDS)}")
    return importlib.import_module(module).SPEC


def register_all() -> None:
    """``gym.register`` every environment (idempotent)."""
    import gymnasium as gym

    for env_id, module in ENVIRONMENTS.items():
        if env_id not in gym.registry:
            # max_episode_steps is left unset: the environment enforces its own turn limit and
            # reports it as termination_reason="max_turns" (TimeLimit would hide the reason).
            gym.register(id=env_id, entry_point=f"{module.rsplit('.', 1)[0]}.env:Env",
                         nondeterministic=False)
