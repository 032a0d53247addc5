"""Promises of docs/reliability.md that no single module owns: how an environment tells the model's
outcome from the machine's fault."""
from __future__ import annotations

import json

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401
from agent_envs.core.types import INVALID_OUTPUT

BASH = "Action: " + json.dumps({"name": "bash", "arguments": {"command": "echo hi"}})


def _env_whose_screen_raises(exc: Exception) -> gym.Env:
    """A real MATH env whose command screening raises ``exc``: stands for any code path that a
    model's text reaches and that has a bug no test has found yet."""
    env = gym.make("MATH-ReAct-v0", dataset="builtin", sandbox="none", max_turns=4)

    def screen(tool, command, runner):
        raise exc

    env.unwrapped._screen = screen
    return env


def test_an_unforeseen_exception_on_the_text_ends_the_episode_as_invalid_output():
    """docs/reliability.md#model-text: the backstop, for what the totality tests have not found."""
    env = _env_whose_screen_raises(OverflowError("int too large to convert to float"))
    try:
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step(BASH)
        record = info["episode"]
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert record["termination_reason"] == INVALID_OUTPUT == record["score_method"]
        assert record["react_error"] == "OverflowError: int too large to convert to float"
        assert record["score"] == 0.0 and record["turns"] == 1
        with pytest.raises(RuntimeError, match="episode already ended"):
            env.step(BASH)
    finally:
        env.close()


@pytest.mark.parametrize("exc", [OSError("no space left on device"), MemoryError()])
def test_a_machine_fault_leaves_step(exc):
    """... while a machine fault is raised, for the runner to record as ``env_error``."""
    env = _env_whose_screen_raises(exc)
    try:
        env.reset(seed=0)
        with pytest.raises(type(exc)):
            env.step(BASH)
    finally:
        env.close()
