"""The registry is the one list of environments: gym ids and CLI choices derive from it, and an id
it does not know is an error everywhere instead of silently getting another environment's rules."""
from __future__ import annotations

import gymnasium as gym
import pytest

import agent_envs
from agent_envs.cli import build_parser
from agent_envs.core import registry
from agent_envs.rollout.metrics import summarize
from agent_envs.rollout.tracelog import render, trace_filename

ROW = {"task_id": "t", "sample_index": 0, "score": 1.0, "env_id": "Sudoku-v0"}


def test_env_ids_gym_registrations_and_cli_choices_derive_from_the_registry():
    assert agent_envs.ENV_IDS == registry.ENV_IDS == tuple(registry.ENVIRONMENTS)
    for env_id in registry.ENV_IDS:
        spec = registry.spec(env_id)
        assert spec.id == env_id and gym.spec(env_id).entry_point == spec.entry_point
    choices = next(a.choices for a in build_parser()._subparsers._group_actions[0].choices["eval"]._actions
                   if a.dest == "env")
    assert tuple(choices) == registry.ENV_IDS


def test_unknown_environment_fails_loudly():
    with pytest.raises(KeyError, match="unknown environment 'Sudoku-v0'; registered: MATH-ReAct-v0"):
        registry.spec("Sudoku-v0")
    with pytest.raises(KeyError, match="unknown environment 'Sudoku-v0'"):
        trace_filename(ROW)
    with pytest.raises(KeyError, match="unknown environment 'Sudoku-v0'"):
        render(ROW)
    with pytest.raises(KeyError, match="unknown environment ''"):
        trace_filename({k: v for k, v in ROW.items() if k != "env_id"})


def test_records_of_an_unregistered_id_still_summarise_with_bash_as_the_tool():
    row = {**ROW, "react_steps": [{"action": {"name": "bash", "arguments": {}}, "observation": "x\n[exit_code] 0"}],
           "termination_reason": "final_answer", "turns": 2}
    assert summarize([row], samples=1)["tool_call_rate"] == 1.0
