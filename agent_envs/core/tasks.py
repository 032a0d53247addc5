"""Task helpers every environment shares: episode keys and task ids (task models live in each
environment's folder)."""

from __future__ import annotations

from typing import Any


def episode_key(task_id: str, sample_index: int) -> str:
    """``<task_id>:sampleNN``, the key records and resume match on (docs/protocol.md#records: no dataset prefix)."""
    return f"{task_id}:sample{sample_index:02d}"


def task_id(task: Any) -> str:
    """The id of a task model or a plain ``{"id": ...}`` row (runners and the ES trainer take both)."""
    return str(task["id"] if isinstance(task, dict) else task.id)
