"""DocVQA's exact-match accuracy (docs/protocol.md#metrics): the cards' "Accuracy" Mean/Pass.

The cards' Accuracy is exact match: a sample counts when its normalised prediction equals a gold
answer, i.e. its ES reward ``score`` (ANLS, zeroed without tool use) is 1.  The older ``acc``
field means ANLS > 0.5, so both are reported, under different names.
"""
from __future__ import annotations

from typing import Any, Sequence

Row = dict[str, Any]


def exact_match(row: Row) -> bool:
    """Whether the sample's prediction matches a gold answer exactly (after normalisation)."""
    score = row.get("score")
    return isinstance(score, (int, float)) and not isinstance(score, bool) and score >= 1.0


def exact_match_metrics(rows: Sequence[Row], samples: int) -> Row:
    """``exact_mean{n}`` (share of samples that match exactly) and ``exact_pass{n}`` (share of
    questions with at least one such sample), over ``rows`` of ``samples`` samples per question."""
    by_question: dict[str, list[bool]] = {}
    for row in rows:
        by_question.setdefault(str(row["task_id"]), []).append(exact_match(row))
    flat = [hit for hits in by_question.values() for hit in hits]
    return {
        f"exact_mean{samples}": sum(flat) / len(flat) if flat else None,
        f"exact_pass{samples}": sum(any(h) for h in by_question.values()) / len(by_question) if by_question else None,
    }
