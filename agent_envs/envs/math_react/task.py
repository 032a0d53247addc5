"""The Math task payload; extra fields (provenance) travel into episode records untouched."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class MathTask(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    question: str
    answer: str
    source: str = ""

    @field_validator("id", "answer", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> str:
        """Numbers become strings; a null is refused (the reference scored it as the text "None")."""
        if v is None:
            raise ValueError("must not be null")
        return str(v)
