"""Outcome + process scores -> the ES fitness of an episode (docs/protocol.md#fitness-combiner).

``fitness = (1 - w) * outcome + w * process`` with ``outcome`` the clamped ES reward ``max(0,
score)`` and ``process`` the episode's step scores aggregated by ``aggregation`` (product, mean or
min; None: the record's own ``process_score``, i.e. the scorer's aggregation).  An episode without
any scored step keeps its outcome as fitness.  ``w = 0`` is the outcome-only ES reward exactly.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_envs.core.steps import Aggregation
from agent_envs.scoring.metrics import clamped_score
from agent_envs.scoring.process import aggregate


class FitnessCombiner(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    process_weight: float = Field(0.5, ge=0.0, le=1.0)
    aggregation: Aggregation | None = None

    def process(self, row: dict[str, Any]) -> float | None:
        if self.aggregation is None:
            value = row.get("process_score")
            return None if value is None else float(value)
        return aggregate(row.get("step_scores") or [], self.aggregation)

    def fitness(self, row: dict[str, Any]) -> float:
        outcome = clamped_score(row)
        process = self.process(row)
        if process is None:
            return outcome
        return (1.0 - self.process_weight) * outcome + self.process_weight * process
