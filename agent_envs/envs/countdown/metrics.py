"""Countdown's own metrics: how often the final answer was a valid expression at all, and how far
valid expressions landed from the target (a graded view of 0/1 rewards)."""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

from agent_envs.core.spec import Metric, MetricsSpec, Row
from agent_envs.scoring.metrics import mean

#: summary.json key of the block
KEY = "countdown"


def countdown_metrics(rows: Sequence[Row], samples: int) -> Row | None:
    """``valid_expression_rate``: share of episodes whose final answer parsed as an arithmetic
    expression (records carry its exact ``value``); ``mean_target_distance``: mean |value - target|
    over those.  None for records without Countdown's fields."""
    scored = [r for r in rows if "target" in r and "value" in r]
    if not scored:
        return None
    distances = [float(abs(Fraction(str(r["value"])) - r["target"])) for r in scored if r["value"] is not None]
    return {"valid_expression_rate": len(distances) / len(scored), "mean_target_distance": mean(distances)}


METRICS = MetricsSpec(
    key=KEY,
    block=countdown_metrics,
    shown=(
        Metric("valid_expression_rate", label="valid expression rate"),
        Metric("mean_target_distance", label="mean distance of valid expressions to the target"),
    ),
)
