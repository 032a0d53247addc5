"""Conformance suite: every environment of the registry, tested the day it is registered.

Each check runs real episodes (real sandbox, real tools, the environment's own scorer) and asserts
what every environment owes its users: Gymnasium's checker passes; random and adversarial
completions end in warnings or a termination reason, never an exception; the lockstep and async
runners give identical records; the same seeds give the same records; reset and close leave no
process or temp folder behind.
"""

from __future__ import annotations

import copy
import json
import pickle
import random
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.core.spec import ToolSpec
from agent_envs.envs import registry
from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.protocol.native import call_text
from agent_envs.rollout.records import EpisodeRecord, dumps_line
from agent_envs.rollout.runner import run_episodes, strip_timings
from model_text import completion, known_breakers
from sandbox_backends import live_descendants as _descendants, temp_dirs
from test_process_rewards import HashScorer

ENV_IDS = registry.ENV_IDS
TERMINATIONS = {"final_answer", "max_turns", "max_response_tokens_exceeded", "context_length_exceeded"}
#: nesting depths of an action's extra argument: decodable (400, and 500 where copying a record
#: recursed past the limit), beyond the decoder (1,000) and far beyond it (100,000)
DEEP_NESTING = (400, 500, 1_000, 100_000)
#: small budgets keep the suite cheap; every code path is still reached
ENV_KWARGS = {"max_turns": 4, "sandbox": "bwrap"}


def _make(env_id: str, **kwargs) -> gym.Env:
    return gym.make(env_id, dataset="builtin", **{**ENV_KWARGS, **kwargs})


def _adversarial(env_id: str) -> list[str]:
    """Completions aimed at the parser, the tools and the scorer (in both call formats)."""
    tools = registry.spec(env_id).tools
    acts = [_act(tool, "echo hi; exit 3", env_id) for tool in tools]
    calls = [call_text(tool.name, {tool.argument or "input": "echo hi"}) for tool in tools]
    return [
        *[f"<think>{c}</think>" for c in calls],
        *[f"<think>{c}" for c in calls],
        "".join(calls * 12),
        "<tool_call>",
        "<tool_call>{}</tool_call>",
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": "{"}</tool_call>',
        "<tool_call>" + "[" * 5000 + "</tool_call>",
        "",
        " ",
        "\0",
        "Final answer:",
        "Final answer: \\boxed{",
        "Answer: 1/0",
        "<think>",
        "<think>Final answer: 1</think>",
        'Action: {"name": "bash"',
        "Action: {}",
        "Action: []",
        'Action: {"name": "nope", "arguments": {}}',
        'Action: {"name": null}',
        *[a.replace("echo hi; exit 3", "") for a in acts],
        *acts,
        *[a.replace("echo hi; exit 3", "\\u0000") for a in acts],
        "Action: " + "{" * 5000,
        "x" * 20000,
        "Final answer: __import__('os').system('echo pwned')",
        "Final answer: \\boxed{" + "(" * 400 + "1" + ")" * 400 + "}",
        "Final answer: 9" + "9" * 400,
        "\ud800 Final answer: \udfff",
        *[
            a.replace('"echo hi; exit 3"}', '"echo deep", "x": ' + "[" * d + "]" * d + "}")
            for a in acts
            for d in DEEP_NESTING
        ],
    ]


def _act(tool: ToolSpec, text: str, env_id: str) -> str:
    """A call of ``tool`` carrying ``text`` as its input, in the environment's own format (ReAct or
    native; a tool of the whole arguments object gets it under a key of its own)."""
    arguments = {tool.argument or "input": text}
    if registry.spec(env_id).rules["es"].parser.native_tool_calls:
        return call_text(tool.name, arguments)
    return f"Action: {json.dumps({'name': tool.name, 'arguments': arguments})}"


def _random(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = "Action:{}[]\"':,\\\n finalswerbxodpyth0123456789+-*/()<>"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120))) for _ in range(n)]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env_passes(env_id):
    env = _make(env_id)
    try:
        check_env(env.unwrapped)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_and_adversarial_completions_never_raise(env_id):
    completions = _adversarial(env_id) + _random(hash(env_id) % 1000, 24)
    env = _make(env_id)
    ended = 0
    try:
        env.reset(seed=0)
        for i, text in enumerate(completions):
            _, reward, terminated, truncated, info = env.step(text)
            assert isinstance(reward, float)
            if terminated or truncated:
                ended += 1
                record = info["record"]
                assert record["termination_reason"] in TERMINATIONS and 0.0 <= record["score"] <= 1.0
                # a record crosses processes and files: copy, pickle and JSON must all take it
                assert pickle.loads(pickle.dumps(copy.deepcopy(record))) == json.loads(json.dumps(record))
                env.reset(seed=i)
    finally:
        env.close()
    assert ended > 0


#: the totality test's sandbox: real bwrap, persistent, with a short command timeout so that a
#: generated command that blocks costs seconds, not the default 20
TOTALITY_SANDBOX = {"backend": "bwrap", "mode": "persistent", "limits": {"timeout_s": 3.0}}


class _Totality:
    """One env kept across hypothesis examples (reset only when an episode ends), so that the
    sandboxes it starts are shared by many examples."""

    def __init__(self, env_id: str) -> None:
        self.env = _make(env_id, sandbox=TOTALITY_SANDBOX)
        self.tools = registry.spec(env_id).rules["es"].tool_args
        self.running = False
        self.seed = 0

    def step(self, text: str) -> None:
        if not self.running:
            self.seed += 1
            self.env.reset(seed=self.seed)
            self.running = True
        _, reward, terminated, truncated, info = self.env.step(text)
        assert isinstance(reward, float) and 0.0 <= reward <= 1.0
        if terminated or truncated:
            self.running = False
            record = info["record"]
            assert record["termination_reason"] in TERMINATIONS, record["react_error"]
            EpisodeRecord.model_validate(record)  # what the runner keeps, and writes:
            json.loads(dumps_line(record))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_step_is_total_over_the_action_grammar(env_id):
    """docs/reliability.md#model-text: whatever the model writes (every tool and unknown ones, any
    arguments, nesting past the recursion limit, numbers at every extreme) ``step`` returns, and an
    ending episode has a protocol termination reason (never INVALID_OUTPUT, the backstop for what
    this test has not found) and a record the runner can validate and write."""
    state = _Totality(env_id)

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(completion(state.tools), min_size=1, max_size=3))
    def check(texts):
        for text in texts:
            state.step(text)

    try:
        for text in known_breakers(state.tools):  # after a tool call, so a final answer can follow
            state.step(text)
            state.step("Final answer: 1")
        check()
    finally:
        state.env.close()


def _records(env_id: str, mode: str, base_seed: int = 11, **kwargs) -> list[dict]:
    tasks = _make(env_id).unwrapped.tasks[:2]
    policy = ScriptedPolicy(registry.spec(env_id).baseline)
    recs = run_episodes(
        env_id,
        tasks,
        policy,
        samples=2,
        mode=mode,
        base_seed=base_seed,
        env_kwargs=ENV_KWARGS,
        concurrency=3,
        progress=False,
        **kwargs,
    )
    return [strip_timings(r) for r in recs]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_lockstep_and_async_agree_and_seeds_repeat(env_id):
    lockstep = _records(env_id, "lockstep")
    assert len(lockstep) == 4 and all(r["error"] is None for r in lockstep)
    assert all(r["used_bash"] and r["termination_reason"] == "final_answer" for r in lockstep)
    assert _records(env_id, "async") == lockstep
    assert _records(env_id, "async") == lockstep
    assert [r["seed"] for r in _records(env_id, "lockstep", base_seed=12)] != [r["seed"] for r in lockstep]


class _Recorder(HashScorer):
    def __init__(self) -> None:
        super().__init__()
        self.contexts: list = []

    def score_batch(self, contexts):
        self.contexts += contexts
        return super().score_batch(contexts)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_step_scorer_sees_every_step_and_changes_nothing_else(env_id):
    """docs/protocol.md#process-rewards: one score per step, the spec's images exist, lockstep ==
    async, and the episodes are those of an unscored run."""
    recorder = _Recorder()
    scored = _records(env_id, "lockstep", step_scorer=recorder)
    assert _records(env_id, "async", step_scorer=HashScorer()) == scored
    added = ("step_scores", "step_score_errors", "process_score", "process_aggregation")
    assert [{k: v for k, v in r.items() if k not in added} for r in scored] == _records(env_id, "lockstep")
    assert sum(len(r["react_steps"]) for r in scored) == len(recorder.contexts) > 0
    assert all(len(r["step_scores"]) == len(r["react_steps"]) and None not in r["step_scores"] for r in scored)
    assert all(Path(image).is_file() for c in recorder.contexts for image in c.images)
    assert {c.env_id for c in recorder.contexts} == {env_id}


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_reset_and_close_leave_nothing_behind(env_id):
    before_procs, before_dirs = _descendants(), temp_dirs()
    env = _make(env_id)
    spec = registry.spec(env_id)
    env.reset(seed=0)
    for tool in spec.tools:  # start every tool, then reset mid-episode
        env.step(_act(tool, "sleep 30 &", env_id))
    env.reset(seed=1)
    for tool in spec.tools:
        env.step(_act(tool, "echo x > /tmp/f", env_id))
    env.close()
    assert _descendants() - before_procs == set()
    assert temp_dirs() - before_dirs == set()
