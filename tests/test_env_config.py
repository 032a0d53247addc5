"""Bad configuration is refused where it is given (``gym.make``, ``reset``), with a message naming
the field, instead of being coerced or reaching the model as an error observation every turn."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import agent_envs  # noqa: F401  (registers the environments)

TASK = {"id": "t1", "question": "1+1?", "answer": "2", "source": "test"}


@pytest.mark.parametrize("env_id", ["MATH-ReAct-v0", "DocVQA-CLI-v0"])
@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"max_tokens_per_turn": "x"}, "max_tokens_per_turn='x'"),
        ({"max_turns": 1.5}, "max_turns=1.5"),
        ({"max_turns": True}, "max_turns=True"),
        ({"max_turns": 0}, "max_turns=0"),
        ({"max_trajectory_tokens": -5}, "max_trajectory_tokens=-5"),
        ({"max_model_len": "4096"}, "max_model_len='4096'"),
        ({"sandbox": {"limits": {"workspace_mib": 0}}}, "limits.workspace_mib=0"),
        ({"sandbox": {"limits": {"timeout_s": 0}}}, "limits.timeout_s=0"),
        ({"sandbox": {"limits": {"timeout_s": -2.5}}}, "limits.timeout_s=-2.5"),
        ({"sandbox": {"limits": {"timeout_s": "20"}}}, "limits.timeout_s='20'"),
        ({"sandbox": {"limits": {"max_processes": 0}}}, "limits.max_processes=0"),
        ({"sandbox": {"limits": {"memory_gib": 0.0001}}}, "limits.memory_gib=0.0001"),
        ({"sandbox": {"limits": {"max_output_chars": -1}}}, "limits.max_output_chars=-1"),
        ({"sandbox": {"limits": {"cpu_seconds": 2.5}}}, "limits.cpu_seconds=2.5"),
        ({"sandbox": {"mode": "fersh"}}, "unknown sandbox mode 'fersh'"),
    ],
)
def test_make_rejects_bad_config(env_id, kwargs, field):
    with pytest.raises(ValueError, match=_re(field)):
        gym.make(env_id, dataset="builtin", **kwargs)


def test_smallest_accepted_limits_still_run_python():
    """The floors are usable: python3 with numpy and sympy runs with every limit at its minimum."""
    limits = {
        "memory_gib": 0.25,
        "max_processes": 2,
        "max_open_files": 64,
        "workspace_mib": 1,
        "cpu_seconds": 1,
        "max_file_size_mib": 1,
    }
    env = gym.make("MATH-ReAct-v0", dataset=[TASK], sandbox={"limits": limits})
    try:
        env.reset(options={"task": TASK})
        cmd = "python3 -c 'import numpy, sympy; print(7)'"
        messages, *_ = env.step('Action: {"name": "bash", "arguments": {"command": "%s"}}' % cmd)
        assert messages[-1]["content"] == "Observation from bash:\n7\n\n[exit_code] 0"
    finally:
        env.close()


@pytest.mark.parametrize("row_index", [1.7, "3", True, -1])
def test_reset_rejects_a_row_index_that_is_not_a_plain_index(row_index):
    env = gym.make("MATH-ReAct-v0", dataset=[TASK] * 5)
    with pytest.raises(ValueError, match=f"invalid reset options: row_index={_re(repr(row_index))}"):
        env.reset(options={"row_index": row_index})
    env.close()


def test_reset_accepts_numpy_integers():
    env = gym.make("MATH-ReAct-v0", dataset=[TASK] * 5)
    _, info = env.reset(options={"row_index": np.int64(3), "sample_index": np.int32(1)})
    assert (info["row_index"], info["sample_index"]) == (3, 1)
    assert type(info["row_index"]) is int
    env.close()


def test_reset_names_unknown_options():
    env = gym.make("MATH-ReAct-v0", dataset=[TASK])
    with pytest.raises(ValueError, match="invalid reset options: rowindex=0: Extra inputs are not permitted"):
        env.reset(options={"rowindex": 0})
    env.close()


def _re(text: str) -> str:
    import re

    return re.escape(text)


# ----------------------------------------------------------------- each environment's options model
@pytest.mark.parametrize(
    "env_id,kwargs,field",
    [
        ("MATH-ReAct-v0", {"scorer": "fuzzy"}, "invalid MATH-ReAct-v0 argument: scorer='fuzzy'"),
        ("MATH-ReAct-v0", {"blocklist": 1}, "invalid MATH-ReAct-v0 argument: blocklist=1"),
        ("MATH-ReAct-v0", {"score_timeout_s": 0}, "invalid MATH-ReAct-v0 argument: score_timeout_s=0"),
        ("DocVQA-CLI-v0", {"anls_variant": "loose"}, "invalid DocVQA-CLI-v0 argument: anls_variant='loose'"),
        ("DocVQA-VL-v0", {"max_view_pixels": 0}, "invalid DocVQA-VL-v0 argument: max_view_pixels=0"),
        ("DocVQA-VL-v0", {"page_in_prompt": "yes"}, "invalid DocVQA-VL-v0 argument: page_in_prompt='yes'"),
        ("Countdown-ReAct-v0", {"single_turn": 1}, "invalid Countdown-ReAct-v0 argument: single_turn=1"),
        ("Countdown-ReAct-v0", {"anls_variant": "protocol"}, "invalid Countdown-ReAct-v0 argument: anls_variant="),
    ],
)
def test_each_environment_checks_its_own_options_with_one_model(env_id, kwargs, field):
    with pytest.raises(ValueError, match=_re(field)):
        gym.make(env_id, **kwargs)


def test_options_feed_the_config_hash_except_those_excluded_from_it():
    def digest(**kwargs):
        return gym.make("MATH-ReAct-v0", **kwargs).unwrapped.config_hash

    assert digest() == digest(scorer="auto") != digest(scorer="exact")
    assert digest(blocklist=False) != digest()
    assert digest(score_timeout_s=3.0) == digest()  # a time limit is not part of the outcome's identity
    env = gym.make("DocVQA-VL-v0", page_in_prompt=True, max_view_pixels=4096).unwrapped
    assert env.options.model_dump() == {"anls_variant": "protocol", "page_in_prompt": True, "max_view_pixels": 4096}


# ----------------------------------------------------------------- tools' sandbox needs, checked at make
def test_a_tool_needing_a_capability_the_backend_lacks_is_refused_at_make(monkeypatch):
    from dataclasses import replace

    from agent_envs.envs.math_react.env import MathReActEnv
    from agent_envs.envs.math_react.spec import SPEC
    from agent_envs.sandbox.base import PID_NAMESPACE, PROCESSES
    from agent_envs.sandbox.factory import backend_class, backends_with

    assert PROCESSES in backend_class("bwrap").capabilities and PID_NAMESPACE in backend_class("bwrap").capabilities
    assert backend_class("none").capabilities == {PROCESSES} and backend_class("docker").capabilities == frozenset()
    assert backends_with(frozenset({PROCESSES})) == ["bwrap", "none"]
    needy = replace(SPEC, tools=(SPEC.tools[0].with_(needs=frozenset({PID_NAMESPACE})),))
    monkeypatch.setattr(MathReActEnv, "env_spec", needy)
    with pytest.raises(
        ValueError,
        match='MATH-ReAct-v0: the bash tool cannot run on the "none" sandbox backend, '
        'which lacks pid_namespace; use "bwrap"',
    ):
        MathReActEnv(sandbox="none")
    MathReActEnv(sandbox="bwrap").close()
