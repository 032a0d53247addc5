"""``--resume``: pick up a records file where a previous run stopped (docs/protocol.md#resume).

* Rows whose ``error`` is set (request or environment failures) are archived to
  ``<stem>.request_errors.jsonl`` and their keys run again.
* For duplicate keys the last successful row wins.
* A truncated last line (the previous run was SIGKILLed mid-write) is dropped.
* Anything else that is not a record (a line that is not JSON, a row without ``task_id``, a key
  that is not a string) is a :class:`DamagedRecords` error naming the file and line, raised before
  the file is touched: resuming would silently run those episodes again, or lose them.

The records file is then rewritten atomically with exactly one line per finished key, each
byte for byte as it was (invalid UTF-8 included), so the run that follows can append to a
clean file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from ..core.atomic import atomic_write
from .records import EpisodeRecord, JsonlWriter, NotARecordsFile, open_records

Row = dict[str, Any]


class DamagedRecords(ValueError):
    """A records file that cannot be resumed; the message names the file and line."""


class RecordLine(NamedTuple):
    """One line of a records file: its number, its bytes as written, its row and its record."""

    number: int
    raw: bytes
    row: Row
    record: EpisodeRecord


def read_records(path: str | os.PathLike[str]) -> tuple[list[RecordLine], int]:
    """Every line of a records file with its row and validated record, and 1 if a torn last line
    was dropped (else 0); :class:`DamagedRecords` for any other line that is not a record, and
    for a path that is not a regular file (a directory; a FIFO, which would block forever)."""
    try:
        with open_records(path) as fh:
            data = fh.read()
    except NotARecordsFile as exc:
        raise DamagedRecords(str(exc)) from None
    lines = [(n, raw) for n, raw in enumerate(data.splitlines(), 1) if raw.strip()]
    out: list[RecordLine] = []
    for i, (number, raw) in enumerate(lines):
        try:
            row = json.loads(raw.decode("utf-8", "replace"))
        except (ValueError, RecursionError) as exc:
            if i == len(lines) - 1:
                return out, 1  # the line a killed run was writing
            raise DamagedRecords(f"{path}: line {number} is not JSON ({exc}); remove or repair it") from None
        if not isinstance(row, dict):
            raise DamagedRecords(f"{path}: line {number} is a JSON {type(row).__name__}, not a record")
        try:
            record = EpisodeRecord.model_validate(row)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(map(str, first["loc"])) or "record"
            raise DamagedRecords(
                f"{path}: line {number} is not a record ({where}: {first['msg']}); remove or repair it"
            ) from None
        if not math.isfinite(record.score):  # the run's summary (strict JSON) could not be written
            raise DamagedRecords(
                f"{path}: line {number} has score {json.dumps(record.score)}, not a finite number; remove or repair it"
            )
        out.append(RecordLine(number, raw, row, record))
    return out, 0


def archive_path(records_path: str | os.PathLike[str]) -> Path:
    path = Path(records_path)
    return path.with_name(f"{path.stem}.request_errors.jsonl")


class ResumeState:
    """Finished records by key, as left on disk by a previous run."""

    def __init__(self, finished: dict[str, EpisodeRecord], archived: int, dropped_lines: int):
        self.finished = finished
        self.archived = archived
        self.dropped_lines = dropped_lines

    def __repr__(self) -> str:
        return (
            f"ResumeState(finished={len(self.finished)}, archived_errors={self.archived}, "
            f"dropped_lines={self.dropped_lines})"
        )


def prepare_resume(records_path: str | os.PathLike[str]) -> ResumeState:
    """Compact ``records_path`` in place and return what is already done."""
    path = Path(records_path)
    if not path.exists():
        return ResumeState({}, 0, 0)
    lines, dropped = read_records(path)
    finished: dict[str, RecordLine] = {}
    errors: list[Row] = []
    for line in lines:
        if line.record.error:
            errors.append(line.row)
        else:
            finished.pop(line.record.key, None)  # re-insert so file order follows the winning row
            finished[line.record.key] = line
    if errors:
        with JsonlWriter(archive_path(path)) as archive:
            for row in errors:
                archive.write(row)
    # the kept lines' bytes as they were: a row re-encoded would turn invalid UTF-8 into U+FFFD
    atomic_write(path, (line.raw + b"\n" for line in finished.values()))
    return ResumeState({k: line.record for k, line in finished.items()}, len(errors), dropped)


#: config fields that must not change when a run is resumed (records would mix two setups)
RESUME_IDENTITY = (
    "env",
    "data",
    "seed",
    "policy",
    "model",
    "base_urls",
    "engine_args",
    "sampling",
    "max_turns",
    "max_tokens_per_turn",
    "env_args",
    "sandbox",
    "step_scorer",
    "skill_sha256",
    "prompts",
    "token_trajectories",
)


class CannotResume(ValueError):
    """A run folder that cannot be resumed with this configuration; the message says why."""


def check_resume(config_path: str | os.PathLike[str], config: dict[str, Any]) -> None:
    """``config`` may resume the run whose configuration is at ``config_path`` (its ``config.json``):
    the records beside it can be resumed and no field of :data:`RESUME_IDENTITY` changed.  Checked
    before any model loads; :class:`CannotResume` naming the file (and line) otherwise.  A folder
    without a configuration yet (a run stopped before writing one) resumes as it is."""
    path = Path(config_path)
    records = path.parent / "records.jsonl"
    try:
        if records.exists():
            read_records(records)
    except DamagedRecords as exc:
        raise CannotResume(f"cannot resume: {exc}") from None
    if not path.exists():
        return
    try:
        before = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CannotResume(f"cannot resume: {path} is not readable JSON ({exc})") from None
    if not isinstance(before, dict):
        raise CannotResume(f"cannot resume: {path} holds a JSON {type(before).__name__}, not a run configuration")
    changed = [k for k in RESUME_IDENTITY if before.get(k) != config.get(k)]
    if changed:
        detail = "; ".join(f"{k}: {before.get(k)!r} -> {config.get(k)!r}" for k in changed)
        raise CannotResume(f"cannot resume {path.parent}: the configuration changed ({detail})")
