"""Math trace logs in the reference's layout (docs/protocol.md#trace-logs) and its report fields."""

from __future__ import annotations

from agent_envs.core.spec import ReportFields, Row
from agent_envs.protocol.tracelog import answer_log, task_of


def render_math(row: Row, result: str) -> str:
    """docs/protocol.md#trace-logs: blocks separated by blank lines, as DocVQA's (the reference's writer)."""
    task = task_of(row)
    question = str(row.get("question", task.get("question", "")))
    answer = f"Expected answer: {row.get('answer', task.get('answer', ''))}"
    return answer_log(row, result, "math_reasoning", [question, "", answer])


def report_fields(row: Row) -> ReportFields:
    """The problem and its gold answer."""
    task = task_of(row)
    answer = row.get("answer", task.get("answer"))
    return ReportFields(
        question=str(row.get("question") or task.get("question") or ""), gold=None if answer is None else str(answer)
    )
