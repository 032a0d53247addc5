"""Math trace logs in the reference's layout (docs/protocol.md#trace-logs) and its report fields."""

from __future__ import annotations

from agent_envs.core.spec import ReportFields, Row
from agent_envs.protocol.tracelog import rounds, task_of


def render_math(row: Row, result: str) -> str:
    """docs/protocol.md#trace-logs: blocks separated by blank lines, as DocVQA's (the reference's writer)."""
    task = task_of(row)
    score = float(row.get("score") or 0.0)
    failure = row.get("react_error") or ("Score was 0." if score < 1.0 else "")
    lines = [
        f"# Chat History math_reasoning_{row['task_id']}",
        "",
        f"Task ID: {row['task_id']}",
        "Setting: math_reasoning",
        f"Sample index: {row['sample_index']}",
        f"Score: {score}",
        f"Score method: {row.get('score_method')}",
        f"Outcome: {result}",
        f"Failure reason: {failure}",
        "",
        "## Problem",
        "",
        str(row.get("question", task.get("question", ""))),
        "",
        f"Expected answer: {row.get('answer', task.get('answer', ''))}",
        "",
        "## Trace",
        "",
        *rounds(row.get("react_steps") or []),
        "## Prediction",
        "",
        str(row.get("prediction", "")),
        "",
        "---",
        "",
        "## RESULT",
        result,
    ]
    return "\n".join(lines) + "\n"


def report_fields(row: Row) -> ReportFields:
    """The problem and its gold answer."""
    task = task_of(row)
    answer = row.get("answer", task.get("answer"))
    return ReportFields(
        question=str(row.get("question") or task.get("question") or ""), gold=None if answer is None else str(answer)
    )
