"""``--resume``: pick up a records file where a previous run stopped (docs/protocol.md#resume).

* Rows whose ``error`` is set (request or environment failures) are archived to
  ``<stem>.request_errors.jsonl`` and their keys run again.
* For duplicate keys the last successful row wins.
* A truncated last line (the previous run was SIGKILLed mid-write) is dropped.

The records file is then rewritten atomically with exactly one row per finished key, so the
run that follows can append to a clean file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .records import EpisodeRecord, JsonlWriter, read_jsonl, write_jsonl

Row = dict[str, Any]


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
        return (f"ResumeState(finished={len(self.finished)}, archived_errors={self.archived}, "
                f"dropped_lines={self.dropped_lines})")


def prepare_resume(records_path: str | os.PathLike[str]) -> ResumeState:
    """Compact ``records_path`` in place and return what is already done."""
    path = Path(records_path)
    if not path.exists():
        return ResumeState({}, 0, 0)
    rows, dropped = read_jsonl(path)
    finished: dict[str, Row] = {}
    errors: list[Row] = []
    for row in rows:
        if "key" not in row:
            dropped += 1
        elif row.get("error"):
            errors.append(row)
        else:
            finished.pop(row["key"], None)  # re-insert so file order follows the winning row
            finished[row["key"]] = row
    if errors:
        with JsonlWriter(archive_path(path)) as archive:
            for row in errors:
                archive.write(row)
    write_jsonl(path, finished.values())
    records = {k: EpisodeRecord.model_validate(v) for k, v in finished.items()}
    return ResumeState(records, len(errors), dropped)
