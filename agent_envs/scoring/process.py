"""Step scores -> one number per episode, and the record fields that carry them
(docs/protocol.md#process-rewards)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Sequence

from agent_envs.core.steps import StepScore

AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {"product": math.prod, "mean": statistics.fmean, "min": min}


def aggregate(scores: Sequence[float | None], how: str) -> float | None:
    """One number for an episode's step scores; failed steps (None) are left out, None if none scored."""
    if how not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {how!r}; expected one of {', '.join(AGGREGATIONS)}")
    values = [float(s) for s in scores if s is not None]
    return AGGREGATIONS[how](values) if values else None


def process_fields(scores: Sequence[StepScore], aggregation: str) -> dict[str, Any]:
    """The record fields of an episode's step scores, aligned with ``react_steps``."""
    values = [s.score for s in scores]
    return {
        "step_scores": values,
        "step_score_errors": [s.error for s in scores],
        "process_score": aggregate(values, aggregation),
        "process_aggregation": aggregation,
    }
