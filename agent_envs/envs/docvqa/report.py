"""DocVQA's trace logs in the reference's layout (docs/protocol.md#trace-logs) and its report fields."""

from __future__ import annotations

import json

from agent_envs.core.spec import ReportFields, Row
from agent_envs.protocol.tracelog import task_of, trace_to_result


def render_docvqa(row: Row, result: str) -> str:
    task = task_of(row)
    question = str(row.get("question", task.get("question", "")))
    answers = row.get("answers", task.get("answers", []))
    failure = row.get("react_error") or ("ANLS did not exceed 0.5." if result == "FAILED" else "")
    lines = [
        f"# Chat History docvqa_{row['task_id']}",
        "",
        f"Task ID: {row['task_id']}",
        "Setting: docvqa",
        f"Sample index: {row['sample_index']}",
        f"Image: {row.get('image', task.get('image', ''))}",
        f"Question: {question}",
        f"Expected answers: {json.dumps(answers, ensure_ascii=False)}",
        f"Prediction: {row.get('prediction', '')}",
        f"ANLS: {row.get('anls')}",
        f"Threshold accuracy: {row.get('acc')}",
        f"Score: {row.get('score')}",
        f"Score method: {row.get('score_method')}",
        f"Outcome: {result}",
        f"Termination reason: {row.get('termination_reason')}",
        f"Failure reason: {failure}",
        "",
        "## Problem",
        "",
        question,
        "",
        *trace_to_result(row, result, "## Final prediction"),
    ]
    return "\n".join(lines) + "\n"


def report_fields(row: Row) -> ReportFields:
    """The question, every gold answer (``a | b``) and the page image of a DocVQA record."""
    task = task_of(row)
    answers = row.get("answers", task.get("answers"))
    anls = row.get("anls")
    return ReportFields(
        question=str(row.get("question") or task.get("question") or ""),
        gold=" | ".join(str(a) for a in answers) if answers else None,
        image=row.get("image") or None,
        score_note=f"ANLS {anls:.4f}" if isinstance(anls, (int, float)) else None,
    )
