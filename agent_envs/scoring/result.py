"""The score record every scorer returns (one shape, so runners and ES treat tasks alike)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

#: Terminations that zero the score before any answer is looked at (docs/protocol.md#scoring).
ZEROING_TERMINATIONS = frozenset({"context_length_exceeded", "request_error"})


class ScoreResult(BaseModel):
    """``method`` is the protocol's short method name and ``label`` its ``score_method`` field.

    ``status`` says how the scorer itself fared: ``ok`` (it decided), ``skipped`` (the protocol
    fixed the score without consulting it), ``exact`` (exact match by request), or for
    math-verify ``unparsed`` / ``error`` / ``timeout`` / ``unavailable`` (it could not decide).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    score: float
    method: str
    label: str
    status: str
    answer_status: Literal["answered", "missing_final_answer"]
    prediction: str
