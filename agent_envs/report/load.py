"""Read a run folder as written by ``agent-envs eval``, including one killed midway (a torn last
line in ``records.jsonl``, no ``summary.json``)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_envs.core.spec import EnvSpec, ReportSpec
from agent_envs.envs import registry
from agent_envs.rollout.metrics import summarize
from agent_envs.rollout.records import EpisodeRecord, read_jsonl

#: how records of an environment this version does not know are shown: success at score 1.0,
#: no question, gold or page
UNKNOWN_ENV = ReportSpec(trace_prefix="unknown")


class RunError(ValueError):
    """A run folder that cannot be reported on (no records file)."""


@dataclass
class Run:
    name: str
    path: Path
    rows: list[dict[str, Any]]
    config: dict[str, Any]
    #: ``summary.json`` as eval wrote it (absent when the run was killed)
    saved_summary: dict[str, Any] | None
    #: lines of records.jsonl that could not be read (a torn last line after a kill)
    unreadable_lines: int
    samples: int
    #: the spec of the environment that wrote the records (None: one this version does not know)
    spec: EnvSpec | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.saved_summary is not None

    @property
    def report(self) -> ReportSpec:
        return self.spec.report if self.spec is not None else UNKNOWN_ENV


def _json_file(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def load_run(path: str | Path) -> Run:
    """Records (validated as :class:`EpisodeRecord`), config and saved summary of one run folder
    (or a ``records.jsonl`` path)."""
    path = Path(path)
    records_path = path / "records.jsonl" if path.is_dir() else path
    if not records_path.is_file():
        raise RunError(f"no records at {records_path}")
    raw, bad = read_jsonl(records_path)
    rows = sorted((EpisodeRecord.model_validate(r).row() for r in raw),
                  key=lambda r: (int(r["row_index"]), int(r["sample_index"])))  # async runs finish out of order
    folder = records_path.parent
    config = _json_file(folder / "config.json") or {}
    samples = int(config.get("samples") or 1 + max((int(r["sample_index"]) for r in rows), default=0))
    spec = registry.spec_of(rows) or registry.SPECS.get(str(config.get("env")))
    run = Run(folder.name, folder, rows, config, _json_file(folder / "summary.json"), bad, samples, spec)
    run.metrics = summarize(rows, samples, items=len({r["task_id"] for r in rows}) or None, spec=spec)
    return run
