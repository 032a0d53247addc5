"""Metrics: the ES summary, unbiased @k, README DocVQA numbers, diagnostics, paired bootstrap
(docs/protocol.md#metrics, #diagnostics-cases, #accounting-cases)."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from agent_envs.envs.registry import spec
from agent_envs.es.trained_model import provenance
from agent_envs.rollout.metrics import (
    compare_means,
    diagnostics,
    es_summary,
    group_metrics,
    paired_bootstrap,
    summarize,
)
from agent_envs.scoring.metrics import max_at_k, mean_valid, pass_at_k

DOCVQA = spec("DocVQA-CLI-v0")


def _row(task: str, sample: int, score: float, **extra) -> dict:
    return {"task_id": task, "sample_index": sample, "key": f"{task}:sample{sample:02d}", "score": score, **extra}


def _bash(obs: str) -> dict:
    return {"turn": 1, "assistant": "a", "action": {"name": "bash", "arguments": {"command": "ls"}}, "observation": obs}


# ------------------------------------------------------------ docs/protocol.md#accounting-cases
def test_mean_valid_counts_negative_as_zero_in_denominator():
    assert mean_valid([1.0, 0.0, -1.0]) == pytest.approx(1 / 3)


def test_es_summary_accounting_5_10_2():
    rows = [
        _row("a", 0, 1.0, termination_reason="final_answer"),
        _row("a", 1, -1.0, termination_reason="request_error"),
        _row("b", 0, 0.0, termination_reason="max_turns"),
        _row("b", 1, 0.0, termination_reason="final_answer"),
    ]
    s = es_summary(rows, samples=2)
    assert s["valid_count"] == 4
    assert s["count"] == 4
    assert s["error_count"] == 1
    assert s["mean_score"] == pytest.approx(0.25)
    assert s["average"] == pytest.approx(0.25)
    assert s["max@2"] == pytest.approx(0.5)
    assert s["pass@2"] == pytest.approx(0.5) and s["pass@2_count"] == 1
    assert s["items"] == 2 and s["expected_count"] == 4
    assert s["by_sample"] == {"0": {"count": 2, "mean_score": 0.5}, "1": {"count": 2, "mean_score": 0.0}}
    assert s["termination_reasons"] == {"final_answer": 2, "request_error": 1, "max_turns": 1}


def test_es_pass_needs_a_perfect_score_and_by_sample_lists_the_indexes_present():
    rows = [_row("a", 0, 0.99), _row("b", 0, 1.0)]
    s = es_summary(rows, samples=2)
    assert s["pass@2_count"] == 1  # 0.99 is not a pass, even for DocVQA ANLS
    assert s["by_sample"] == {"0": {"count": 2, "mean_score": pytest.approx(0.995)}}
    # M4: samples 4-7 of a run are keyed "4".."7" (the reference's summarize_rows), in numeric order
    rows = [_row(t, i, float(i == 5)) for i in (10, 7, 6, 5, 4) for t in "ab"]
    assert es_summary(rows, samples=4)["by_sample"] == {
        "4": {"count": 2, "mean_score": 0.0},
        "5": {"count": 2, "mean_score": 1.0},
        "6": {"count": 2, "mean_score": 0.0},
        "7": {"count": 2, "mean_score": 0.0},
        "10": {"count": 2, "mean_score": 0.0},
    }


# ----------------------------------------------------------------------------- unbiased @k
def _brute_pass(outcomes: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def _brute_max(scores: list[float], k: int) -> float:
    subsets = list(itertools.combinations(scores, k))
    return sum(max(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 4, 7, 10])
def test_pass_at_k_and_max_at_k_match_brute_force(n):
    rng = random.Random(n)
    for _ in range(20):
        scores = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(n)]
        outcomes = [s >= 1.0 for s in scores]
        for k in range(1, n + 1):
            assert pass_at_k(n, sum(outcomes), k) == pytest.approx(_brute_pass(outcomes, k), abs=1e-12)
            assert max_at_k(scores, k) == pytest.approx(_brute_max(scores, k), abs=1e-12)


def test_pass_at_k_rejects_impossible_arguments():
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(4, 5, 1)


def test_summarize_at_k_uses_unbiased_estimator():
    rows = [_row("a", i, s) for i, s in enumerate([1.0, 0.0, 0.0, 0.0])] + [_row("b", i, 0.0) for i in range(4)]
    out = summarize(rows, samples=4)
    assert out["at_k"]["pass@1"] == pytest.approx((0.25 + 0) / 2)
    assert out["at_k"]["pass@2"] == pytest.approx((1 - math.comb(3, 2) / math.comb(4, 2)) / 2)
    assert out["at_k"]["pass@4"] == pytest.approx(0.5)
    assert out["at_k"]["mean@4"] == pytest.approx(1 / 8)
    assert out["es"]["pass@4"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------- DocVQA README
def test_anls_metrics_distinguish_acc_and_exact_pass():
    rows = [
        _row("q1", 0, 0.75, anls=0.75, acc=1.0),
        _row("q1", 1, 0.25, anls=0.25, acc=0.0),
        _row("q2", 0, 1.0, anls=1.0, acc=1.0),
        _row("q2", 1, 0.5, anls=0.5, acc=0.0),
        _row("q3", 0, 0.0, anls=0.0, acc=0.0),
        _row("q3", 1, 0.5, anls=0.5, acc=0.0),
    ]
    summary = summarize(rows, samples=2, spec=DOCVQA)
    d = summary["docvqa"]
    assert summary["at_k"]["acc_pass@2"] == pytest.approx(2 / 3)
    assert d["anls_mean2"] == pytest.approx(3.0 / 6)
    assert d["anls_pass2"] == pytest.approx((0.75 + 1.0 + 0.5) / 3)
    assert d["acc_mean2"] == pytest.approx(2 / 6)  # 0.5 is not > 0.5
    assert d["acc_pass2"] == pytest.approx(2 / 3)
    assert d["exact_pass@2"] == pytest.approx(1 / 3)
    # the block is the environment's: it comes with its spec, and only for records carrying ANLS
    plain = summarize(rows, samples=2)
    assert "docvqa" not in plain and "acc_pass@2" not in plain["at_k"]
    assert group_metrics(rows, 1, spec=DOCVQA)["groups"][0]["anls_mean1"] == pytest.approx(1.75 / 3)
    unscored = [{k: v for k, v in r.items() if k not in ("anls", "acc")} for r in rows]
    assert "docvqa" not in summarize(unscored, samples=2, spec=DOCVQA)


def test_group_metrics_split_a_16_sample_run_into_four_groups():
    rows = [_row("a", i, 1.0 if i in (5, 6) else 0.0) for i in range(16)]
    rows += [_row("b", i, 1.0 if i == 6 else 0.0) for i in range(16)]
    g = group_metrics(rows, 4)
    assert [e["sample_indices"] for e in g["groups"]] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert [e["mean_score"] for e in g["groups"]] == [0.0, 3 / 8, 0.0, 0.0]
    assert g["groups"][1]["pass@4"] == 1.0
    assert g["best_group"] == 1
    with pytest.raises(ValueError, match="does not divide"):
        group_metrics(rows, 5)


def _doc(task: str, sample: int, score: float) -> dict:
    return _row(task, sample, score, anls=score, acc=1.0 if score > 0.5 else 0.0)


def test_groups_of_four_report_anls_and_exact_match_accuracy_and_pick_the_best_by_name():
    """summarize --group 4: ANLS Mean4/Pass4 and the cards' exact-match Accuracy Mean4/Pass4 per
    group (acc = ANLS > 0.5 stays apart), the best group by any of them."""
    scores = {"q1": [1.0, 0.8, 0.0, 0.0, 0.9, 0.9, 0.9, 0.9], "q2": [0.0, 0.0, 0.0, 0.0, 0.6, 0.6, 0.6, 1.0]}
    rows = [_doc(t, i, s) for t, ss in scores.items() for i, s in enumerate(ss)]
    g = group_metrics(rows, 4, spec=DOCVQA, best_by="anls_mean4")
    first, second = g["groups"]
    assert first["anls_mean4"] == pytest.approx(1.8 / 8) and second["anls_mean4"] == pytest.approx(6.4 / 8)
    assert first["anls_pass4"] == pytest.approx(0.5) and second["anls_pass4"] == pytest.approx(0.95)
    assert first["exact_mean4"] == pytest.approx(1 / 8) and first["exact_pass4"] == pytest.approx(1 / 2)
    assert second["exact_mean4"] == pytest.approx(1 / 8) and second["exact_pass4"] == pytest.approx(1 / 2)
    assert first["acc_mean4"] == pytest.approx(2 / 8) and second["acc_mean4"] == pytest.approx(1.0)
    assert (g["best_by"], g["best_group"]) == ("anls_mean4", 1)
    assert group_metrics(rows, 4, spec=DOCVQA, best_by="exact_pass4")["best_group"] == 0  # a tie: the first
    with pytest.raises(ValueError, match="cannot choose the best group by 'acc@4'.*anls_mean4"):
        group_metrics(rows, 4, spec=DOCVQA, best_by="acc@4")


# ----------------------------------------------------------- docs/protocol.md#diagnostics-cases
def test_diagnostics_5_6_1():
    rows = [
        _row("a", 0, 0.75, anls=0.75, acc=1.0, error=None, react_steps=[_bash("text")], latency_s=1.0),
        _row("b", 0, 0.25, anls=0.25, acc=0.0, error=None, react_steps=[_bash("more")], latency_s=3.0),
    ]
    d = diagnostics(rows)
    assert (d["records"], d["valid_records"], d["request_errors"]) == (2, 2, 0)
    assert (d["score_metric"], d["mean_score"]) == ("anls", pytest.approx(0.5))
    assert d["mean_accuracy"] == pytest.approx(0.5)
    assert d["tool_call_rate"] == 1.0 and d["tool_success_rate"] == 1.0
    assert d["mean_turns"] == 2.0
    assert d["mean_latency_s"] == 2.0


def test_diagnostics_5_6_2_format_retry_and_timeout():
    steps = [
        {"turn": 1, "assistant": "no action", "observation": "Format error"},
        _bash("Bash timed out after 20.0s."),
    ]
    rows = [_row("a", 0, 0.0, anls=0.0, acc=0.0, error=None, react_steps=steps, react_error="max_react_turns_exceeded")]
    d = diagnostics(rows)
    assert d["tool_call_rate"] == 1.0
    assert d["tool_success_rate"] == 0.0
    assert d["format_retries"] == 1 and d["format_retry_rows"] == 1
    assert d["bash_timeouts"] == 1 and d["bash_timeout_rows"] == 1
    assert d["mean_turns"] == 2.0
    assert d["react_errors"] == {"max_react_turns_exceeded": 1}


def test_diagnostics_invalid_rows_are_request_errors():
    rows = [_row("a", 0, 0.0, anls=0.0, error="RuntimeError: boom"), _row("b", 0, 1.0, anls=True)]
    d = diagnostics(rows)
    assert d["valid_records"] == 0 and d["request_errors"] == 2
    assert d["mean_score"] is None


def _anls_rows(values: dict[str, tuple[float, ...]]) -> list[dict]:
    return [_row(t, i, v, anls=v, error=None) for t, vs in values.items() for i, v in enumerate(vs)]


@pytest.mark.parametrize("samples", [200, 10_000])
def test_paired_bootstrap_5_6_3(samples):
    before = _anls_rows({"a": (0.25, 0.75), "b": (0.0, 0.0)})
    after = _anls_rows({"a": (0.75, 0.75), "b": (0.5, 0.5)})
    out = paired_bootstrap(before, after, samples=samples)
    assert out["paired_tasks"] == 2
    assert out["score_metric"] == "anls"
    assert compare_means(out) == (pytest.approx(0.25), pytest.approx(0.625), pytest.approx(0.375))
    assert out["bootstrap_95_ci"] == [0.25, 0.5]
    assert out["bootstrap_samples"] == samples and out["bootstrap_seed"] == 42


@pytest.mark.parametrize("env_id", ["MATH-ReAct-v0", "Countdown-ReAct-v0"])
def test_a_summary_and_a_compare_name_the_environments_metric_not_anls(env_id):
    env = spec(env_id)
    rows = [_row("a", 0, 1.0, env_id=env_id, error=None), _row("b", 0, 0.0, env_id=env_id, error=None)]
    d = summarize(rows, 1, spec=env)["diagnostics"]
    assert "mean_anls" not in d and (d["score_metric"], d["mean_score"]) == (env.score_metric, 0.5)
    out = paired_bootstrap(rows, rows, samples=10, spec=env)
    assert out["score_metric"] == env.score_metric != "anls"
    assert not [key for key in out if "anls" in key] and compare_means(out) == (0.5, 0.5, 0.0)


def test_a_compare_result_written_with_mean_anls_still_reads():
    old = provenance()["held_out_compare"]  # stored before the means were named after their metric
    assert "mean_score_delta" not in old
    assert compare_means(old) == (old["mean_anls_before"], old["mean_anls_after"], old["mean_anls_delta"])


def test_paired_bootstrap_follows_random_42_draw_order():
    before = _anls_rows({f"t{i}": (0.0,) for i in range(5)})
    after = _anls_rows({f"t{i}": (i / 4,) for i in range(5)})
    diffs = [i / 4 for i in range(5)]
    rng = random.Random(42)
    est = sorted(sum(diffs[rng.randrange(5)] for _ in range(5)) / 5 for _ in range(10_000))
    assert paired_bootstrap(before, after)["bootstrap_95_ci"] == [est[249], est[9749]]


def test_paired_bootstrap_5_6_4_task_sets_differ():
    before = _anls_rows({"a": (0.5,), "b": (0.5,)})
    after = _anls_rows({"a": (0.5,), "c": (0.5,)})
    with pytest.raises(ValueError, match="task sets differ"):
        paired_bootstrap(before, after)


def test_paired_bootstrap_sample_sets_must_match():
    before = _anls_rows({"a": (0.5, 0.5)})
    after = _anls_rows({"a": (0.5,)})
    with pytest.raises(ValueError, match="sample sets differ"):
        paired_bootstrap(before, after)


def test_summary_reports_the_mean_without_error_episodes_next_to_the_es_mean():
    rows = [
        _row("a", 0, 1.0, termination_reason="final_answer"),
        _row("b", 0, 0.5, termination_reason="max_turns"),
        _row("c", 0, -1.0, termination_reason="request_error"),
        _row("d", 0, 0.0, termination_reason="env_error"),
    ]
    s = summarize(rows, 1)
    assert s["es"]["mean_score"] == pytest.approx(1.5 / 4)  # the reference's mean: errors count as 0
    assert s["non_error"] == {"count": 2, "mean_score": pytest.approx(0.75)}
    assert summarize(rows[2:], 1)["non_error"] == {"count": 0, "mean_score": None}


def test_docvqa_readme_metrics_come_from_the_es_score_and_the_difference_is_declared():
    """M3: on error rows the README metrics (ES runner's summarize_rows) count 0, where the HTTP
    evaluator's summarize_output averages the valid rows' raw fields; diagnostics give the latter."""
    rows = [
        _row("a", 0, 1.0, anls=1.0, acc=1.0, termination_reason="final_answer"),
        _row("a", 1, -1.0, anls=-1.0, acc=0.0, error="boom", termination_reason="request_error"),
        _row("b", 0, 0.0, anls=0.6, acc=1.0, termination_reason="max_turns", react_error="max_react_turns_exceeded"),
        _row("b", 1, -1.0, anls=-1.0, acc=0.0, error="boom", termination_reason="request_error"),
    ]
    s = summarize(rows, samples=2, spec=DOCVQA)
    assert s["docvqa"]["acc_mean2"] == pytest.approx(0.25)  # the ES score: no bash, error rows 0
    assert s["diagnostics"]["mean_accuracy"] == pytest.approx(1.0)  # valid rows' raw acc
    docs = (Path(__file__).resolve().parents[1] / "docs" / "protocol.md").read_text()
    table = docs.split("## Differences and parity switches", 1)[1].split("\n## ", 1)[0]
    assert "summarize_output" in table and "diagnostics" in table


def test_sums_run_in_row_then_sample_order_whatever_the_record_order():
    """M1: (0.1 + 0.2) + 0.3 and (0.3 + 0.2) + 0.1 differ in the last bit; the reference sums in
    (row_index, sample_index) order."""
    scores = {(0, 0): 0.1, (0, 1): 0.2, (1, 0): 0.3}
    rows = [
        _row(f"t{r}", s, v, anls=v, row_index=r, termination_reason="final_answer")
        for (r, s), v in reversed(scores.items())
    ]
    s = summarize(rows, samples=2, spec=DOCVQA)
    assert s["es"]["mean_score"] == (0.1 + 0.2 + 0.3) / 3 != (0.3 + 0.2 + 0.1) / 3
    assert s["docvqa"]["anls_mean2"] == (0.1 + 0.2 + 0.3) / 3
    assert s["es"]["max@2"] == (0.2 + 0.3) / 2
