"""Countdown trace logs, in the Math layout with the numbers and target as the problem."""
from __future__ import annotations

from agent_envs.rollout.tracelog import Row, outcome, rounds, task_of


def render_countdown(row: Row) -> str:
    task = task_of(row)
    result = outcome(row)
    score = float(row.get("score") or 0.0)
    failure = row.get("react_error") or ("" if score >= 1.0 else str(row.get("score_reason") or "Score was 0."))
    lines = [
        f"# Chat History countdown_{row['task_id']}",
        "",
        f"Task ID: {row['task_id']}",
        "Setting: countdown",
        f"Sample index: {row['sample_index']}",
        f"Score: {score}",
        f"Score method: {row.get('score_method')}",
        f"Outcome: {result}",
        f"Failure reason: {failure}",
        "",
        "## Problem",
        "",
        f"Numbers: {', '.join(map(str, task.get('nums', [])))}",
        f"Target: {task.get('target', '')}",
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
