"""DocVQA's own metrics (docs/protocol.md#metrics): ANLS and accuracy Mean/Pass, and accuracy pass@k.

They are computed from the ES reward ``score`` (= ANLS unless the episode failed or never used
bash), because that is what the published Mean4 (0.50426) and max@4 are; the shared diagnostics
use the raw ``anls``/``acc`` fields, as upstream does.  ``acc`` is ANLS > 0.5; the cards' "Accuracy"
is exact match (``exact_mean``/``exact_pass``: the normalised prediction equals a gold answer, score 1).
"""

from __future__ import annotations

from typing import Sequence

from agent_envs.core.spec import Metric, MetricsSpec, Row
from agent_envs.scoring.metrics import at_k, by_task, clamped_score, mean

#: summary.json key of the block: a published output layout, kept as is
ANLS_KEY = "docvqa"


def has_anls(rows: Sequence[Row]) -> bool:
    """Whether the records are ANLS-scored (they carry the raw ``anls`` field)."""
    return any("anls" in r for r in rows)


def anls_metrics(rows: Sequence[Row], samples: int) -> Row | None:
    """The README's ANLS Mean/Pass and Acc Mean/Pass, ES exact pass, and the cards' exact-match
    accuracy Mean/Pass (None without ``anls``)."""
    if not has_anls(rows):
        return None
    groups = [[clamped_score(r) for r in g] for g in by_task(rows).values()]
    flat = [s for g in groups for s in g]
    n = samples
    return {
        f"anls_mean{n}": mean(flat),
        f"anls_pass{n}": mean([max(g) for g in groups]),
        f"acc_mean{n}": mean([1.0 if s > 0.5 else 0.0 for s in flat]),
        f"acc_pass{n}": mean([1.0 if max(g) > 0.5 else 0.0 for g in groups]),
        f"exact_pass@{n}": mean([1.0 if max(g) >= 1.0 else 0.0 for g in groups]),
        f"exact_mean{n}": mean([1.0 if s >= 1.0 else 0.0 for s in flat]),
        f"exact_pass{n}": mean([1.0 if max(g) >= 1.0 else 0.0 for g in groups]),
    }


def accuracy_at_k(rows: Sequence[Row], groups: Sequence[Sequence[float]], k: int) -> Row:
    """Unbiased accuracy pass@k (a sample passes when its score exceeds 0.5)."""
    if not has_anls(rows):
        return {}
    return {f"acc_pass@{k}": at_k(groups, k, lambda s: s > 0.5)[f"pass@{k}"]}


METRICS = MetricsSpec(
    key=ANLS_KEY,
    block=anls_metrics,
    at_k=accuracy_at_k,
    shown=(
        Metric("anls_mean{n}", column="anls_mean", label="ANLS mean"),
        Metric("anls_pass{n}", label="ANLS pass (best sample)"),
        Metric("acc_mean{n}", column="acc_mean", label="accuracy (ANLS > 0.5)"),
        Metric("acc_pass{n}", column="acc_pass", label="accuracy pass"),
        Metric("exact_mean{n}", label="exact-match accuracy (the cards' Accuracy)"),
        Metric("exact_pass{n}", label="exact-match accuracy pass"),
    ),
    at_k_labels={"acc_pass@": "accuracy Pass@"},
)
