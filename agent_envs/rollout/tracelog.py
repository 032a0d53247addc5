"""Markdown trajectory logs in the reference byte format (docs/protocol.md#trace-logs).

These files are what the skill-distillation step reads, so names and bodies follow the
reference exactly; only the choice of directory is ours.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from ..atomic import write_file
from .records import EpisodeRecord, as_row

Row = dict[str, Any]
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_task_id(task_id: str) -> str:
    return _UNSAFE.sub("_", str(task_id))


def training_prefix(generation: int, candidate: int, seed: int) -> str:
    """``gen<GGG>_candidate<CC>_seed<seed>_`` for logs written during ES training."""
    return f"gen{generation:03d}_candidate{candidate:02d}_seed{seed}_"


def setting_of(row: Row) -> str:
    """``docvqa`` or ``math_reasoning`` from the env id (falling back to the row's fields)."""
    env_id = str(row.get("env_id") or "")
    if env_id.startswith("DocVQA") or (not env_id and "anls" in row):
        return "docvqa"
    return "math_reasoning"


def succeeded(row: Row) -> bool:
    """DocVQA: score > 0.5; Math: score >= 1.0 (docs/protocol.md#trace-logs)."""
    score = float(row.get("score") or 0.0)
    return score > 0.5 if setting_of(row) == "docvqa" else score >= 1.0


def outcome(row: Row) -> str:
    return "SUCCEED" if succeeded(row) else "FAILED"


def trace_filename(row: Row, prefix: str = "") -> str:
    kind = "docvqa" if setting_of(row) == "docvqa" else "math"
    return (
        f"{kind}_agent_{prefix}{safe_task_id(row['task_id'])}"
        f"_sample{int(row['sample_index']):02d}_{outcome(row)}.md"
    )


def _task(row: Row) -> Row:
    task = row.get("task")
    return task if isinstance(task, dict) else {}


def _rounds(steps: Sequence[Row]) -> list[str]:
    lines: list[str] = []
    for i, step in enumerate(steps, 1):
        lines += [f"## Round {i}", "", "### Assistant", "", str(step.get("assistant", "")).strip(), ""]
        action = step.get("action")
        if action is not None:
            lines += ["### Action", "", "```json", json.dumps(action, ensure_ascii=False), "```", ""]
        observation = step.get("observation")
        if observation:
            lines += ["### Observation", "", "```text", str(observation), "```", ""]
    return lines


def render_docvqa(row: Row) -> str:
    task = _task(row)
    result = outcome(row)
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
        "## Trace",
        "",
        *_rounds(row.get("react_steps") or []),
        "## Final prediction",
        "",
        str(row.get("prediction", "")),
        "",
        "---",
        "",
        "## RESULT",
        result,
    ]
    return "\n".join(lines) + "\n"


def render_math(row: Row) -> str:
    """docs/protocol.md#trace-logs, read literally: the Math ``## Problem`` and ``## Prediction`` have no blank line after."""
    task = _task(row)
    result = outcome(row)
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
        str(row.get("question", task.get("question", ""))),
        "",
        f"Expected answer: {row.get('answer', task.get('answer', ''))}",
        "## Trace",
        "",
        *_rounds(row.get("react_steps") or []),
        "## Prediction",
        str(row.get("prediction", "")),
        "---",
        "## RESULT",
        result,
    ]
    return "\n".join(lines) + "\n"


def render(row: Row) -> str:
    return render_docvqa(row) if setting_of(row) == "docvqa" else render_math(row)


def write_trace_log(record: EpisodeRecord | Row, directory: str | Path, prefix: str = "") -> Path:
    """Write one log (UTF-8 with replacement, so unpaired surrogates cannot crash a run)."""
    row = as_row(record)
    path = Path(directory) / trace_filename(row, prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, render(row).encode("utf-8", "replace"))
    return path


def write_trace_logs(records: Sequence[EpisodeRecord | Row], directory: str | Path, prefix: str = "") -> list[Path]:
    return [write_trace_log(r, directory, prefix) for r in records]
