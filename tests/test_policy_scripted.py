"""ScriptedPolicy (tests, baselines) and SimulatedPolicy (benchmarks)."""

from __future__ import annotations

import asyncio

from agent_envs.policy.base import Completion, GenerationRequest
from agent_envs.policy.scripted import ScriptedPolicy, SimulatedPolicy


def req(key: str = "", seed: int = 0, max_tokens: int | None = None) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": "q"}], key=key, seed=seed, max_tokens=max_tokens, stop=["Observation:"]
    )


def test_shared_script_plays_in_turn_order_per_episode() -> None:
    policy = ScriptedPolicy(["first", "second"])
    out = policy.generate([req("a"), req("b"), req("a")])
    assert [c.text for c in out] == ["first", "first", "second"]
    exhausted = policy.generate([req("a")])[0]
    assert exhausted.error == "request_error" and "ScriptExhausted" in exhausted.error_message


def test_stop_string_and_everything_after_it_is_dropped() -> None:
    policy = ScriptedPolicy({"e": ['Action: bash\nAction Input: {"command": "ls"}\nObservation: made up']})
    out = policy.generate([req("e")])[0]
    assert out.text == 'Action: bash\nAction Input: {"command": "ls"}\n' and out.finish_reason == "stop"


def test_unknown_episode_and_callable_scripts() -> None:
    assert ScriptedPolicy({"e": ["x"]}).generate([req("other")])[0].error == "request_error"
    policy = ScriptedPolicy(lambda r: Completion(text=f"seed={r.seed}", token_ids=[1, 2]))
    assert asyncio.run(policy.agenerate(req(seed=7))).text == "seed=7"


def test_simulated_lengths_are_seeded_long_tailed_and_capped() -> None:
    policy = SimulatedPolicy(["answer"] * 1000, per_token_s=0.0, median_tokens=100, sigma=1.0)
    lengths = [policy.length(req(seed=s)) for s in range(400)]
    assert lengths == [policy.length(req(seed=s)) for s in range(400)]
    assert max(lengths) > 5 * sorted(lengths)[200]  # a long tail above the median
    assert max(policy.length(req(seed=s, max_tokens=50)) for s in range(400)) == 50
    out = policy.generate([req(key=str(s), seed=s) for s in range(3)])
    assert [c.completion_tokens for c in out] == lengths[:3] and {c.text for c in out} == {"answer"}
    assert asyncio.run(policy.agenerate(req(key="z", seed=1))).completion_tokens == lengths[1]
