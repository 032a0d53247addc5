"""Read a run folder as written by ``agent-envs eval``, including one killed midway (a torn last
line in ``records.jsonl``, no ``summary.json``) and damaged or foreign records: a row the report
cannot place (no usable key, task, sample or score) is left out, a field of the wrong type is
dropped, and each is listed in :attr:`Run.notes` with its line, so the page shows what it can and
says what it could not."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from agent_envs.core.spec import EnvSpec, ReportSpec
from agent_envs.envs import registry
from agent_envs.rollout.metrics import summarize
from agent_envs.rollout.records import EpisodeRecord

#: fields without which a row cannot be placed or scored
ESSENTIAL = ("key", "task_id", "row_index", "sample_index", "score")


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


#: fields outside :class:`EpisodeRecord` that the report reads, and what each must be to be shown
EXTRA_FIELDS: dict[str, Callable[[Any], bool]] = {
    "anls": _number,
    "vlns": _number,
    "acc": _number,
    "process_score": _number,
    "tool_calls": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "step_scores": _list_of(_number),
    "step_score_errors": _list_of(lambda v: v is None or isinstance(v, str)),
    "process_aggregation": lambda v: v is None or isinstance(v, str),
    "prompt_images": _list_of(lambda v: isinstance(v, dict)),
    "image": lambda v: v is None or isinstance(v, str),
    "answers": lambda v: v is None or isinstance(v, list),
    "task": lambda v: isinstance(v, dict),
}

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
    #: what was left out of the page, one line each (``line 3: score dropped: ...``)
    notes: list[str] = field(default_factory=list)

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
    rows, bad, notes = _read_rows(records_path)
    rows.sort(key=lambda r: (r["row_index"], r["sample_index"]))  # async runs finish out of order
    folder = records_path.parent
    config = _json_file(folder / "config.json") or {}
    declared = config.get("samples")
    if not (isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1):
        declared = None
    samples = declared or 1 + max((r["sample_index"] for r in rows), default=0)
    spec = registry.spec_of(rows) or registry.SPECS.get(str(config.get("env")))
    run = Run(folder.name, folder, rows, config, _json_file(folder / "summary.json"), bad, samples, spec, notes=notes)
    run.metrics = summarize(rows, samples, items=len({r["task_id"] for r in rows}) or None, spec=spec)
    return run


def _read_rows(path: Path) -> tuple[list[dict[str, Any]], int, list[str]]:
    """Usable rows, the count of unreadable lines, and a note per row or field left out."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    bad = 0
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8", "replace"))
            except (ValueError, RecursionError):
                bad += 1
                continue
            if not isinstance(row, dict):
                bad += 1
                continue
            usable = _usable(row, f"line {number}", notes)
            if usable is not None:
                rows.append(usable)
    return rows, bad, notes


def _usable(row: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any] | None:
    """``row`` validated, without the fields of the wrong type (noted); None when it cannot be placed."""
    row = dict(row)
    for name, check in EXTRA_FIELDS.items():
        if name in row and not check(row[name]):
            notes.append(f"{where}: {name} not shown (unexpected {type(row.pop(name)).__name__})")
    for _ in range(len(row) + 1):
        try:
            return EpisodeRecord.model_validate(row).row()
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
        fields = {str(e["loc"][0]) for e in errors if e["loc"]}
        fatal = sorted(fields & set(ESSENTIAL)) or (None if fields else ["record"])
        if fatal:
            first = next(e for e in errors if not e["loc"] or str(e["loc"][0]) in fatal)
            notes.append(f"{where}: left out ({'.'.join(map(str, first['loc'])) or 'record'}: {first['msg']})")
            return None
        for name in sorted(fields):
            notes.append(f"{where}: {name} not shown (unexpected {type(row.pop(name)).__name__})")
    return None
