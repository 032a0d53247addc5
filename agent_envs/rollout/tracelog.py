"""Markdown trajectory logs in the reference's layout (docs/protocol.md#trace-logs; tests/test_tracelog.py
checks the bytes).

These files are what the skill-distillation step reads, so names and bodies follow the
reference exactly; only the choice of directory is ours.  The environment's
:class:`~agent_envs.core.spec.ReportSpec` (passed by the caller) names the files, decides the
outcome and renders the body.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from agent_envs.core.atomic import write_file
from agent_envs.core.spec import ReportSpec
from agent_envs.protocol.tracelog import generic_trace

from .records import EpisodeRecord, as_row

Row = dict[str, Any]
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_task_id(task_id: str) -> str:
    return _UNSAFE.sub("_", str(task_id))


def training_prefix(generation: int, candidate: int, seed: int) -> str:
    """``gen<GGG>_candidate<CC>_seed<seed>_`` for logs written during ES training."""
    return f"gen{generation:03d}_candidate{candidate:02d}_seed{seed}_"


def trace_filename(row: Row, report: ReportSpec, prefix: str = "") -> str:
    return (
        f"{report.trace_prefix}_agent_{prefix}{safe_task_id(row['task_id'])}"
        f"_sample{int(row['sample_index']):02d}_{report.outcome(row)}.md"
    )


def render(row: Row, report: ReportSpec) -> str:
    """The environment's own layout, or the shared one (``generic_trace``) when it declares none."""
    return (report.render_trace or generic_trace)(row, report.outcome(row))


def write_trace_log(record: EpisodeRecord | Row, directory: str | Path, report: ReportSpec, prefix: str = "") -> Path:
    """Write one log (UTF-8 with replacement, so unpaired surrogates cannot crash a run)."""
    row = as_row(record)
    path = Path(directory) / trace_filename(row, report, prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, render(row, report).encode("utf-8", "replace"))
    return path


def write_trace_logs(
    records: Sequence[EpisodeRecord | Row], directory: str | Path, report: ReportSpec, prefix: str = ""
) -> list[Path]:
    return [write_trace_log(r, directory, report, prefix) for r in records]
