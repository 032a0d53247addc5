"""Process rewards with real environments and real sandboxes: the environment scores each step
when used directly, the runner batches the same calls across episodes (lockstep: one call per
turn; async: gathered beside generation), and the records, metrics and failures agree."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from typing import Sequence

import gymnasium as gym
import pytest

import agent_envs.envs.registry as registry
from agent_envs.policy.base import Completion, GenerationRequest
from agent_envs.core.steps import BatchStepScorer, StepContext, StepScore, StepScorer
from agent_envs.scoring.process import aggregate, process_fields
from agent_envs.rollout.metrics import summarize
from agent_envs.rollout.runner import run_episodes, strip_timings
from test_runner import TASKS, SeededMathPolicy

registry.register_all()
ENV_KWARGS = {"sandbox": "bwrap", "max_turns": 6}


def text_score(context: StepContext) -> float:
    """A deterministic score in [0, 1) from the step's text (a stand-in for a model's judgement)."""
    digest = hashlib.sha256(f"{context.assistant}|{context.observation}".encode()).hexdigest()
    return int(digest[:8], 16) / 2**32


class HashScorer(BatchStepScorer):
    """Scores every step by :func:`text_score`; remembers the size of every call."""

    aggregation = "product"

    def __init__(self) -> None:
        self.batches: list[int] = []

    def score_batch(self, contexts: Sequence[StepContext]) -> list[StepScore]:
        self.batches.append(len(contexts))
        return [StepScore(text_score(c)) for c in contexts]


def _bash(command: str) -> str:
    return "Action: " + json.dumps({"name": "bash", "arguments": {"command": command}})


def test_environment_scores_each_step_when_used_directly():
    scorer = HashScorer()
    env = gym.make("MATH-ReAct-v0", step_scorer=scorer, tasks=TASKS[:1], **ENV_KWARGS)
    try:
        env.reset(options={"row_index": 0})
        infos = [
            env.step(text)[-1]
            for text in ("let me think", _bash("python3 -c 'print(6*7)'"), "Final answer: \\boxed{42}")
        ]
        contexts = env.unwrapped.step_contexts()
    finally:
        env.close()
    record = infos[-1]["record"]
    assert [c.turn for c in contexts] == [s["turn"] for s in record["react_steps"]] == [1, 2]
    expected = [text_score(c) for c in contexts]
    assert [i["step_score"] for i in infos[:2]] == expected and "step_score" not in infos[2]
    assert record["step_scores"] == expected and record["step_score_errors"] == [None, None]
    assert record["process_score"] == math.prod(expected) and record["process_aggregation"] == "product"
    assert record["score"] == 1.0  # the outcome is untouched
    warn, act = contexts
    assert warn.action is None and "No valid action" in warn.observation
    assert act.action == {"name": "bash", "arguments": {"command": "python3 -c 'print(6*7)'"}}
    assert act.observation.startswith("42") and act.messages[-1]["content"].endswith(act.observation)
    assert act.messages[-2] == {"role": "assistant", "content": act.assistant} and len(act.messages) == 6
    assert "What is 6*7?" in act.question and act.task["answer"] == "42" and act.images == ()


@pytest.fixture(scope="module")
def plain_records():
    return run_episodes(
        "MATH-ReAct-v0",
        TASKS,
        SeededMathPolicy(),
        samples=3,
        mode="lockstep",
        concurrency=16,
        env_kwargs=ENV_KWARGS,
        progress=False,
    )


def _scored(mode: str, scorer: StepScorer, **kw):
    return run_episodes(
        "MATH-ReAct-v0",
        TASKS,
        SeededMathPolicy(),
        samples=3,
        mode=mode,
        concurrency=16,
        progress=False,
        **{"env_kwargs": ENV_KWARGS, "step_scorer": scorer, **kw},
    )


def test_runner_batches_scores_and_matches_the_environment_scoring_itself(plain_records):
    lockstep_scorer, async_scorer, direct_scorer = HashScorer(), HashScorer(), HashScorer()
    lockstep = _scored("lockstep", lockstep_scorer)
    async_ = _scored("async", async_scorer)
    direct = _scored("async", None, env_kwargs={**ENV_KWARGS, "step_scorer": direct_scorer})
    rows = [strip_timings(r) for r in lockstep]
    assert rows == [strip_timings(r) for r in async_] == [strip_timings(r) for r in direct]
    # scoring adds its fields and changes nothing else
    added = {"step_scores", "step_score_errors", "process_score", "process_aggregation"}
    assert [{k: v for k, v in r.items() if k not in added} for r in rows] == [strip_timings(r) for r in plain_records]
    steps_per_turn: dict[int, int] = {}
    for row in rows:
        assert len(row["step_scores"]) == len(row["react_steps"]) and all(0 <= s < 1 for s in row["step_scores"])
        assert row["process_score"] == aggregate(row["step_scores"], "product")
        for step in row["react_steps"]:
            steps_per_turn[step["turn"]] = steps_per_turn.get(step["turn"], 0) + 1
    # lockstep: one scorer call per turn over every episode that made a step in it
    assert lockstep_scorer.batches == [steps_per_turn[t] for t in sorted(steps_per_turn)]
    assert max(lockstep_scorer.batches) > 1
    assert sum(async_scorer.batches) == sum(steps_per_turn.values())
    assert direct_scorer.batches == [1] * sum(steps_per_turn.values())  # the env alone cannot batch


class HeldScorer(StepScorer):
    """Answers no step until every generation of the run has happened: the run can only finish
    with scores if scoring never holds up generation (else the wait times out: recorded errors)."""

    def __init__(self, release: asyncio.Event) -> None:
        self.release = release

    async def score(self, contexts):
        await asyncio.wait_for(self.release.wait(), timeout=120)
        return [StepScore(0.5) for _ in contexts]


class ReleasingPolicy(SeededMathPolicy):
    """Sets ``release`` on the run's last generation (in the event loop, like an async engine)."""

    def __init__(self, total: int, release: asyncio.Event) -> None:
        super().__init__()
        self.total, self.release = total, release

    async def agenerate(self, request: GenerationRequest) -> Completion:
        completion = self.complete(request)
        if self.calls == self.total:
            self.release.set()
        return completion


def test_async_scoring_never_blocks_generation(plain_records):
    release = asyncio.Event()
    policy = ReleasingPolicy(sum(r.turns for r in plain_records), release)
    records = run_episodes(
        "MATH-ReAct-v0",
        TASKS,
        policy,
        samples=3,
        mode="async",
        concurrency=16,
        env_kwargs=ENV_KWARGS,
        progress=False,
        step_scorer=HeldScorer(release),
    )
    assert policy.calls == policy.total
    assert all(r.step_score_errors == [None] * len(r.react_steps) for r in records)
    assert all(r.step_scores == [0.5] * len(r.react_steps) for r in records)


class Misbehaving(BatchStepScorer):
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def score_batch(self, contexts):
        if self.mode == "raise":
            raise RuntimeError("reward model offline")
        if self.mode == "count":
            return [StepScore(0.5)]
        return [StepScore(1.5 if c.action is None else 0.5) for c in contexts]


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_a_failing_scorer_is_a_recorded_error_per_step(mode, plain_records):
    raised = _scored(mode, Misbehaving("raise"))
    assert [strip_timings(r)["score"] for r in raised] == [r.score for r in plain_records]
    for row in raised:
        assert row.step_scores == [None] * len(row.react_steps) and row.process_score is None
        assert set(row.step_score_errors) <= {"RuntimeError: reward model offline"}
    ranged = _scored(mode, Misbehaving("range"))
    for row in ranged:
        for step, score, error in zip(row.react_steps, row.step_scores, row.step_score_errors):
            if step.get("action") is None:
                assert score is None and error == "step score 1.5 is not a number in [0, 1]"
            else:
                assert score == 0.5 and error is None
    summary = summarize(ranged, samples=3)["process"]
    warnings = sum(1 for r in ranged for s in r.react_steps if s.get("action") is None)
    assert warnings and summary["step_score_errors"] == warnings and summary["mean_step_score"] == 0.5
    if mode == "lockstep":  # a batch answered with the wrong number of scores
        short = _scored(mode, Misbehaving("count"))
        errors = {e for r in short for e in r.step_score_errors}
        assert any(e and e.startswith("scorer returned 1 scores for ") for e in errors)


def test_process_fields_and_metrics():
    scores = [StepScore(0.5), StepScore.failed("boom"), StepScore(0.8)]
    assert process_fields(scores, "product") == {
        "step_scores": [0.5, None, 0.8],
        "step_score_errors": [None, "boom", None],
        "process_score": 0.4,
        "process_aggregation": "product",
    }
    assert aggregate([0.5, None, 0.8], "min") == 0.5 and aggregate([None], "mean") is None
    with pytest.raises(ValueError, match="unknown aggregation 'median'"):
        aggregate([0.5], "median")
    rows = [
        {"task_id": "a", "sample_index": 0, "score": 1.0, **process_fields(scores, "mean")},
        {"task_id": "b", "sample_index": 0, "score": 0.0},
    ]
    block = summarize(rows, samples=1)["process"]
    assert block == {
        "episodes": 1,
        "steps": 3,
        "step_score_errors": 1,
        "mean_step_score": 0.65,
        "mean_process_score": 0.65,
        "aggregations": ["mean"],
    }
    assert "process" not in summarize(rows[1:], samples=1)


def test_docvqa_spec_shows_the_page_to_the_scorer(docvqa_dir):
    from agent_envs.envs.docvqa.data import load_docvqa_tasks

    task = load_docvqa_tasks(str(docvqa_dir / "val_v1.0.json"), limit=1)[0]
    scorer = HashScorer()
    env = gym.make("DocVQA-CLI-v0", step_scorer=scorer, tasks=[task], sandbox="bwrap")
    try:
        env.reset(options={"row_index": 0})
        info = env.step(_bash("ls /workspace"))[-1]
        (context,) = env.unwrapped.step_contexts()
    finally:
        env.close()
    assert context.images == (str(task.image),) and "document.png" in context.observation
    assert info["step_score"] == text_score(context)


def test_env_refuses_a_scorer_that_is_not_one():
    with pytest.raises(TypeError, match="step_scorer must be a StepScorer"):
        gym.make("MATH-ReAct-v0", step_scorer=lambda c: 1.0, tasks=TASKS[:1])
    with pytest.raises(ValueError, match="not both"):
        run_episodes(
            "MATH-ReAct-v0",
            TASKS[:1],
            SeededMathPolicy(),
            step_scorer=HashScorer(),
            env_kwargs={"step_scorer": HashScorer()},
            progress=False,
        )
