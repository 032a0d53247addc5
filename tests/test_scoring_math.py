"""Math extraction and scoring (docs/protocol.md#math-scoring, #reward-cases), including math-verify off the
main thread and the published DAPO-100 / AIME-2026-30 answers."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_envs.envs.math_react.scoring import (
    exact_fallback_match,
    explicit_answer,
    math_prediction,
    math_score,
    math_verify_match,
)

from conftest import MATH_DIR as DATA  # noqa: E402

TRANSCRIPT = (
    'Action:\n{"name": "bash", "arguments": {"command": "python -c \'print(6*7)\'"}}\n'
    "Observation from bash:\n42\n\nFinal answer: \\boxed{42}"
)


def in_thread(fn, *args, **kwargs):
    """Run ``fn`` on a fresh non-main thread and return its result (re-raising its error)."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


# --- extraction --------------------------------------------------------------------------------


def test_explicit_answer():
    assert explicit_answer("Final answer: \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"  # docs/protocol.md#reward-cases (2)
    assert explicit_answer("so it is \\boxed{7}. Done") == "7"  # boxed anywhere
    assert explicit_answer("<think>Final answer: 1</think>Answer: 2") == "2"
    assert explicit_answer("the result is 12") is None


def test_math_prediction_fallbacks():
    assert math_prediction("Final answer: \\boxed{5}") == "5"
    assert math_prediction("we get 1,234 and then -3/4 maybe") == "-3/4"
    assert math_prediction("no digits here\nlast line  ") == "last line"
    assert math_prediction("<think>42</think>  ") == ""


# --- exact fallback ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gold", "pred", "match"),
    [
        ("1/2", "\\frac{1}{2}", False),  # the cases of docs/protocol.md#math-scoring
        ("31", "$31$", False),
        ("5", "-5", False),
        ("1000", "1e3", True),
        ("3", "3.0", True),
        ("0.5", "1/2", True),
        ("42", "\\boxed{42}", True),
        ("1000", "1,000", True),
        ("7", "{{ 7 }}", True),
        ("7", "7.", True),
        ("ABC", "abc", True),
        ("1/0", "1/0", True),  # equal strings, even though not numeric
        ("1", "1/0", False),  # division by zero is not a number
        ("1e999999999", "2e999999999", False),
        ("nan", "NaN", True),
        ("5", "\\Boxed{5}", True),  # forms the numeric comparison normalises a second time
        ("5", "\\BOXED{5}", True),
        ("5", "{5}.", True),
        ("5", ".{5}", True),
        ("5", "{5},", True),
        ("0.5", "\\boxed {1/2}", True),
        ("abc", "\\Boxed{abc}", False),  # the second pass only feeds the numeric comparison
        ("4", "\\Boxed{5}", False),
    ],
)
def test_exact_fallback_match(gold, pred, match):
    assert exact_fallback_match(gold, pred) is match


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        ("Final answer: \\boxed {42}", "42"),
        ("Final answer: \\Boxed{5}", "5"),
        ("Final answer: \\BOXED{5}", "5"),
        ("Final answer: {5}.", "5"),
        ("Final answer: .{5}", "5"),
        ("Final answer: {5},", "5"),
        ("Final answer: \\boxed {1/2}", "0.5"),
    ],
)
def test_numeric_comparison_normalises_twice_like_the_reference(completion, gold):
    """A space or capital in ``\\boxed`` survives one normalisation pass; the second one removes it."""
    got = math_score(completion, gold, scorer="exact", termination_reason="final_answer", used_bash=True)
    assert (got.score, got.method) == (1.0, "exact_fallback")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
def test_exact_fallback_is_total_reflexive_and_symmetric(a, b):
    assert exact_fallback_match(a, a)
    assert exact_fallback_match(a, b) == exact_fallback_match(b, a)


# --- ES-runner final score ---------------------------------------------------------------------


@pytest.mark.parametrize("scorer", ["exact", "auto", "math_verify"])
def test_final_answer_after_bash_scores_one(scorer):
    # docs/protocol.md#reward-cases (1)
    got = math_score(TRANSCRIPT, "42", scorer=scorer, termination_reason="final_answer", used_bash=True)
    assert (got.score, got.answer_status, got.prediction) == (1.0, "answered", "42")
    expected_method = "exact_fallback" if scorer == "exact" else "math_verify"
    assert (got.method, got.label) == (expected_method, "math_paper_react_cli_" + expected_method)
    assert got.status == ("exact" if scorer == "exact" else "ok")


def test_no_bash_is_zero_even_when_correct():
    got = math_score("Final answer: \\boxed{42}", "42", termination_reason="final_answer", used_bash=False)
    assert (got.score, got.method, got.label) == (0.0, "no_bash_tool_use", "math_paper_react_cli_no_bash_tool_use")
    assert got.answer_status == "answered"


@pytest.mark.parametrize("reason", ["context_length_exceeded", "request_error"])
@pytest.mark.parametrize("used_bash", [True, False])
def test_zeroing_terminations_win_over_everything(reason, used_bash):
    got = math_score("Final answer: \\boxed{42}", "42", termination_reason=reason, used_bash=used_bash)
    assert (got.score, got.method, got.status) == (0.0, reason, "skipped")


def test_missing_final_answer_and_max_turns():
    missing = math_score("the answer is 42", "42", termination_reason="max_turns", used_bash=True)
    assert (missing.score, missing.method, missing.answer_status) == (
        0.0,
        "missing_final_answer",
        "missing_final_answer",
    )
    assert missing.prediction == "42"  # stored, never credited
    # a max_turns trajectory whose last completion holds \boxed{} still earns the point
    boxed = math_score("so \\boxed{42}", "42", scorer="exact", termination_reason="max_turns", used_bash=True)
    assert (boxed.score, boxed.method, boxed.answer_status) == (1.0, "exact_fallback", "missing_final_answer")


def test_auto_and_exact_differ_where_math_verify_decides():
    text = "Final answer: \\boxed{1/2}"
    exact = math_score(text, "\\frac{1}{2}", scorer="exact", termination_reason="final_answer", used_bash=True)
    auto = math_score(text, "\\frac{1}{2}", scorer="auto", termination_reason="final_answer", used_bash=True)
    assert (exact.score, exact.method) == (0.0, "exact_fallback")
    assert (auto.score, auto.method) == (1.0, "math_verify")


def test_auto_falls_back_to_exact_when_math_verify_cannot_parse():
    text = "Final answer: \\boxed{!!!}"
    auto = math_score(text, "!!!", scorer="auto", termination_reason="final_answer", used_bash=True)
    assert (auto.score, auto.method, auto.status) == (1.0, "exact_fallback", "unparsed")
    strict = math_score(text, "!!!", scorer="math_verify", termination_reason="final_answer", used_bash=True)
    assert (strict.score, strict.method, strict.status) == (0.0, "math_verify", "unparsed")


def test_unknown_scorer_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown math scorer"):
        math_score("x", "1", scorer="sympy", termination_reason=None, used_bash=True)  # type: ignore[arg-type]


# --- math-verify off the main thread, with a real timeout --------------------------------------


def test_math_verify_works_off_the_main_thread():
    assert in_thread(math_verify_match, "\\frac{1}{2}", "0.5") == (True, "ok")
    assert in_thread(math_verify_match, "3", "4") == (False, "ok")
    assert in_thread(math_verify_match, "abc", "abc") == (None, "unparsed")


def test_a_slow_comparison_is_reported_as_timeout_and_the_worker_recovers():
    # Expanding a 60th power of a 4-term sum takes sympy far longer than a second.
    slow = in_thread(math_verify_match, "$(x+y+z+1)^{60}$", "$(x+y+z+2)^{60}$", timeout_s=1.0)
    assert slow == (None, "timeout")
    assert in_thread(math_verify_match, "12", "12") == (True, "ok")  # a fresh worker answers
    got = math_score(
        "Final answer: $(x+y+z+2)^{60}$",
        "$(x+y+z+1)^{60}$",
        scorer="auto",
        termination_reason="final_answer",
        used_bash=True,
        timeout_s=1.0,
    )
    assert (got.method, got.status, got.score) == ("exact_fallback", "timeout", 0.0)


# --- the published evaluation sets -------------------------------------------------------------


def _load_checked(name: str) -> list[dict]:
    sums = dict(line.split()[::-1] for line in (DATA / "SHA256SUMS").read_text().splitlines() if line.strip())
    raw = (DATA / name).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == sums[name]
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


def test_all_130_gold_answers_score_one_under_both_scorers():
    if not DATA.is_dir():
        pytest.skip(f"shared math data not found at {DATA}")
    rows = _load_checked("dapo_test.jsonl") + _load_checked("aime_2026.jsonl")
    assert len(rows) == 130

    def score_all(scorer: str) -> list[tuple[str, float, str]]:
        out = []
        for row in rows:
            got = math_score(
                f"Final answer: \\boxed{{{row['answer']}}}",
                row["answer"],
                scorer=scorer,
                termination_reason="final_answer",
                used_bash=True,
            )
            out.append((row["id"], got.score, got.method))
        return out

    exact = score_all("exact")
    assert all(score == 1.0 and method == "exact_fallback" for _, score, method in exact), exact
    verified = in_thread(score_all, "auto")  # math-verify from a worker thread
    assert all(score == 1.0 and method == "math_verify" for _, score, method in verified), verified
