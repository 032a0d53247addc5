"""Metric arithmetic over episode rows (docs/protocol.md#metrics): the clamped ES reward, means,
unbiased pass@k and max@k, distribution statistics.

Pure functions of plain rows; what to compute for a run (the summary, an environment's own block)
is wired in :mod:`agent_envs.rollout.metrics` and each environment's folder.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Callable, Sequence

Row = dict[str, Any]


def finite(value: Any) -> float | None:
    """A finite real number, else None (booleans are not numbers here, as upstream)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def clamped_score(row: Row) -> float:
    """ES reward clamped at 0: a negative (request-error) score counts as 0 and stays in the mean."""
    return max(0.0, finite(row.get("score")) or 0.0)


def mean_valid(scores: Sequence[float]) -> float:
    """Mean of the scores clamped at 0 (a failed episode stays in the denominator)."""
    return sum(max(0.0, s) for s in scores) / len(scores) if scores else 0.0


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def by_task(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Rows grouped by task id, each group in sample order; tasks in first-seen order."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[str(row["task_id"])].append(row)
    return {t: sorted(g, key=lambda r: int(r.get("sample_index", 0))) for t, g in groups.items()}


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


def at_k(groups: Sequence[Sequence[float]], k: int, success: Callable[[float], bool]) -> Row:
    """Mean@k, unbiased pass@k (``success`` decides a sample) and max@k over the tasks with at least
    k samples (``groups``: each task's scores); None for each when no task has k."""
    usable = [g for g in groups if len(g) >= k]
    if not usable:
        return {f"mean@{k}": None, f"pass@{k}": None, f"max@{k}": None}
    return {
        f"mean@{k}": mean([s for g in usable for s in g]),
        f"pass@{k}": mean([pass_at_k(len(g), sum(1 for s in g if success(s)), k) for g in usable]),
        f"max@{k}": mean([max_at_k(g, k) for g in usable]),
    }


def stats(values: Sequence[float]) -> Row | None:
    """Mean, median, p90, max and total of ``values`` (None when there are none)."""
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
