"""Gymnasium's ``TimeLimit`` cut, recorded as the ``time_limit`` termination
(docs/protocol.md#budgets-and-termination).

``TimeLimit`` counts steps outside the environment and only sets ``truncated``: the environment never
learns that its episode was cut, so it would write no record and no termination reason.
:func:`agent_envs.envs.registry.register_all` registers :class:`RecordTruncation` as an additional
wrapper of every environment, which ``gym.make`` applies outside ``TimeLimit`` (so
``gym.make(id, max_episode_steps=N)`` needs nothing more); a ``TimeLimit`` applied by hand needs
``RecordTruncation`` around it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

#: the termination reason of an episode cut by a step limit outside the environment
TIME_LIMIT = "time_limit"


class RecordTruncation(gym.Wrapper[Any, Any, Any, Any], gym.utils.RecordConstructorArgs):
    """Ends the environment's episode, with ``time_limit``, when a wrapper below truncated it while
    it was still running: the step then carries the record (``info["record"]``) and the score."""

    def __init__(self, env: gym.Env[Any, Any]):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        if truncated and not terminated and "record" not in info:
            observation, reward, terminated, truncated, ended = self.env.unwrapped.end_episode(  # type: ignore[attr-defined]
                TIME_LIMIT, "time_limit_exceeded"
            )
            info = {**info, **ended}
        return observation, reward, terminated, truncated, info
