"""Conformance suite: every environment of the registry, tested the day it is registered, by the
public checks of :mod:`agent_envs.testing` (which users run on their own environments).

Each check runs real episodes (real sandbox, real tools, the environment's own scorer) and asserts
what every environment owes its users: Gymnasium's checker passes; random and adversarial
completions end in warnings or a termination reason, never an exception; the lockstep and async
runners give identical records; the same seeds give the same records; reset and close leave no
process or temp folder behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_envs import testing
from agent_envs.envs import registry
from agent_envs.rollout.records import EpisodeRecord, dumps_line
from model_text import completion, known_breakers
from test_process_rewards import HashScorer

ENV_IDS = registry.ENV_IDS
TERMINATIONS = testing.TERMINATIONS
_make = testing.make


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env_passes(env_id):
    testing.check_gym_api(env_id)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_and_adversarial_completions_never_raise(env_id):
    testing.check_total(env_id, random_seed=sum(map(ord, env_id)) % 1000)


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
    return testing.scripted_records(env_id, mode, base_seed, **kwargs)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_lockstep_and_async_agree_and_seeds_repeat(env_id):
    testing.check_runners_agree(env_id)


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
    testing.check_leaves_nothing(env_id)
