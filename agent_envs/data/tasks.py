"""Task payloads: the pydantic models every loader yields and every environment accepts.

Both models allow extra fields so that provenance (``split_source``, ``doc_id``, the synthetic
set's OCR difficulty, ...) travels with the task into episode records untouched.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


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


def episode_key(task_id: str, sample_index: int) -> str:
    """``<task_id>:sampleNN``, the key records and resume match on (docs/protocol.md#records: no dataset prefix)."""
    return f"{task_id}:sample{sample_index:02d}"


def task_id(task: Any) -> str:
    """The id of a task model or a plain ``{"id": ...}`` row (runners and the ES trainer take both)."""
    return str(task["id"] if isinstance(task, dict) else task.id)
