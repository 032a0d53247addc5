"""Metrics over episode records (docs/protocol.md#metrics).

Three families, kept apart because they answer different questions:

* :func:`es_summary`: the ES runner's ``summarize_rows`` (clamped scores, ``max@N``,
  ``pass@N`` = best score >= 1.0).  This is what the trainer and the published tables use.
* :func:`summarize`: unbiased Pass@k and max@k for any k <= n, token/turn/latency statistics,
  and the environment's own block (its spec's :class:`~agent_envs.core.spec.MetricsSpec`); the
  arithmetic is :mod:`agent_envs.scoring.metrics`.
* :func:`diagnostics` and :func:`paired_bootstrap`: the GRPO report helpers
  (the reference's ``summarize_results`` / ``compare_results``).

Environment-specific numbers come only through the spec the caller passes; nothing here looks an
environment up.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

from agent_envs.core.spec import EnvSpec
from agent_envs.scoring.metrics import at_k, by_task, clamped_score, finite, mean, stats

from .records import ERROR_TERMINATIONS, EpisodeRecord, as_row

Row = dict[str, Any]
Records = Iterable[EpisodeRecord | Row]


def _rows(records: Records) -> list[Row]:
    """The records as rows in (row_index, sample_index) order, the order the reference sums in (a
    float sum's last bit depends on it); without a row index on every record, in record order."""
    rows = [as_row(r) for r in records]
    if all(isinstance(r.get("row_index"), int) for r in rows):
        rows.sort(key=lambda r: (r["row_index"], int(r.get("sample_index", 0))))
    return rows


# --------------------------------------------------------------------------- ES summary
#: a ``by_sample`` entry for a sample index without rows (what per-sample tables show for it)
NO_SAMPLE_ROWS: Row = {"count": 0, "mean_score": -1.0}


def es_summary(records: Records, samples: int, items: int | None = None, include_rows: bool = False) -> Row:
    """``summarize_rows`` of the ES runner, field for field; ``by_sample`` is keyed by the sample
    indexes the rows have (docs/protocol.md#metrics)."""
    rows = _rows(records)
    scores = [clamped_score(r) for r in rows]
    tasks = by_task(rows)
    n_items = items if items is not None else len(tasks)
    best = [max(clamped_score(r) for r in group) for group in tasks.values()]
    pass_count = sum(1 for b in best if b >= 1.0)
    per_sample: dict[int, list[float]] = {}
    for r in rows:  # the sample indexes the rows have, whatever ``samples`` says (the reference's keys)
        per_sample.setdefault(int(r.get("sample_index", -1)), []).append(clamped_score(r))
    by_sample = {str(i): {"count": len(s), "mean_score": mean(s)} for i, s in sorted(per_sample.items())}
    out: Row = {
        "count": len(rows),
        "valid_count": len(rows),
        "error_count": sum(1 for r in rows if r.get("termination_reason") in ERROR_TERMINATIONS),
        "items": n_items,
        "samples": samples,
        "expected_count": n_items * samples,
        "average": mean(scores) or 0.0,
        "mean_score": mean(scores) or 0.0,
        f"max@{samples}": mean(best) or 0.0,
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


def summarize(
    records: Records,
    samples: int,
    ks: Sequence[int] | None = None,
    items: int | None = None,
    *,
    spec: EnvSpec | None = None,
) -> Row:
    """Everything a report needs: ES summary, unbiased @k, the environment's own block (from
    ``spec``; none without it), diagnostics, token/turn/latency statistics."""
    rows = _rows(records)
    groups = [[clamped_score(r) for r in g] for g in by_task(rows).values()]
    own = spec.metrics if spec is not None else None
    out: Row = {"es": es_summary(rows, samples, items=items)}
    ks = sorted(set(ks or [k for k in (1, 2, 4, 8, 16, samples) if k <= samples]))
    at_ks: Row = {}
    for k in ks:
        at_ks.update(at_k(groups, k, lambda s: s >= 1.0))
        if own is not None and own.at_k is not None:
            at_ks.update(own.at_k(rows, groups, k))
    out["at_k"] = at_ks
    block = own.block(rows, samples) if own is not None else None
    if own is not None and block is not None:
        out[own.key] = block
    # the ES fields above count error episodes (failed requests, env errors) as score 0, as the
    # reference does; this mean leaves them out, so infrastructure failures cannot pass as the model's
    ok = [clamped_score(r) for r in rows if r.get("termination_reason") not in ERROR_TERMINATIONS]
    out["non_error"] = {"count": len(ok), "mean_score": mean(ok)}
    out["diagnostics"] = diagnostics(rows, spec=spec)
    out["tool_call_rate"] = out["diagnostics"]["tool_call_rate"]
    out["tool_success_rate"] = out["diagnostics"]["tool_success_rate"]
    out["turns"] = stats([float(r.get("turns", 0)) for r in rows])
    out["generated_tokens"] = stats([float(r.get("generated_tokens", 0)) for r in rows])
    out["trajectory_tokens"] = stats([float(r.get("trajectory_tokens", 0)) for r in rows])
    out["latency_s"] = stats([float(r.get("latency_s", 0.0)) for r in rows])
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
    steps = [s for r in scored if isinstance(r["step_scores"], list) for s in r["step_scores"]]
    values = [float(s) for s in steps if _number(s)]  # anything else is a failed step
    return {
        "episodes": len(scored),
        "steps": len(steps),
        "step_score_errors": len(steps) - len(values),
        "mean_step_score": mean(values),
        "mean_process_score": mean([float(r["process_score"]) for r in scored if _number(r.get("process_score"))]),
        "aggregations": sorted({str(r.get("process_aggregation")) for r in scored}),
    }


def _number(value: Any) -> bool:
    """A number a mean can take (a hand-edited or foreign record may hold anything)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def group_metrics(records: Records, k: int, *, spec: EnvSpec | None = None, best_by: str = "mean_score") -> Row:
    """Metrics per consecutive group of k sample indices (0..k-1, k..2k-1, ...) of an n-sample
    run (with the environment's own block, from ``spec``), and the group with the highest
    ``best_by`` (a metric name of the groups, e.g. ``anls_mean4``; first on ties)."""
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
        block = spec.metrics.block(members, k) if spec is not None and spec.metrics is not None else None
        if block is not None:
            entry.update(block)
        groups.append(entry)
    named = sorted({key for e in groups for key, v in e.items() if isinstance(v, (int, float)) and key != "group"})
    if groups and best_by not in named:
        raise ValueError(f"cannot choose the best group by {best_by!r}: the groups have {', '.join(named)}")
    ranked = [e for e in groups if e.get(best_by) is not None]
    best = max(ranked, key=lambda e: e[best_by], default=None)
    return {"k": k, "samples": n, "best_by": best_by, "groups": groups, "best_group": best["group"] if best else None}


# --------------------------------------------------------------------------- diagnostics
def _raw_score(row: Row) -> float:
    """The reference's per-row value: the raw ``anls`` when the row has one, else the score."""
    return finite(row.get("anls", row.get("score"))) or 0.0


def score_metric(rows: Sequence[Row], spec: EnvSpec | None) -> str:
    """What the rows' mean score measures: the environment's :attr:`~EnvSpec.score_metric`; for
    records of no known environment, ``anls`` when they carry the raw field, else ``score``."""
    if spec is not None:
        return spec.score_metric
    return "anls" if any("anls" in r for r in rows) else "score"


def _valid(row: Row) -> bool:
    anls = finite(row.get("anls", row.get("score")))
    return not row.get("error") and anls is not None and anls >= 0


def _tool_steps(row: Row, tools: frozenset[str]) -> list[Row]:
    """Steps that called one of the environment's tools."""
    return [
        s
        for s in row.get("react_steps") or []
        if isinstance(s.get("action"), dict) and s["action"].get("name") in tools and "observation" in s
    ]


def _ok_observation(obs: Any) -> bool:
    text = str(obs)
    return "timed out after" not in text.lower() and "[ERROR]" not in text


def diagnostics(records: Records, *, spec: EnvSpec | None = None) -> Row:
    """The reference's ``summarize_results``: validity, tool-call/success rates, turns, retries.
    A tool step is a call of one of ``spec``'s tools (``bash`` without a spec)."""
    rows = _rows(records)
    tools = frozenset(spec.tool_names if spec is not None else ("bash",))
    valid = [r for r in rows if _valid(r)]

    def frac(pred: Callable[[Row], bool]) -> float | None:
        return sum(1 for r in valid if pred(r)) / len(valid) if valid else None

    format_rows = [sum(1 for s in r.get("react_steps") or [] if not isinstance(s.get("action"), dict)) for r in valid]
    timeout_rows = [
        sum(1 for s in _tool_steps(r, tools) if "timed out after" in str(s["observation"]).lower()) for r in valid
    ]
    usage_keys = ("prompt_tokens", "completion_tokens", "total_tokens", "accumulated_response_tokens")
    usage: Row = {}
    for key in usage_keys:
        vals = [float(r["usage"][key]) for r in valid if isinstance(r.get("usage"), dict) and key in r["usage"]]
        usage[f"mean_{key}"] = mean(vals)
    return {
        "records": len(rows),
        "valid_records": len(valid),
        "request_errors": len(rows) - len(valid),
        "score_metric": score_metric(rows, spec),
        "mean_score": mean([_raw_score(r) for r in valid]),
        "mean_accuracy": mean([float(r.get("acc", 0.0)) for r in valid]) if any("acc" in r for r in valid) else None,
        "tool_call_rate": frac(lambda r: bool(_tool_steps(r, tools))),
        "tool_success_rate": frac(lambda r: any(_ok_observation(s["observation"]) for s in _tool_steps(r, tools))),
        "mean_turns": mean([len(r.get("react_steps") or []) + (0 if r.get("react_error") else 1) for r in valid]),
        "mean_latency_s": mean([float(r["latency_s"]) for r in valid if finite(r.get("latency_s")) is not None]),
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
        vals = [_raw_score(r) for r in group]
        out[task] = (sum(vals) / len(vals), frozenset(int(r.get("sample_index", 0)) for r in group))
    if not out:
        raise ValueError(f"no valid rows in the {which} records")
    return out


def paired_bootstrap(
    before: Records, after: Records, samples: int = 10_000, seed: int = 42, *, spec: EnvSpec | None = None
) -> Row:
    """``compare_results``: per-task mean ANLS (``score`` when rows have no ``anls``), paired
    differences sorted by task id, percentile CI from ``random.Random(seed)``.  The means are
    named after what they measure (:func:`score_metric`; read them with :func:`compare_means`)."""
    before_rows, after_rows = _rows(before), _rows(after)
    b = _per_task_means(before_rows, "before")
    a = _per_task_means(after_rows, "after")
    if set(a) != set(b):
        raise ValueError(
            f"before/after task sets differ: only before {sorted(set(b) - set(a))[:5]}, "
            f"only after {sorted(set(a) - set(b))[:5]}"
        )
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
        "score_metric": score_metric(before_rows + after_rows, spec),
        "mean_score_before": before_mean,
        "mean_score_after": after_mean,
        "mean_score_delta": after_mean - before_mean,
        "bootstrap_samples": samples,
        "bootstrap_seed": seed,
        "bootstrap_95_ci": [estimates[int(0.025 * (samples - 1))], estimates[int(0.975 * (samples - 1))]],
    }


def compare_means(result: Row) -> tuple[float, float, float]:
    """``(before, after, delta)`` of a :func:`paired_bootstrap` result, also of one written before
    the means were named after their metric (``mean_anls_*``, as stored provenance holds)."""
    prefix = "mean_score_" if "mean_score_delta" in result else "mean_anls_"
    return result[prefix + "before"], result[prefix + "after"], result[prefix + "delta"]
