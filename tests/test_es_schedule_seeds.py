"""ES bookkeeping without a model: sigma schedule, seed streams, case batches, reward maths."""

from __future__ import annotations

import math
import threading
import time

import pytest

from agent_envs.es.normalize import normalize_rewards
from agent_envs.es.population import evaluate_member, map_endpoint_serial
from agent_envs.rollout.metrics import es_summary
from agent_envs.es.schedule import interval_evaluation_due, sigma_at_step
from test_es_history import make_model
from test_es_update_rule import Recorded, config, trainer

from agent_envs.es.seeds import (
    SeedStream,
    case_batch,
    check_run_shape,
    check_seed_sequence,
    population_seeds,
    trajectory_seed,
)


def test_published_cosine_values() -> None:
    values = [sigma_at_step(1e-3, 5e-4, s, 25, "cosine") for s in range(25)]
    assert values[0] == 0.001 and values[24] == 0.0005
    assert values[1] == pytest.approx(0.000997861215, abs=1e-12)
    assert values[8] == pytest.approx(0.000875, abs=1e-15)
    assert values[12] == pytest.approx(0.00075, abs=1e-15)
    # DocVQA's released run: a 100-step schedule truncated at 40.
    assert sigma_at_step(1e-3, 5e-4, 39, 100, "cosine") == pytest.approx(0.000831767, abs=1e-9)


def test_cosine_endpoints_exact_and_monotone() -> None:
    values = [sigma_at_step(1.0, 0.25, s, 5, "cosine") for s in range(5)]
    assert values[0] == 1.0 and values[-1] == 0.25
    assert all(b <= a for a, b in zip(values, values[1:]))


def test_linear_warmup_and_clamped_warmup() -> None:
    linear = [sigma_at_step(2.0, 1.0, s, 6, "linear", warmup=2) for s in range(6)]
    assert linear[:3] == [2.0, 2.0, 2.0] and linear[-1] == 1.0
    assert [sigma_at_step(2.0, 0.5, s, 4, "linear", warmup=99) for s in range(4)] == [2, 2, 2, 0.5]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_endpoint_raises(bad: float) -> None:
    with pytest.raises(ValueError):
        sigma_at_step(bad, 0.5, 0, 4, "cosine")
    with pytest.raises(ValueError):
        sigma_at_step(0.5, bad, 0, 4, "cosine")


def test_schedule_names_and_negative_warmup() -> None:
    assert sigma_at_step(1.0, 0.0, 1, 3, "Cosine") == pytest.approx(0.5)
    assert sigma_at_step(1.0, 0.0, 2, 3, "constant") == 1.0
    with pytest.raises(ValueError, match="warmup"):
        sigma_at_step(1.0, 0.0, 1, 3, "linear", warmup=-1)
    with pytest.raises(ValueError, match="unknown sigma schedule"):
        sigma_at_step(1.0, 0.0, 1, 3, "exp")


def test_published_population_seeds() -> None:
    seeds = population_seeds(20260627, 16, 40)
    assert seeds[0][9] == 1571296235
    assert seeds[36][:2] == [989551694, 1342805843]
    assert seeds[37][0] == 36487471
    assert (seeds[39][0], seeds[39][9]) == (482601426, 1887577418)


def test_resume_fast_forward_matches_stream() -> None:
    assert SeedStream(20260627, 16, start_generation=37).next_generation()[0] == 36487471


def test_peek_shows_the_next_generation_without_advancing_the_stream() -> None:
    stream = SeedStream(20260627, 16, start_generation=36)
    ahead = stream.peek()
    assert ahead == stream.peek() and ahead[:2] == [989551694, 1342805843]
    assert stream.next_generation() == ahead and stream.next_generation()[0] == 36487471


def test_seed_sequence_validation() -> None:
    stored = population_seeds(7, 2, 3)
    assert check_seed_sequence(stored, 7, 2) == 3
    with pytest.raises(ValueError, match="original --seed and --population"):
        check_seed_sequence(stored, 8, 2)
    with pytest.raises(ValueError, match="original --seed and --population"):
        check_seed_sequence(stored, 7, 3)


def test_trajectory_seed_formula() -> None:
    assert trajectory_seed(20260627, 0, 0) == 20260627
    assert trajectory_seed(20260627, 7, 2) == 22260640


def test_case_batch_wraps() -> None:
    tasks = list(range(50))
    assert case_batch(tasks, 37, 16) == list(range(42, 50)) + list(range(8))
    math_tasks = list(range(400))
    seen = [t for g in range(25) for t in case_batch(math_tasks, g, 16)]
    assert sorted(seen) == math_tasks  # every problem exactly once


def test_run_shape() -> None:
    check_run_shape(1, 1, 1)
    check_run_shape(0, 1, 1, eval_only=True)
    for args in [(0, 1, 1), (1, 0, 1), (1, 1, 0)]:
        with pytest.raises(ValueError):
            check_run_shape(*args)


def test_member_reward_counts_failures_as_zero() -> None:
    def runner(env_id: str, tasks: list, policy: object, samples: int, base_seed: int) -> list[dict]:
        return [{"task_id": t["id"], "score": s} for t, s in zip(tasks, [1.0, 0.0, -1.0])]

    result = evaluate_member(
        None, "x", [{"id": "a"}, {"id": "b"}, {"id": "c"}], 9, generation=0, member=0, rollout=runner
    )
    assert result.reward == pytest.approx(1 / 3)


def test_summary_accounting() -> None:
    rows = [
        {"task_id": "a", "sample_index": 0, "score": 1.0, "termination_reason": "final_answer"},
        {"task_id": "a", "sample_index": 1, "score": -1.0, "termination_reason": "request_error"},
        {"task_id": "b", "sample_index": 0, "score": 0.0, "termination_reason": "max_turns"},
        {"task_id": "b", "sample_index": 1, "score": 0.0, "termination_reason": "final_answer"},
    ]
    summary = es_summary(rows, samples=2)
    assert (summary["valid_count"], summary["error_count"]) == (4, 1)
    assert summary["mean_score"] == 0.25 and summary["max@2"] == 0.5


def test_zscore_weight_norm_is_sqrt_n() -> None:
    rewards = [((i * 37) % 16) / 16 for i in range(16)]
    weights = normalize_rewards(rewards, "zscore")
    assert math.sqrt(sum(w * w for w in weights)) == pytest.approx(4.0, abs=1e-5)
    assert sum(weights) == pytest.approx(0.0, abs=1e-5)


def test_normalisation_edge_cases() -> None:
    assert all(abs(w) < 1e-6 for w in normalize_rewards([0.5] * 4))
    assert normalize_rewards([0.3], "zscore", ddof=1) == [0.0]
    assert normalize_rewards([3.0, 1.0, 2.0], "centered_rank") == [0.5, -0.5, 0.0]
    assert normalize_rewards([0.7], "centered_rank") == [0.0]
    assert normalize_rewards([0.25, 0.5], "identity") == [0.25, 0.5]
    with pytest.raises(ValueError, match="finite"):
        normalize_rewards([0.1, math.nan])
    with pytest.raises(ValueError, match="unknown reward normalization"):
        normalize_rewards([0.1], "softmax")


def test_endpoint_serial_mapping() -> None:
    active = {"a": 0, "b": 0}
    overlap: list[str] = []
    lock = threading.Lock()
    seen: dict[str, list[int]] = {"a": [], "b": []}

    def job(endpoint: str, item: int) -> int:
        with lock:
            active[endpoint] += 1
            if active[endpoint] > 1:
                overlap.append(endpoint)
            seen[endpoint].append(item)
        time.sleep(0.002)  # widen the window in which an overlap would be visible
        with lock:
            active[endpoint] -= 1
        return item * 10

    assert map_endpoint_serial(list(range(9)), ["a", "b"], job) == [i * 10 for i in range(9)]
    assert seen == {"a": [0, 2, 4, 6, 8], "b": [1, 3, 5, 7]} and not overlap


def test_zscore_with_ddof_above_one_divides_by_n_minus_one() -> None:
    """N1: the reference's torch.std(unbiased=bool(ddof)): ddof 2 and 3 act as ddof 1."""
    rewards = [0.0, 0.25, 1.0, 0.5, 0.75]
    assert (
        normalize_rewards(rewards, ddof=2) == normalize_rewards(rewards, ddof=3) == normalize_rewards(rewards, ddof=1)
    )
    assert normalize_rewards(rewards, ddof=2) != normalize_rewards(rewards, ddof=0)
    assert normalize_rewards([0.1, 0.9], ddof=2) == [0.0, 0.0]  # N <= ddof: no update, as there


@pytest.mark.parametrize("name", ["rank", "z-score", "z_score", "centeredrank"])
def test_normalisation_names_the_reference_refuses(name: str) -> None:
    """N2: only zscore, centered_rank and none / identity / off."""
    with pytest.raises(ValueError, match="unknown reward normalization"):
        normalize_rewards([0.1, 0.2], name)


@pytest.mark.parametrize("name", ["co_sine", "co-sine", "lin_ear"])
def test_schedule_names_the_reference_refuses(name: str) -> None:
    """N2: ``co_sine`` is not ``cosine`` there."""
    with pytest.raises(ValueError, match="unknown sigma schedule"):
        sigma_at_step(1e-3, 5e-4, 0, 25, name)
    assert sigma_at_step(1e-3, 5e-4, 24, 25, "Cosine") == 5e-4


def test_interval_evaluations_follow_the_interval_and_none_at_zero() -> None:
    """R2: interval 0 runs no interval evaluation, not even after the last generation."""
    due = [g for g in range(25) if interval_evaluation_due(g, 25, 10)]
    assert due == [9, 19, 24]
    assert [g for g in range(3) if interval_evaluation_due(g, 3, 1)] == [0, 1, 2]
    assert not any(interval_evaluation_due(g, 25, 0) for g in range(25))


@pytest.mark.parametrize("interval,evaluated", [(0, []), (2, [1, 2])])
def test_the_trainer_evaluates_on_the_interval_at_the_records_top_level(tmp_path, interval, evaluated) -> None:
    """R1 and R2 end to end on the toy backend: ``<name>_eval`` at the generation record's top level
    (no ``eval`` key), after every interval-th update and the last, and none at interval 0."""
    cfg = config(3, eval_interval=interval)
    run = trainer(
        tmp_path / "h.json", cfg, Recorded(make_model(), exact_revert=True), eval_hook=lambda g: {"dapo_eval": {"g": g}}
    )
    records = [r for r in run.run() if "rewards" in r]
    assert [r["generation"] for r in records if "dapo_eval" in r] == evaluated
    assert all("eval" not in r for r in records)
