"""One table of policy backends: the CLI and the engine pools (and agent-envs es) build every
policy through ``agent_envs.policy.factory``, so a backend is one module and one row."""

from __future__ import annotations

import argparse

import pytest

from pathlib import Path

from agent_envs import cli
from agent_envs.envs.registry import spec
from agent_envs.policy.base import GenerationRequest
from agent_envs.policy.factory import BACKENDS, POLICIES, Backend, PolicySettings, build_policy
from agent_envs.policy.openai import OpenAIPolicy
from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.scale import engines

REPO = Path(__file__).resolve().parent.parent


def _eval_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["eval", *argv])


def test_the_cli_offers_exactly_the_table():
    action = next(
        a for a in cli.build_parser()._subparsers._group_actions[0].choices["eval"]._actions if a.dest == "policy"
    )
    assert tuple(action.choices) == POLICIES == ("cpu", "transformers", "vllm", "openai", "scripted")


def test_requirements_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown policy 'tgi'; expected one of cpu, transformers"):
        build_policy("tgi")
    with pytest.raises(ValueError, match="the vllm policy needs a model"):
        build_policy("vllm")
    with pytest.raises(ValueError, match="the openai policy needs at least one base URL"):
        build_policy("openai", PolicySettings(model="m"))
    with pytest.raises(ValueError, match="the scripted policy needs a script"):
        build_policy("scripted")
    with pytest.raises(cli.UsageError, match="--policy openai needs at least one --base-url"):
        cli.make_policy("openai", _eval_args("--model", "m"), "MATH-ReAct-v0")


def test_the_cli_builds_openai_with_its_request_flags():
    args = _eval_args(
        "--policy",
        "openai",
        "--model",
        "m",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--samples",
        "4",
        "--request-timeout",
        "7",
        "--request-retries",
        "0",
        "--temperature",
        "0.5",
    )
    policy = cli.make_policy("openai", args, "MATH-ReAct-v0")
    try:
        assert isinstance(policy, OpenAIPolicy)
        assert (policy.timeout_s, policy.max_retries, policy.samples_per_row) == (7.0, 0, 4)
        assert policy.sampling.temperature == 0.5
    finally:
        policy.close()


@pytest.mark.parametrize("env_id", ["MATH-ReAct-v0", "Countdown-ReAct-v0"])
def test_the_scripted_baseline_is_built_alike_by_the_cli_and_the_engine_pool(env_id):
    request = GenerationRequest(
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2 + 3? Numbers: 2, 3"}]
    )
    from_cli = cli.make_policy("scripted", _eval_args("--env", env_id), env_id)
    from_pool = engines.scripted_engine(env_id).policy
    assert isinstance(from_cli, ScriptedPolicy) and isinstance(from_pool, ScriptedPolicy)
    assert from_cli.script is from_pool.script is spec(env_id).baseline
    assert from_cli.generate([request])[0].text == from_pool.generate([request])[0].text


def test_every_caller_reaches_the_same_vllm_row(monkeypatch):
    """Swap the table's vllm row: the CLI and the pool's engines both build through it, with the
    mode and rollout budget each asks for."""
    seen: list[PolicySettings] = []

    def record(settings: PolicySettings) -> ScriptedPolicy:
        seen.append(settings)
        return ScriptedPolicy(["Final answer: 1"])

    monkeypatch.setitem(BACKENDS, "vllm", Backend(record, needs_model=True))
    cli.make_policy(
        "vllm", _eval_args("--policy", "vllm", "--model", "m", "--engine-arg", 'dtype="float32"'), "MATH-ReAct-v0"
    )
    engines.VLLMEngine("m", sampling={"temperature": 0.0}, rollout_token_budget=4096, dtype="float32")
    assert [(s.model, s.mode, s.rollout_token_budget) for s in seen] == [("m", "async", None), ("m", "lockstep", 4096)]
    assert seen[0].engine_args == {"dtype": "float32"}
    assert seen[1].engine_args["dtype"] == "float32" and "worker_extension_cls" in seen[1].engine_args
    assert seen[1].sampling.temperature == 0.0


def test_es_train_builds_its_policy_from_the_same_row(monkeypatch):
    from agent_envs.esrun.run import build_policy
    from agent_envs.esrun.settings import parse_settings

    seen: list[PolicySettings] = []

    class Engine(ScriptedPolicy):
        pass

    def record(settings: PolicySettings) -> ScriptedPolicy:
        seen.append(settings)
        return Engine(["Final answer: 1"])

    monkeypatch.setitem(BACKENDS, "vllm", Backend(record, needs_model=True))
    for mode in ("lockstep", "async"):
        args = parse_settings(
            [
                "--model",
                "m",
                "--mode",
                mode,
                "--rollout-token-budget",
                "8192",
                "--train",
                "t.jsonl",
                "--history",
                "h.jsonl",
            ]
        )
        assert isinstance(build_policy(args, {"dtype": "bfloat16"}), Engine)
    assert [(s.model, s.mode, s.rollout_token_budget, s.engine_args) for s in seen] == [
        ("m", "lockstep", 8192, {"dtype": "bfloat16"}),
        ("m", "async", 8192, {"dtype": "bfloat16"}),
    ]
