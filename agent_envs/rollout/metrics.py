"""Metrics over episode records (docs/protocol.md#metrics).

Three families, kept apart because they answer different questions:

* :func:`es_summary`: the ES runner's ``summarize_rows`` (clamped scores, ``max@N``,
  ``pass@N`` = best score >= 1.0).  This is what the trainer and the published tables use.
* :func:`pass_at_k` / :func:`max_at_k` / :func:`summarize`: unbiased Pass@k and max@k for any
  k <= n, ANLS/Acc Mean and Pass for records that carry ``anls``, token/turn/latency statistics.
* :func:`diagnostics` and :func:`paired_bootstrap`: the GRPO report helpers
  (the reference's ``summarize_results`` / ``compare_results``).

README ANLS/Acc numbers are computed from the ES reward ``score`` (= ANLS unless the episode
failed or never used bash), because that is what the published Mean4 (0.50426) and max@4 are;
the diagnostic summary uses the raw ``anls``/``acc`` fields, as upstream does.
"""
from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict
from typing import Any, Callable, Iterable, Sequence

from ..core import registry
from .records import ERROR_TERMINATIONS, EpisodeRecord, as_row

Row = dict[str, Any]
Records = Iterable[EpisodeRecord | Row]


def _rows(records: Records) -> list[Row]:
    return [as_row(r) for r in records]


def _num(value: Any) -> float | None:
    """A finite real number, else None (booleans are not numbers here, as upstream)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def clamped_score(row: Row) -> float:
    """ES reward clamped at 0: a negative (request-error) score counts as 0 and stays in the mean."""
    return max(0.0, _num(row.get("score")) or 0.0)


def mean_valid(scores: Sequence[float]) -> float:
    return sum(max(0.0, s) for s in scores) / len(scores) if scores else 0.0


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def by_task(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Rows grouped by task id, each group in sample order; tasks in first-seen order."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[str(row["task_id"])].append(row)
    return {t: sorted(g, key=lambda r: int(r.get("sample_index", 0))) for t, g in groups.items()}


# --------------------------------------------------------------------------- ES summary
def es_summary(records: Records, samples: int, items: int | None = None, include_rows: bool = False) -> Row:
    """``summarize_rows`` of the ES runner, field for field."""
    rows = _rows(records)
    scores = [clamped_score(r) for r in rows]
    tasks = by_task(rows)
    n_items = items if items is not None else len(tasks)
    best = [max(clamped_score(r) for r in group) for group in tasks.values()]
    pass_count = sum(1 for b in best if b >= 1.0)
    by_sample: dict[str, Row] = {}
    for idx in range(samples):
        s = [clamped_score(r) for r in rows if int(r.get("sample_index", -1)) == idx]
        by_sample[str(idx)] = {"count": len(s), "mean_score": _mean(s) if s else -1.0}
    out: Row = {
        "count": len(rows),
        "valid_count": len(rows),
        "error_count": sum(1 for r in rows if r.get("termination_reason") in ERROR_TERMINATIONS),
        "items": n_items,
        "samples": samples,
        "expected_count": n_items * samples,
        "average": _mean(scores) or 0.0,
        "mean_score": _mean(scores) or 0.0,
        f"max@{samples}": _mean(best) or 0.0,
        f"pass@{samples}": pass_count / len(best) if best else 0.0,
        f"pass@{samples}_count": pass_count,
        "max": max(scores) if scores else 0.0,
        "score_methods": dict(Counter(str(r.get("score_method")) for r in rows)),
        "termination_reasons": dict(Counter(str(r.get("termination_reason")) for r in rows)),
        "answer_statuses": dict(Counter(str(r.get("answer_status")) for r in rows)),
        "by_sample": by_sample,
    }
    if include_rows:
        out["scores"] = rows
    return out


# --------------------------------------------------------------------------- unbiased @k
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator 1 - C(n-c, k)/C(n, k): chance that k of the n samples include a success."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def max_at_k(scores: Sequence[float], k: int) -> float:
    """Expected best score of k samples drawn without replacement from ``scores`` (exact).

    The i-th smallest of n scores (1-based) is the maximum of C(i-1, k-1) of the C(n, k) subsets."""
    n = len(scores)
    if not 0 < k <= n:
        raise ValueError(f"max@k needs 0 < k <= n (n={n}, k={k})")
    ordered = sorted(scores)
    total = math.comb(n, k)
    return sum(s * math.comb(i, k - 1) for i, s in enumerate(ordered) if i >= k - 1) / total


def _at_k(groups: Sequence[Sequence[float]], k: int, success: Callable[[float], bool]) -> Row:
    usable = [g for g in groups if len(g) >= k]
    if not usable:
        return {f"mean@{k}": None, f"pass@{k}": None, f"max@{k}": None}
    return {
        f"mean@{k}": _mean([s for g in usable for s in g]),
        f"pass@{k}": _mean([pass_at_k(len(g), sum(1 for s in g if success(s)), k) for g in usable]),
        f"max@{k}": _mean([max_at_k(g, k) for g in usable]),
    }


def _stats(values: Sequence[float]) -> Row | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "mean": statistics.fmean(ordered),
        "p50": ordered[len(ordered) // 2],
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
        "total": sum(ordered),
    }


#: summary.json key of the ANLS block: a published output layout, kept as is
ANLS_KEY = "docvqa"


def has_anls(rows: Sequence[Row]) -> bool:
    """Whether the records are ANLS-scored (they carry the raw ``anls`` field)."""
    return any("anls" in r for r in rows)


def anls_metrics(rows: Sequence[Row], samples: int) -> Row:
    """The README's ANLS Mean/Pass and Acc Mean/Pass (Acc = ANLS > 0.5), plus ES exact pass and
    the cards' exact-match accuracy Mean/Pass."""
    from agent_envs.envs.docvqa.metrics import exact_match_metrics

    groups = [[clamped_score(r) for r in g] for g in by_task(rows).values()]
    flat = [s for g in groups for s in g]
    n = samples
    return {
        f"anls_mean{n}": _mean(flat),
        f"anls_pass{n}": _mean([max(g) for g in groups]),
        f"acc_mean{n}": _mean([1.0 if s > 0.5 else 0.0 for s in flat]),
        f"acc_pass{n}": _mean([1.0 if max(g) > 0.5 else 0.0 for g in groups]),
        f"exact_pass@{n}": _mean([1.0 if max(g) >= 1.0 else 0.0 for g in groups]),
        **exact_match_metrics(rows, n),
    }


def summarize(records: Records, samples: int, ks: Sequence[int] | None = None, items: int | None = None) -> Row:
    """Everything a report needs: ES summary, unbiased @k, ANLS metrics, diagnostics,
    token/turn/latency statistics."""
    rows = _rows(records)
    groups = [[clamped_score(r) for r in g] for g in by_task(rows).values()]
    anls = has_anls(rows)
    out: Row = {"es": es_summary(rows, samples, items=items)}
    ks = sorted(set(ks or [k for k in (1, 2, 4, 8, 16, samples) if k <= samples]))
    at_k: Row = {}
    for k in ks:
        at_k.update(_at_k(groups, k, lambda s: s >= 1.0))
        if anls:
            acc = _at_k(groups, k, lambda s: s > 0.5)
            at_k[f"acc_pass@{k}"] = acc[f"pass@{k}"]
    out["at_k"] = at_k
    if anls:
        out[ANLS_KEY] = anls_metrics(rows, samples)
    # the ES fields above count error episodes (failed requests, env errors) as score 0, as the
    # reference does; this mean leaves them out, so infrastructure failures cannot pass as the model's
    ok = [clamped_score(r) for r in rows if r.get("termination_reason") not in ERROR_TERMINATIONS]
    out["non_error"] = {"count": len(ok), "mean_score": _mean(ok)}
    out["diagnostics"] = diagnostics(rows)
    out["tool_call_rate"] = out["diagnostics"]["tool_call_rate"]
    out["tool_success_rate"] = out["diagnostics"]["tool_success_rate"]
    out["turns"] = _stats([float(r.get("turns", 0)) for r in rows])
    out["generated_tokens"] = _stats([float(r.get("generated_tokens", 0)) for r in rows])
    out["trajectory_tokens"] = _stats([float(r.get("trajectory_tokens", 0)) for r in rows])
    out["latency_s"] = _stats([float(r.get("latency_s", 0.0)) for r in rows])
    out["token_counts_exact"] = all(r.get("token_counts_exact") is not False for r in rows)
    if has_step_scores(rows):
        out["process"] = process_metrics(rows)
    return out


def has_step_scores(rows: Sequence[Row]) -> bool:
    """Whether a step scorer scored the records (they carry ``step_scores``)."""
    return any("step_scores" in r for r in rows)


def process_metrics(rows: Sequence[Row]) -> Row:
    """Step-score statistics (docs/protocol.md#process-rewards): failed steps are counted, not averaged."""
    scored = [r for r in rows if "step_scores" in r]
    steps = [s for r in scored for s in r.get("step_scores") or []]
    values = [float(s) for s in steps if s is not None]
    return {
        "episodes": len(scored),
        "steps": len(steps),
        "step_score_errors": len(steps) - len(values),
        "mean_step_score": _mean(values),
        "mean_process_score": _mean([float(r["process_score"]) for r in scored if r.get("process_score") is not None]),
        "aggregations": sorted({str(r.get("process_aggregation")) for r in scored}),
    }


def group_metrics(records: Records, k: int, best_by: str = "mean_score") -> Row:
    """Metrics per consecutive group of k sample indices (0..k-1, k..2k-1, ...) of an n-sample
    run, and the group with the highest ``best_by`` (a metric name of the groups, e.g.
    ``anls_mean4``; first on ties)."""
    rows = _rows(records)
    n = 1 + max((int(r["sample_index"]) for r in rows), default=-1)
    if k <= 0 or n % k:
        raise ValueError(f"group size {k} does not divide the {n} samples of this run")
    groups = []
    for g in range(n // k):
        members = [r for r in rows if g * k <= int(r["sample_index"]) < (g + 1) * k]
        summary = es_summary(members, k)
        entry: Row = {
            "group": g,
            "sample_indices": list(range(g * k, (g + 1) * k)),
            "count": summary["count"],
            "mean_score": summary["mean_score"],
            f"max@{k}": summary[f"max@{k}"],
            f"pass@{k}": summary[f"pass@{k}"],
        }
        if has_anls(members):
            entry.update(anls_metrics(members, k))
        groups.append(entry)
    named = sorted({key for e in groups for key, v in e.items() if isinstance(v, (int, float)) and key != "group"})
    if groups and best_by not in named:
        raise ValueError(f"cannot choose the best group by {best_by!r}: the groups have {', '.join(named)}")
    ranked = [e for e in groups if e.get(best_by) is not None]
    best = max(ranked, key=lambda e: e[best_by], default=None)
    return {"k": k, "samples": n, "best_by": best_by, "groups": groups,
            "best_group": best["group"] if best else None}


# --------------------------------------------------------------------------- diagnostics
def _valid(row: Row) -> bool:
    anls = _num(row.get("anls", row.get("score")))
    return not row.get("error") and anls is not None and anls >= 0


def _tools(row: Row) -> frozenset[str]:
    """The tool names of the row's environment (``bash`` for records of an unregistered one)."""
    env_id = row.get("env_id")
    return frozenset(registry.spec(env_id).tools) if env_id in registry.ENVIRONMENTS else frozenset({"bash"})


def _tool_steps(row: Row) -> list[Row]:
    """Steps that called one of the environment's tools."""
    tools = _tools(row)
    return [
        s for s in row.get("react_steps") or []
        if isinstance(s.get("action"), dict) and s["action"].get("name") in tools and "observation" in s
    ]


def _ok_observation(obs: Any) -> bool:
    text = str(obs)
    return "timed out after" not in text.lower() and "[ERROR]" not in text


def diagnostics(records: Records) -> Row:
    """The reference's ``summarize_results``: validity, tool-call/success rates, turns, retries."""
    rows = _rows(records)
    valid = [r for r in rows if _valid(r)]

    def frac(pred: Callable[[Row], bool]) -> float | None:
        return sum(1 for r in valid if pred(r)) / len(valid) if valid else None

    format_rows = [sum(1 for s in r.get("react_steps") or [] if not isinstance(s.get("action"), dict)) for r in valid]
    timeout_rows = [
        sum(1 for s in _tool_steps(r) if "timed out after" in str(s["observation"]).lower()) for r in valid
    ]
    usage_keys = ("prompt_tokens", "completion_tokens", "total_tokens", "accumulated_response_tokens")
    usage: Row = {}
    for key in usage_keys:
        vals = [float(r["usage"][key]) for r in valid if isinstance(r.get("usage"), dict) and key in r["usage"]]
        usage[f"mean_{key}"] = _mean(vals)
    return {
        "records": len(rows),
        "valid_records": len(valid),
        "request_errors": len(rows) - len(valid),
        "mean_anls": _mean([float(r.get("anls", r.get("score"))) for r in valid]),
        "mean_accuracy": _mean([float(r.get("acc", 0.0)) for r in valid]) if any("acc" in r for r in valid) else None,
        "tool_call_rate": frac(lambda r: bool(_tool_steps(r))),
        "tool_success_rate": frac(lambda r: any(_ok_observation(s["observation"]) for s in _tool_steps(r))),
        "mean_turns": _mean([len(r.get("react_steps") or []) + (0 if r.get("react_error") else 1) for r in valid]),
        "mean_latency_s": _mean([float(r["latency_s"]) for r in valid if _num(r.get("latency_s")) is not None]),
        "format_retry_rows": sum(1 for c in format_rows if c),
        "format_retries": sum(format_rows),
        "bash_timeout_rows": sum(1 for c in timeout_rows if c),
        "bash_timeouts": sum(timeout_rows),
        "react_errors": dict(Counter(str(r.get("react_error")) for r in rows if r.get("react_error"))),
        "usage": usage,
    }


# --------------------------------------------------------------------------- paired bootstrap
def _per_task_means(rows: Sequence[Row], which: str) -> dict[str, tuple[float, frozenset[int]]]:
    out: dict[str, tuple[float, frozenset[int]]] = {}
    for task, group in by_task([r for r in rows if _valid(r)]).items():
        vals = [float(r.get("anls", r.get("score"))) for r in group]
        out[task] = (sum(vals) / len(vals), frozenset(int(r.get("sample_index", 0)) for r in group))
    if not out:
        raise ValueError(f"no valid rows in the {which} records")
    return out


def paired_bootstrap(before: Records, after: Records, samples: int = 10_000, seed: int = 42) -> Row:
    """``compare_results``: per-task mean ANLS (``score`` when rows have no ``anls``), paired
    differences sorted by task id, percentile CI from ``random.Random(seed)``."""
    b = _per_task_means(_rows(before), "before")
    a = _per_task_means(_rows(after), "after")
    if set(a) != set(b):
        raise ValueError(f"before/after task sets differ: only before {sorted(set(b) - set(a))[:5]}, "
                         f"only after {sorted(set(a) - set(b))[:5]}")
    for task in b:
        if a[task][1] != b[task][1]:
            raise ValueError(f"before/after sample sets differ for task {task}")
    tasks = sorted(b)
    diffs = [a[t][0] - b[t][0] for t in tasks]
    n = len(diffs)
    rng = random.Random(seed)
    estimates = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(samples))
    before_mean = sum(b[t][0] for t in tasks) / n
    after_mean = sum(a[t][0] for t in tasks) / n
    return {
        "paired_tasks": n,
        "mean_anls_before": before_mean,
        "mean_anls_after": after_mean,
        "mean_anls_delta": after_mean - before_mean,
        "bootstrap_samples": samples,
        "bootstrap_seed": seed,
        "bootstrap_95_ci": [estimates[int(0.025 * (samples - 1))], estimates[int(0.975 * (samples - 1))]],
    }
