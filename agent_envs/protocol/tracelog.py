"""The parts of a trace log every environment shares, in the reference's layout
(docs/protocol.md#trace-logs; tests/test_tracelog.py checks the bytes): the rounds of an episode;
each environment's renderer adds its header and result around them."""

from __future__ import annotations

import json
from typing import Any, Sequence

Row = dict[str, Any]


def task_of(row: Row) -> Row:
    """The record's task payload (empty when it has none)."""
    task = row.get("task")
    return task if isinstance(task, dict) else {}


def rounds(steps: Sequence[Row]) -> list[str]:
    """The ``## Round N`` sections of ``react_steps``: assistant text, action, observation, images.
    Assistant text and observation are written stripped, and an observation that is all whitespace
    has no section (the reference's writer)."""
    lines: list[str] = []
    said = 0  # the last round that carried its turn's text (later steps of that turn share it)
    for i, step in enumerate(steps, 1):
        if "assistant" in step or not said:
            said, text = i, str(step.get("assistant", "")).strip()
        else:
            text = f"(the completion of round {said})"
        lines += [f"## Round {i}", "", "### Assistant", "", text, ""]
        action = step.get("action")
        if action is not None:
            lines += ["### Action", "", "```json", json.dumps(action, ensure_ascii=False), "```", ""]
        observation = str(step.get("observation") or "").strip()
        if observation:
            lines += ["### Observation", "", "```text", observation, "```", ""]
        images = step.get("images")
        if images:  # what the model was shown, never pixels (docs/protocol.md#image-observations)
            lines += ["### Images shown", "", *(_image_line(f) for f in images if isinstance(f, dict)), ""]
    return lines


def _image_line(facts: Row) -> str:
    size = facts.get("size") or ["?", "?"]
    return (
        f"- box {facts.get('box')} of {facts.get('source')}, zoom {facts.get('zoom')}, "
        f"{size[0]}x{size[1]} pixels, sha256 {facts.get('sha256')}"
    )


def answer_log(row: Row, result: str, setting: str, problem: Sequence[str], failed: str = "Score was 0.") -> str:
    """The layout of Math's trace logs (docs/protocol.md#trace-logs), which Countdown's and those of an
    environment without a renderer share: the header lines, ``## Problem`` with ``problem``'s lines,
    the rounds, ``## Prediction`` and ``## RESULT``; ``failed`` is the failure reason of a score
    under 1 that has no react error."""
    score = float(row.get("score") or 0.0)
    failure = row.get("react_error") or (failed if score < 1.0 else "")
    lines = [
        f"# Chat History {setting}_{row['task_id']}",
        "",
        f"Task ID: {row['task_id']}",
        f"Setting: {setting}",
        f"Sample index: {row['sample_index']}",
        f"Score: {score}",
        f"Score method: {row.get('score_method')}",
        f"Outcome: {result}",
        f"Failure reason: {failure}",
        "",
        "## Problem",
        "",
        *problem,
        "",
        *trace_to_result(row, result),
    ]
    return "\n".join(lines) + "\n"


def trace_to_result(row: Row, result: str, prediction: str = "## Prediction") -> list[str]:
    """Every layout's end: ``## Trace`` with the rounds, the prediction under its heading, ``---`` and
    ``## RESULT`` directly followed by the outcome."""
    tail = ["## Trace", "", *rounds(row.get("react_steps") or []), prediction, "", str(row.get("prediction", ""))]
    return [*tail, "", "---", "", "## RESULT", result]


def generic_trace(row: Row, result: str) -> str:
    """The trace log of an environment that brings no renderer of its own: Math's layout with the
    environment's id as the setting and the task's payload (JSON) as the problem, so ``agent-envs
    eval`` on a new environment writes its logs from the first run."""
    payload = json.dumps(task_of(row), ensure_ascii=False, indent=2, default=str)
    failed = str(row.get("score_reason") or "Score was 0.")
    return answer_log(row, result, str(row.get("env_id")), ["```json", payload, "```"], failed)
