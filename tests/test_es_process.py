"""ES with process rewards on the CPU: the in-process trainer over a real torch model whose weights
pick the policy's tool call, real MATH-ReAct episodes in bwrap, a deterministic step scorer; the
fitness the update uses is the combiner's, outcome and process part both checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_envs.envs.math_react.task import MathTask
from agent_envs.es.history import ESConfig, load_history, update_records
from agent_envs.es.normalize import normalize_rewards
from agent_envs.es.population import ESTrainer, evaluate_member
from agent_envs.rewards.combine import FitnessCombiner
from agent_envs.scale.toy import TorchToyEngine
from test_process_rewards import HashScorer

TASKS = [MathTask(id=f"toy{i}", question=f"Pick the number of box {i}.", answer=str(i % 4)) for i in range(6)]
CONFIG = ESConfig(
    env_id="MATH-ReAct-v0",
    model="toy",
    generations=2,
    population=4,
    case_batch_size=3,
    train_samples=2,
    sigma_start=0.8,
    sigma_end=0.8,
    sigma_schedule="constant",
    alpha=0.8,
)
ROLLOUT = {"env_kwargs": {"max_turns": 3, "sandbox": "bwrap"}, "concurrency": 6}
WEIGHT = 0.4


def _train(path: Path, combiner: FitnessCombiner | None) -> tuple[list[dict], str]:
    engine = TorchToyEngine()
    engine.es_init(exact_revert=True)
    extra = {} if combiner is None else {"combiner": combiner, "step_scorer": HashScorer()}

    def evaluate(batch, seed, generation, member):
        return evaluate_member(
            engine.policy,
            CONFIG.env_id,
            batch,
            seed,
            generation=generation,
            member=member,
            samples=CONFIG.train_samples,
            **ROLLOUT,
            **extra,
        )

    ESTrainer(CONFIG, engine, TASKS, evaluate, str(path), log=lambda _: None).run()
    return update_records(load_history(path)), engine.checksum()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("es-process")
    return (
        _train(folder / "outcome.json", None),
        _train(folder / "combined.json", FitnessCombiner(process_weight=WEIGHT, aggregation="product")),
    )


def test_update_uses_the_combined_fitness(runs):
    (outcome, outcome_weights), (combined, combined_weights) = runs
    first_o, first_c = outcome[0], combined[0]
    assert first_o["seeds"] == first_c["seeds"]  # same perturbations, so the same episodes in generation 0
    for reward_o, reward_c, sample in zip(first_o["rewards"], first_c["rewards"], first_c["samples"]):
        rows = sample["result"]
        assert len(rows) == len(TASKS[:3]) * CONFIG.train_samples
        outcome_mean = sum(max(0.0, r["score"]) for r in rows) / len(rows)
        process_mean = sum(r["process_score"] for r in rows) / len(rows)
        assert outcome_mean == pytest.approx(reward_o, abs=1e-12)
        assert reward_c == pytest.approx((1 - WEIGHT) * reward_o + WEIGHT * process_mean, abs=1e-12)
        assert all(
            r["fitness"] == pytest.approx((1 - WEIGHT) * max(0.0, r["score"]) + WEIGHT * r["process_score"])
            for r in rows
        )
        assert all(0 < r["process_score"] < 1 for r in rows)
    assert first_c["rewards"] != first_o["rewards"]
    # the trainer's update weights are the normalised combined fitness, and they moved the weights elsewhere
    assert all(r["weights"] == normalize_rewards(r["rewards"], CONFIG.reward_normalization) for r in combined)
    assert normalize_rewards(first_c["rewards"]) != normalize_rewards(first_o["rewards"])
    assert combined_weights != outcome_weights


def test_combiner_rules():
    row = {"score": 1.0, "step_scores": [0.5, None, 0.8], "process_score": 0.65}
    assert FitnessCombiner(process_weight=0.5).fitness(row) == pytest.approx(0.5 + 0.5 * 0.65)
    assert FitnessCombiner(process_weight=0.5, aggregation="product").fitness(row) == pytest.approx(0.5 + 0.2)
    assert FitnessCombiner(process_weight=1.0, aggregation="min").fitness(row) == 0.5
    assert FitnessCombiner(process_weight=0.0).fitness(row) == 1.0
    assert FitnessCombiner(process_weight=0.9).fitness({"score": -1.0}) == 0.0  # no steps scored: the outcome
    with pytest.raises(ValueError):
        FitnessCombiner(process_weight=1.5)
    with pytest.raises(ValueError):
        FitnessCombiner(aggregation="median")


def test_es_train_flags_build_the_scorer_and_combiner(monkeypatch):
    from agent_envs.esrun.run import build_process_reward
    from agent_envs.esrun.settings import parse_settings

    base = ["--model", "m", "--train", "t", "--history", "h"]
    scorer, combiner = build_process_reward(
        parse_settings(
            [
                *base,
                "--step-scorer",
                "judge",
                "--judge-url",
                "http://127.0.0.1:9/v1",
                "--judge-model",
                "judge",
                "--process-weight",
                "0.3",
                "--process-aggregation",
                "min",
            ]
        )
    )
    assert type(scorer).__name__ == "LLMJudgeScorer" and scorer.policy.endpoints == ["http://127.0.0.1:9/v1"]
    assert combiner == FitnessCombiner(process_weight=0.3, aggregation="min")
    assert build_process_reward(parse_settings(base)) == (None, None)
    for bad, message in (
        (["--process-weight", "0.3"], "needs --step-scorer"),
        (["--step-scorer", "judge"], "needs --judge-url"),
        (["--step-scorer", "vlm-prm"], "needs --prm-base"),
    ):
        with pytest.raises(SystemExit, match=message):
            build_process_reward(parse_settings([*base, *bad]))
