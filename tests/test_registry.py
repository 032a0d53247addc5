"""The registry is the one list of environments: gym ids and CLI choices derive from it, an id it
does not know is an error instead of silently getting another environment's rules, and each
environment's rules derive from its tool declarations."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agent_envs
from agent_envs.cli import build_parser
from agent_envs.envs import registry
from agent_envs.protocol.decision import with_tools
from agent_envs.rollout.metrics import summarize

ROW = {"task_id": "t", "sample_index": 0, "score": 1.0, "env_id": "Sudoku-v0"}


def test_env_ids_gym_registrations_and_cli_choices_derive_from_the_registry():
    assert agent_envs.ENV_IDS == registry.ENV_IDS == tuple(registry.SPECS)
    for env_id in registry.ENV_IDS:
        spec = registry.spec(env_id)
        assert spec.id == env_id and gym.spec(env_id).entry_point == spec.entry_point
    choices = next(
        a.choices for a in build_parser()._subparsers._group_actions[0].choices["eval"]._actions if a.dest == "env"
    )
    assert tuple(choices) == registry.ENV_IDS


def test_unknown_environment_fails_loudly_and_its_records_name_no_spec():
    with pytest.raises(KeyError, match="unknown environment 'Sudoku-v0'; registered: MATH-ReAct-v0"):
        registry.spec("Sudoku-v0")
    assert registry.spec_of([ROW]) is None and registry.spec_of([{"task_id": "t"}]) is None
    assert registry.spec_of([{"task_id": "t"}, {**ROW, "env_id": "DocVQA-CLI-v0"}]) is registry.spec("DocVQA-CLI-v0")


def test_records_without_a_spec_still_summarise_with_bash_as_the_tool():
    row = {
        **ROW,
        "react_steps": [{"action": {"name": "bash", "arguments": {}}, "observation": "x\n[exit_code] 0"}],
        "termination_reason": "final_answer",
        "turns": 2,
    }
    assert summarize([row], samples=1)["tool_call_rate"] == 1.0


def listed(names: tuple[str, ...]) -> str:
    """``bash`` / ``python and bash`` / ``python, bash and view``: how the text names the tools."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def unknown_action(spec) -> str:
    """The unknown-action text an environment's rules carry, from its declared tools, in their order
    (the built-in environments carried these texts before they were derived)."""
    names = spec.tool_names
    verb = "action is" if len(names) == 1 else "actions are"
    return f"Unknown action '{{name}}'. Available {verb} {listed(names)}."


@pytest.mark.parametrize("env_id", registry.ENV_IDS)
def test_rules_take_tool_names_arguments_and_texts_from_the_tool_declarations(env_id):
    spec = registry.spec(env_id)
    for compat, rules in spec.rules.items():
        derived = with_tools(rules, spec.tools)
        assert derived.unknown_action == unknown_action(spec), compat
        assert derived.tools == tuple((t.name, t.argument) for t in spec.tools)
        assert gym.make(env_id, compat=compat).unwrapped.rules == derived
