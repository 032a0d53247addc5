"""Sigma schedule of the seeded-ES trainer (docs/protocol.md#sigma-schedule).

Kept separate from the trainer so the schedule can be checked against the published values
without any model or engine.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def normalize_schedule(schedule: str) -> str:
    """One of :data:`SCHEDULES` in any letter case, hyphens read as underscores (the reference's
    spelling rule, so ``co_sine`` is refused as there); anything else is a ValueError naming it."""
    name = str(schedule).strip().lower().replace("-", "_")
    if name not in SCHEDULES:
        raise ValueError(f"unknown sigma schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    return name


def sigma_at_step(
    start: float,
    end: float,
    step: int,
    total: int,
    schedule: str = "constant",
    warmup: int = 0,
) -> float:
    """Sigma for zero-based ``step`` of ``total``: ``start`` through warm-up, exactly ``end`` last."""
    start, end = float(start), float(end)
    for label, value in (("sigma_start", start), ("sigma_end", end)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{label} must be finite and >= 0, got {value!r}")
    if int(warmup) < 0:
        raise ValueError(f"sigma warmup must be >= 0, got {warmup!r}")
    kind = normalize_schedule(schedule)
    total = int(total)
    if kind == "constant" or total <= 1:
        return start
    warmup = min(int(warmup), total - 1)
    step = min(max(int(step), 0), total - 1)
    if step == total - 1:
        return end
    if step < warmup:
        return start
    progress = min(max((step - warmup) / max(1, total - 1 - warmup), 0.0), 1.0)
    weight = progress if kind == "linear" else 0.5 * (1.0 - math.cos(math.pi * progress))
    return start + (end - start) * weight


def interval_evaluation_due(generation: int, generations: int, interval: int) -> bool:
    """Whether the held-out sets are evaluated after 0-based ``generation`` of ``generations``: after
    every ``interval``-th update and after the last, and never with ``interval`` 0, as the reference
    (docs/scaling.md#es-evaluation)."""
    return interval > 0 and ((generation + 1) % interval == 0 or generation == generations - 1)
