"""Markdown trajectory logs in the reference byte format (docs/protocol.md#trace-logs).

These files are what the skill-distillation step reads, so names and bodies follow the
reference exactly; only the choice of directory is ours.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from ..core.atomic import write_file
from ..core import registry
from ..core.spec import ReportSpec
from .records import EpisodeRecord, as_row

Row = dict[str, Any]
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_task_id(task_id: str) -> str:
    return _UNSAFE.sub("_", str(task_id))


def training_prefix(generation: int, candidate: int, seed: int) -> str:
    """``gen<GGG>_candidate<CC>_seed<seed>_`` for logs written during ES training."""
    return f"gen{generation:03d}_candidate{candidate:02d}_seed{seed}_"


def report_for(row: Row) -> ReportSpec:
    """The report rules of the row's environment (an unknown or missing env id is an error)."""
    return registry.spec(str(row.get("env_id") or "")).report


def succeeded(row: Row) -> bool:
    """The environment's success rule, e.g. score > 0.5 or score >= 1.0 (docs/protocol.md#trace-logs)."""
    return report_for(row).succeeded(float(row.get("score") or 0.0))


def outcome(row: Row) -> str:
    return "SUCCEED" if succeeded(row) else "FAILED"


def trace_filename(row: Row, prefix: str = "") -> str:
    return (
        f"{report_for(row).trace_prefix}_agent_{prefix}{safe_task_id(row['task_id'])}"
        f"_sample{int(row['sample_index']):02d}_{outcome(row)}.md"
    )


def task_of(row: Row) -> Row:
    task = row.get("task")
    return task if isinstance(task, dict) else {}


def rounds(steps: Sequence[Row]) -> list[str]:
    lines: list[str] = []
    for i, step in enumerate(steps, 1):
        lines += [f"## Round {i}", "", "### Assistant", "", str(step.get("assistant", "")).strip(), ""]
        action = step.get("action")
        if action is not None:
            lines += ["### Action", "", "```json", json.dumps(action, ensure_ascii=False), "```", ""]
        observation = step.get("observation")
        if observation:
            lines += ["### Observation", "", "```text", str(observation), "```", ""]
        images = step.get("images")
        if images:  # what the model was shown, never pixels (docs/protocol.md#image-observations)
            lines += ["### Images shown", "", *(_image_line(f) for f in images if isinstance(f, dict)), ""]
    return lines


def _image_line(facts: Row) -> str:
    size = facts.get("size") or ["?", "?"]
    return (f"- box {facts.get('box')} of {facts.get('source')}, zoom {facts.get('zoom')}, "
            f"{size[0]}x{size[1]} pixels, sha256 {facts.get('sha256')}")


def render(row: Row) -> str:
    report = report_for(row)
    if report.render_trace is None:
        raise ValueError(f"{row.get('env_id')} has no trace-log renderer")
    return report.render_trace(row)


def write_trace_log(record: EpisodeRecord | Row, directory: str | Path, prefix: str = "") -> Path:
    """Write one log (UTF-8 with replacement, so unpaired surrogates cannot crash a run)."""
    row = as_row(record)
    path = Path(directory) / trace_filename(row, prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, render(row).encode("utf-8", "replace"))
    return path


def write_trace_logs(records: Sequence[EpisodeRecord | Row], directory: str | Path, prefix: str = "") -> list[Path]:
    return [write_trace_log(r, directory, prefix) for r in records]
