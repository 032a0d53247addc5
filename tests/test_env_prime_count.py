"""PrimeCount-Python-v0's own parts: the gold count, the answer parser and the exact scorer
(the conformance suite and tests/test_plugins.py run it end to end)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent_envs.envs.prime_count.scoring import parse_count, prime_count_score
from agent_envs.envs.prime_count.task import PrimeCountTask, generate, prime_count


def test_the_gold_count_is_the_prime_counting_function():
    assert [prime_count(0, n) for n in (0, 1, 2, 10, 100, 10_000, 1_000_000)] == [0, 0, 1, 4, 25, 1229, 78498]
    assert prime_count(14, 16) == 0 and prime_count(2, 2) == 1 and prime_count(90, 100) == 1


@pytest.mark.parametrize(
    "answer,count",
    [
        ("78498", 78498),
        ("78,498", 78498),
        ("\\boxed{1_229}", 1229),
        (" \\boxed{ 25 }. ", 25),
        ("1 229", 1229),
        ("12.", 12),
        ("1 2", None),
        ("-3", None),
        ("2.5", None),
        ("about 25", None),
        ("25 or 26", None),
        ("7,84,98", None),
        ("9" * 10, None),
        ("", None),
        (None, None),
    ],
)
def test_the_parser_reads_one_integer_and_nothing_else(answer, count):
    assert parse_count(answer) == count


def test_only_the_exact_count_of_a_finished_episode_scores():
    task = PrimeCountTask(id="t", low=10, high=100)  # 21 primes
    right = prime_count_score("Done.\nFinal answer: \\boxed{21}", task, termination_reason="final_answer")
    wrong = prime_count_score("Final answer: 22", task, termination_reason="final_answer")
    cut = prime_count_score("Final answer: 21", task, termination_reason="max_turns")
    assert (right.score, right.extras) == (1.0, {"score_reason": "", "count": 21})
    assert (wrong.score, wrong.extras["score_reason"]) == (0.0, "counted 22, not 21")
    assert (cut.score, cut.status, cut.extras["score_reason"]) == (0.0, "skipped", "episode ended with max_turns")


def test_tasks_are_validated_and_seeded():
    with pytest.raises(ValidationError, match="below low"):
        PrimeCountTask(id="t", low=10, high=9)
    with pytest.raises(ValidationError):
        PrimeCountTask(id="t", low=0, high=10**9)
    assert generate(5, seed=3) == generate(5, seed=3) != generate(5, seed=4)
