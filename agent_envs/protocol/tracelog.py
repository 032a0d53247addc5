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
