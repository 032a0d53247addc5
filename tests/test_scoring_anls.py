"""ANLS and the ES-runner DocVQA score (docs/protocol.md#docvqa-scoring, #reward-cases, #other-cases, #derived-cases)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent_envs.envs.docvqa.scoring import (
    anls,
    anls_accuracy,
    docvqa_prediction,
    docvqa_score,
    levenshtein,
    normalize,
    normalize_official,
)

ANSWERS = ["Invoice 123", "invoice no. 123"]


def test_normalize_is_ascii_only():
    assert normalize("  Café  ") == "caf"
    assert normalize("1,000") == "1 000"
    assert normalize("Invoice #123!!") == "invoice 123"
    assert normalize("---") == ""
    assert normalize_official("  Invoice   #123 ") == "invoice #123"


@pytest.mark.parametrize(
    ("a", "b", "d"), [("", "", 0), ("abc", "", 3), ("kitten", "sitting", 3), ("flaw", "lawn", 2), ("abcd", "abce", 1)]
)
def test_levenshtein(a, b, d):
    assert levenshtein(a, b) == d == levenshtein(b, a)


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("invoice 123", ANSWERS, 1.0),  # #reward-cases (3)
        ("ab", ["ac"], 0.0),  # #reward-cases (5): distance ratio exactly 0.5 -> 0
        ("abcd", ["abce"], 0.75),  # #reward-cases (6)
        ("1,000", ["1000"], 0.8),  # #derived-cases: the comma becomes a space
        ("$1,000", ["1 000"], 1.0),  # #derived-cases
        ("Invoice #123", ["invoice 123"], 1.0),  # #other-cases
        ("ABCD", ["zzzz", "ABCE"], 0.75),  # best of several answers
        ("", ["x"], 0.0),  # empty prediction
        ("!!!", ["x"], 0.0),  # empty after normalisation
        ("x", [], 0.0),  # no answers
        ("x", ["", "..."], 0.0),  # only empty answers
    ],
)
def test_anls_protocol(prediction, answers, expected):
    assert anls(prediction, answers) == pytest.approx(expected)


def test_anls_accuracy_is_strict():
    assert anls_accuracy(0.75) == 1.0
    assert anls_accuracy(0.5) == 0.0
    assert anls_accuracy(0.0) == 0.0


def test_official_variant_keeps_punctuation_and_ignores_space_padding():
    assert anls("Invoice #123", ["invoice 123"], variant="official") == pytest.approx(1 - 1 / 12)
    assert anls("  INVOICE   123 ", ["invoice 123"], variant="official") == 1.0
    # The challenge script divides by raw lengths, where this pair scores 1 - 3/41 = 0.927.
    assert 1 - levenshtein("x", "abc") / len("x" + " " * 40) == pytest.approx(0.927, abs=1e-3)
    assert anls("x" + " " * 40, ["abc"], variant="official") == 0.0
    assert anls("x" + " " * 40, ["abc"], variant="protocol") == 0.0


def test_unknown_anls_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown ANLS variant"):
        anls("a", ["a"], variant="raw")  # type: ignore[arg-type]


def test_docvqa_prediction_fallbacks():
    assert docvqa_prediction("<think>Final answer: no</think>Final answer: invoice 123") == "invoice 123"
    assert docvqa_prediction("Final answer: \\boxed{42}") == "42"
    assert docvqa_prediction("reading...\n  the total is 42  \n\n") == "the total is 42"
    assert docvqa_prediction("<think>all hidden</think>") == ""


def test_docvqa_score_with_tool_use():
    # docs/protocol.md#reward-cases (3) and the stage-1 smoke of #other-cases
    got = docvqa_score("Final answer: invoice 123", ANSWERS, termination_reason="final_answer", used_bash=True)
    assert (got.score, got.extras["anls"], got.extras["acc"], got.method) == (1.0, 1.0, 1.0, "anls")
    assert got.label == "docvqa_paper_react_cli_anls"
    assert (got.prediction, got.answer_status, got.status) == ("invoice 123", "answered", "ok")
    smoke = docvqa_score("Final answer: smoke", ["smoke"], termination_reason="final_answer", used_bash=True)
    assert (smoke.prediction, smoke.extras["anls"]) == ("smoke", 1.0)
    partial = docvqa_score("Final answer: abcd", ["abce"], termination_reason="final_answer", used_bash=True)
    assert (partial.score, partial.extras["anls"], partial.extras["acc"]) == (0.75, 0.75, 1.0)  # #reward-cases (6)


def test_docvqa_score_without_tool_use_is_zero_on_an_empty_prediction():
    # docs/protocol.md#reward-cases (4) adapted: no bash -> score, acc and anls all 0
    got = docvqa_score("Final answer: invoice 123", ANSWERS, termination_reason="final_answer", used_bash=False)
    assert (got.score, got.extras["acc"], got.extras["anls"]) == (0.0, 0.0, 0.0)
    assert (got.method, got.label) == ("no_tool_use", "docvqa_paper_react_cli_no_tool_use")
    assert (got.prediction, got.answer_status) == ("", "missing_final_answer")


@pytest.mark.parametrize("reason", ["context_length_exceeded", "request_error"])
def test_zeroing_terminations_keep_the_raw_anls(reason):
    got = docvqa_score("Final answer: invoice 123", ANSWERS, termination_reason=reason, used_bash=True)
    assert (got.score, got.method, got.label) == (0.0, reason, "docvqa_paper_react_cli_" + reason)
    assert (got.extras["anls"], got.extras["acc"]) == (1.0, 1.0)


def test_budget_terminations_score_the_last_line():
    # docs/protocol.md#docvqa-scoring: no final answer, yet non-zero ANLS from the last non-empty line
    got = docvqa_score(
        "still reading\ninvoice 123\n", ANSWERS, termination_reason="max_response_tokens_exceeded", used_bash=True
    )
    assert (got.score, got.answer_status, got.prediction) == (1.0, "missing_final_answer", "invoice 123")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.lists(st.text(max_size=60), max_size=4), st.sampled_from(["protocol", "official"]))
def test_anls_is_a_bounded_score_and_never_raises(prediction, answers, variant):
    value = anls(prediction, answers, variant)
    assert 0.0 <= value <= 1.0
    assert value == 0.0 or value > 0.5  # below the threshold nothing is credited


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_identical_prediction_scores_one(text):
    assume(normalize(text))
    assert anls(text, [text]) == 1.0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30), st.text(max_size=30), st.text(max_size=30))
def test_levenshtein_is_a_metric(a, b, c):
    assert (levenshtein(a, b) == 0) == (a == b)
    assert levenshtein(a, b) <= max(len(a), len(b))
    assert levenshtein(a, c) <= levenshtein(a, b) + levenshtein(b, c)


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=300),
    st.lists(st.text(max_size=40), min_size=1, max_size=3),
    st.booleans(),
    st.sampled_from([None, "final_answer", "max_turns", "context_length_exceeded", "request_error"]),
)
def test_docvqa_score_never_raises(completion, answers, used_bash, reason):
    got = docvqa_score(completion, answers, termination_reason=reason, used_bash=used_bash)
    assert got.label.startswith("docvqa_paper_react_cli_")
    assert 0.0 <= got.score <= got.extras["anls"] <= 1.0
