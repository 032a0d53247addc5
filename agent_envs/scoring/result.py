"""The score record every scorer returns (one shape, so runners and ES treat tasks alike)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Terminations that zero the score before any answer is looked at (docs/protocol.md#scoring).
ZEROING_TERMINATIONS = frozenset({"context_length_exceeded", "request_error"})


class ScoreResult(BaseModel):
    """``method`` is the protocol's short method name and ``label`` its ``score_method`` field.

    ``status`` says how the scorer itself fared: ``ok`` (it decided), ``skipped`` (the protocol
    fixed the score without consulting it), ``exact`` (exact match by request), or for
    math-verify ``unparsed`` / ``error`` / ``timeout`` / ``unavailable`` (it could not decide).
    ``extras`` are an environment's own record fields (a raw similarity the score was zeroed
    from, the value an answer came to), in the order its records list them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    score: float
    method: str
    label: str
    status: str
    answer_status: Literal["answered", "missing_final_answer"]
    prediction: str
    extras: dict[str, Any] = Field(default_factory=dict)

    def record_fields(self) -> dict[str, Any]:
        """The fields an episode record (and the last ``info``) carries for this score."""
        return {
            "score": self.score,
            "score_method": self.label,
            "score_status": self.status,
            "answer_status": self.answer_status,
            "prediction": self.prediction,
            **self.extras,
        }
