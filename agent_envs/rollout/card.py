"""Card-style summaries: the numbers the released checkpoints' cards print (docs/cards.md).

A card reports each evaluated data set on its own: ``c/n = x`` for every count (tasks solved,
final-answer terminations), mean and max@k over k samples, per-sample means, request and parser
errors, the scorer setting and the score methods that were used.  :func:`dataset_card` computes
one set's block from its records; :func:`format_card` prints several; :func:`format_groups` prints
the per-group table of ``summarize --group``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from agent_envs.core.spec import EnvSpec
from agent_envs.scoring.metrics import clamped_score

from .metrics import NO_SAMPLE_ROWS, Records, diagnostics, es_summary
from .records import as_row

Row = dict[str, Any]
#: termination reasons of rows whose request (not the model) failed
REQUEST_FAILURES = ("request_error", "env_error")


def ratio(count: int, total: int) -> Row:
    """A count out of a total, and their quotient (None when the total is 0)."""
    return {"count": count, "total": total, "value": count / total if total else None}


def dataset_card(
    records: Records,
    samples: int,
    items: int | None = None,
    settings: Mapping[str, Any] | None = None,
    spec: EnvSpec | None = None,
) -> Row:
    """One data set's card block.  ``settings``: the environment's outcome-relevant options (the
    run's ``env_settings``, e.g. ``{"scorer": "exact"}``); ``spec``: the environment, whose own
    metrics (DocVQA's ANLS and exact-match accuracy) join the block under its key."""
    rows = [as_row(r) for r in records]
    es = es_summary(rows, samples, items=items)
    tasks, k = es["items"], samples
    scores = [clamped_score(r) for r in rows]
    binary = all(s in (0.0, 1.0) for s in scores)
    first = [clamped_score(r) for r in rows if int(r.get("sample_index", -1)) == 0]
    terminations = Counter(str(r.get("termination_reason")) for r in rows)
    diag = diagnostics(rows, spec=spec)
    card: Row = {
        "tasks": tasks,
        "samples": k,
        "episodes": len(rows),
        "expected_episodes": tasks * k,
        f"mean@{k}": ratio(int(sum(scores)), len(rows)) if binary else {"value": es["mean_score"]},
        f"max@{k}": es[f"max@{k}"],
        f"pass@{k}": ratio(es[f"pass@{k}_count"], tasks),
        "acc@1": ratio(int(sum(first)), len(first)) if binary else {"value": _sample_mean(es, 0)},
        "per_sample": [_sample_mean(es, i) for i in range(k)],
        "final_answer": ratio(terminations.get("final_answer", 0), len(rows)),
        "terminations": dict(terminations),
        "request_errors": sum(terminations.get(t, 0) for t in REQUEST_FAILURES),
        "parser_errors": {"warnings": diag["format_retries"], "episodes": diag["format_retry_rows"]},
        "score_methods": es["score_methods"],
        "settings": dict(settings or {}),
    }
    own = spec.metrics if spec is not None else None
    block = own.block(rows, k) if own is not None else None
    if own is not None and block is not None:
        card["env_metrics"] = own.key
        card[own.key] = block
    return card


def _sample_mean(es: Row, index: int) -> float:
    """Sample ``index``'s mean score in an ES summary (-1.0 when no row has that index)."""
    return float(es["by_sample"].get(str(index), NO_SAMPLE_ROWS)["mean_score"])


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"


def _ratio_text(block: Row) -> str:
    if "count" not in block:
        return _num(block["value"])
    value = block["value"]
    return f"{block['count']}/{block['total']} = " + ("-" if value is None else f"{round(value, 4):g}")


def _counts(counter: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def format_card(cards: Mapping[str, Row]) -> str:
    """The card text: one block per data set, its name first."""
    blocks = []
    for name, c in cards.items():
        k = c["samples"]
        settings = ", ".join(f"{key}={value}" for key, value in sorted(c["settings"].items()))
        lines = [
            f"{name}: {c['tasks']} tasks x {k} samples = {c['episodes']} episodes"
            + (f" (expected {c['expected_episodes']})" if c["episodes"] != c["expected_episodes"] else "")
            + (f"; {settings}" if settings else ""),
            f"  mean@{k}            {_ratio_text(c[f'mean@{k}'])}",
            f"  max@{k}             {_num(c[f'max@{k}'])}",
            f"  pass@{k}            {_ratio_text(c[f'pass@{k}'])}",
            f"  acc@1 (sample 0)  {_ratio_text(c['acc@1'])}",
            "  per sample        " + " / ".join(_num(v) for v in c["per_sample"]),
        ]
        for key, value in (c.get(c.get("env_metrics") or "") or {}).items():
            lines.append(f"  {key:<18}{_num(value)}")
        lines += [
            f"  final answers     {_ratio_text(c['final_answer'])}",
            f"  terminations      {_counts(c['terminations'])}",
            f"  request errors    {c['request_errors']}",
            f"  parser errors     {c['parser_errors']['warnings']} format warnings in "
            f"{c['parser_errors']['episodes']} episodes",
            f"  score methods     {_counts(c['score_methods'])}",
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _span(indices: Sequence[int]) -> str:
    return f"{indices[0]}-{indices[-1]}"


def format_groups(groups: Row) -> str:
    """``summarize --group K``: one line per group with every metric it has, then the best group."""
    entries: Sequence[Row] = groups["groups"]
    skip = ("group", "sample_indices")
    names = [key for key in entries[0] if key not in skip] if entries else []
    header = ["group", "samples", *names]
    lines = [header]
    for e in entries:
        cells = [str(e[n]) if n == "count" else _num(e.get(n)) for n in names]
        lines.append([str(e["group"]), _span(e["sample_indices"]), *cells])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    best = groups["best_group"]
    span = "-" if best is None else _span(entries[best]["sample_indices"])
    table.append(f"best group by {groups['best_by']}: {best} (samples {span})")
    return "\n".join(table)
