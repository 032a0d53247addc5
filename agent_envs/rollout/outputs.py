"""What a finished run leaves in its folder besides its records: ``summary.json`` (the metrics and
the run's wall time) and one markdown trace log per episode (docs/protocol.md#trace-logs).

:func:`write_outputs` is the end of ``agent-envs eval``, callable from Python on any run's records;
the HTML report is :func:`agent_envs.report.build_report`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from agent_envs.core.atomic import atomic_write
from agent_envs.envs import registry

from .metrics import summarize
from .records import EpisodeRecord
from .tracelog import write_trace_logs


def write_outputs(
    out: str | Path,
    records: Sequence[EpisodeRecord],
    *,
    env_id: str,
    samples: int,
    items: int,
    wall_s: float,
    trace_logs: bool = True,
) -> dict[str, Any]:
    """Write ``out/summary.json`` (and ``out/trace_logs/`` when ``trace_logs``) for ``records`` of
    ``env_id`` run over ``items`` tasks with ``samples`` each in ``wall_s`` seconds; return the
    summary.  A failed write raises the OSError naming the file (the records stay as they are)."""
    out = Path(out)
    env_spec = registry.spec(env_id)
    summary = summarize(records, samples, items=items, spec=env_spec)
    summary["run"] = {
        "dir": str(out),
        "wall_s": wall_s,
        "episodes": len(records),
        "episodes_per_s": len(records) / wall_s if wall_s > 0 else None,
    }
    atomic_write(out / "summary.json", [(json.dumps(summary, indent=2) + "\n").encode()])
    if trace_logs:
        write_trace_logs(records, out / "trace_logs", env_spec.report)
    return summary
