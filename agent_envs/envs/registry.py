"""The one registry of environments: env ids, ``gym.register`` calls and CLI choices derive from it.

The environments layer fills it: each entry is an environment's :class:`EnvSpec`, imported here
from its folder.  Layers above (rollout callers, the report, the CLI, the engine pools) look a
spec up here by id and pass it down; nothing below the environments names one.  Adding an
environment is one line here plus its folder under ``agent_envs/envs/``.
"""

from __future__ import annotations

from typing import Any, Iterable

from agent_envs.core.spec import EnvSpec
from agent_envs.envs.countdown.native.spec import SPEC as COUNTDOWN_TOOLS
from agent_envs.envs.countdown.spec import SPEC as COUNTDOWN
from agent_envs.envs.docvqa.spec import SPEC as DOCVQA
from agent_envs.envs.docvqa.vl.spec import SPEC as DOCVQA_VL
from agent_envs.envs.math_react.native.spec import SPEC as MATH_TOOLS
from agent_envs.envs.math_react.spec import SPEC as MATH

#: the ReAct environments, then their native-tool-call variants (docs/protocol.md#native-tool-calls)
SPECS: dict[str, EnvSpec] = {s.id: s for s in (MATH, DOCVQA, COUNTDOWN, DOCVQA_VL, MATH_TOOLS, COUNTDOWN_TOOLS)}

ENV_IDS: tuple[str, ...] = tuple(SPECS)


def spec(env_id: str) -> EnvSpec:
    """The spec of a registered environment; an unknown id is an error naming the known ones."""
    found = SPECS.get(env_id)
    if found is None:
        raise KeyError(f"unknown environment {env_id!r}; registered: {', '.join(ENV_IDS)}")
    return found


def spec_of(rows: Iterable[dict[str, Any]]) -> EnvSpec | None:
    """The spec of the environment that wrote ``rows`` (their first ``env_id``), None when they name
    no registered one (records of another version, or rows built by hand)."""
    env_id = next((r.get("env_id") for r in rows if r.get("env_id")), None)
    return SPECS.get(str(env_id)) if env_id is not None else None


def register_all() -> None:
    """``gym.register`` every environment (idempotent)."""
    import gymnasium as gym

    from gymnasium.envs.registration import WrapperSpec

    # applied outside a TimeLimit, so that its cut ends the episode with a record (envs/time_limit.py)
    record_truncation = WrapperSpec("RecordTruncation", "agent_envs.envs.time_limit:RecordTruncation", {})
    for env_id, env_spec in SPECS.items():
        if env_id not in gym.registry:
            # max_episode_steps is left unset: the environment enforces its own turn limit and
            # reports it as termination_reason="max_turns"; a TimeLimit of the caller's ends it
            # with "time_limit"
            gym.register(
                id=env_id,
                entry_point=env_spec.entry_point,
                nondeterministic=False,
                additional_wrappers=(record_truncation,),
            )
