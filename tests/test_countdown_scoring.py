"""Countdown scorer: exact, ast-based, and never executes the answer."""

from __future__ import annotations

import pytest

from agent_envs.envs.countdown.scoring import MAX_CHARS, clean, evaluate, score
from agent_envs.envs.countdown.task import CountdownTask

TASK = CountdownTask(id="t", nums=(25, 5, 4, 3), target=83)


@pytest.mark.parametrize(
    "answer",
    [
        "(25 - 5) * 4 + 3",
        "\\boxed{(25 - 5) * 4 + 3}",
        "3 + 4 * (25 - 5)",
        "(25-5)×4+3",
        "(25 - 5) * 4 + 3 = 83",
        " \\boxed{ 4*(25-5)+3 } ",
    ],
)
def test_correct_answers_score_one(answer):
    result = score(answer, TASK)
    assert result.reward == 1.0 and result.correct and result.value == "83" and result.reason == ""


def test_division_is_exact_with_fractions():
    task = CountdownTask(id="f", nums=(8, 3, 8, 3), target=24)
    assert score("8 / (3 - 8 / 3)", task).reward == 1.0  # needs 8/3 exactly: floats give 23.99...
    assert score("9 / 3 / 1 + 3", CountdownTask(id="g", nums=(9, 3, 1, 3), target=6)).reward == 1.0
    assert score("7 / 2 * 2", CountdownTask(id="h", nums=(7, 2, 2), target=7)).reward == 1.0
    assert evaluate("7 / 2")[0].denominator == 2  # not floor division


@pytest.mark.parametrize(
    "answer,reason",
    [
        ("(25 - 5) * 4 + 2", "differ"),  # wrong number
        ("(25 - 5) * 4", "differ"),  # missing number
        ("(25 - 5) * 4 + 3 + 3 - 3", "differ"),  # reused number
        ("(25 - 5) * 4 + 3 - 0", "differ"),  # an extra literal
        ("25 + 5 + 4 + 3", "not the target"),  # valid, wrong value
        ("25 * 5 / (4 - 4) + 3", "division by zero"),
        ("3 + 25 / (5 - 5) * 4", "division by zero"),
        ("-25 + 5 * 4 * 3 + 0", "unary"),
        ("+(25 - 5) * 4 + 3", "unary"),
        ("(25 - 5) ** 4 + 3", "Pow"),
        ("(25 - 5) // 4 + 3", "FloorDiv"),
        ("(25 - 5) % 4 + 3", "Mod"),
        ("2 ** 10 ** 10 ** 10", "Pow"),
        ("(25.0 - 5) * 4 + 3", "Constant"),
        ("True + 25 + 5 + 4 + 3", "Constant"),
        ("__import__('pathlib').Path('pwned').touch() or 83", "BoolOp"),
        ("(25).__class__", "Attribute"),
        ("x + 25 + 5 + 4 + 3", "Name"),
        ("[25, 5, 4, 3]", "List"),
        ("lambda: 83", "Lambda"),
        ("25 5 4 3", "not an arithmetic expression"),
        ("", "no answer"),
        ("(" * 200 + "1" + ")" * 200, "longer than"),
        ("(" * 120 + "25" + ")" * 120 + "+5+4+3", "not the target"),  # deep but harmless
        ("__import__('pathlib').Path('pwned').touch()", "Call"),
        ("import os", "not an arithmetic expression"),
    ],
)
def test_invalid_answers_score_zero_with_a_reason(answer, reason, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an executed answer would create ./pwned here
    result = score(answer, TASK)
    assert result.reward == 0.0 and not result.correct and reason in result.reason
    assert list(tmp_path.iterdir()) == []


def test_none_answer_and_reused_given_duplicates():
    assert score(None, TASK).reason == "no answer"
    twice = CountdownTask(id="d", nums=(5, 5, 2), target=20)
    assert score("(5 + 5) * 2", twice).reward == 1.0
    assert score("5 * 2 * 2", twice).reward == 0.0


def test_clean_keeps_expression_text():
    assert clean("\\boxed{1 + 2} ") == "1 + 2" and clean("6 ÷ 3 = 2") == "6 / 3"
    assert MAX_CHARS >= 100
