"""The DocVQA task payload; extra fields (``doc_id``, the synthetic set's OCR difficulty, ...)
travel into episode records untouched."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class DocTask(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    question: str
    answers: list[str] = Field(min_length=1)
    image: str  # host path of the page image
    source: str = ""

    @field_validator("id", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> str:
        return str(v)

    @field_validator("answers", mode="before")
    @classmethod
    def _answer_list(cls, v: Any) -> Any:
        """Accept a single gold string; drop empty answers (they can never be matched)."""
        if isinstance(v, str):
            v = [v]
        if isinstance(v, (list, tuple)):
            return [str(a) for a in v if a is not None and str(a).strip()]
        return v
