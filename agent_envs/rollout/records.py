"""Episode records and the crash-safe JSONL writer.

One record per finished episode.  It is the environment's ``info["record"]`` row (protocol
docs/protocol.md#records) plus what only the runner knows: true per-episode wall time, the number of policy
calls, summed usage and which engine answered.  Each line is flushed and fsynced as soon as its
episode ends, so a killed run loses at most the line being written (see :mod:`.resume`).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.atomic import atomic_write, write_all

#: termination reasons that make a row an error row (ES ``error_count``; re-run on resume when
#: the row also carries ``error``)
ERROR_TERMINATIONS = frozenset({"request_error", "context_length_exceeded", "env_error"})


class EpisodeRecord(BaseModel):
    """One finished episode.  ``extra="allow"`` keeps every field the environment reports."""

    model_config = ConfigDict(extra="allow")

    key: str
    task_id: str
    row_index: int
    sample_index: int
    #: trajectory seed base (``base_seed + sample*1_000_003 + row``) and the run's base seed
    seed: int | None = None
    base_seed: int | None = None
    score: float = 0.0
    score_method: str | None = None
    score_status: str | None = None
    prediction: str = ""
    answer_status: str | None = None
    termination_reason: str | None = None
    react_error: str | None = None
    used_bash: bool = False
    #: policy calls this episode consumed
    turns: int = 0
    generated_tokens: int = 0
    trajectory_tokens: int = 0
    token_counts_exact: bool | None = None
    #: summed per-request usage: prompt_tokens, completion_tokens, total_tokens,
    #: accumulated_response_tokens
    usage: dict[str, int] | None = None
    react_steps: list[dict[str, Any]] = Field(default_factory=list)
    #: true wall time of this episode (reset to last step), not the batch's
    latency_s: float = 0.0
    tool_seconds: float | None = None
    #: per turn (absent in older records): ``turn_log`` rows {turn, seed, tokens, prompt_tokens,
    #: finish_reason, decision}; sandbox and policy-call wall seconds, one entry per turn
    turn_log: list[dict[str, Any]] | None = None
    turn_tool_s: list[float] | None = None
    turn_generation_s: list[float] | None = None
    engine: str | None = None
    endpoint: str | None = None
    model: str | None = None
    policy: str | None = None
    env_id: str | None = None
    env_config_hash: str | None = None
    #: ``"<ExcType>: <message>"`` when the episode failed for a reason outside the protocol
    #: (policy request or environment failure); such rows are re-run by ``--resume``
    error: str | None = None
    tags: dict[str, Any] = Field(default_factory=dict)
    trace_log: str | None = None

    @property
    def failed(self) -> bool:
        return bool(self.error)

    def row(self) -> dict[str, Any]:
        """Plain dict including extra fields (what metrics and trace logs read)."""
        return self.model_dump(mode="json")


def as_row(record: EpisodeRecord | dict[str, Any]) -> dict[str, Any]:
    return record.row() if isinstance(record, EpisodeRecord) else record


def dumps_line(row: dict[str, Any]) -> bytes:
    """One JSONL line.  Unpaired surrogates become JSON ``\\udXXX`` escapes instead of raising."""
    text = json.dumps(row, ensure_ascii=False, allow_nan=False, default=str)
    return (text + "\n").encode("utf-8", "backslashreplace")


class JsonlWriter:
    """Append-only JSONL file; every line is durable before ``write`` returns.  Thread-safe.

    Unbuffered: a failed write (a full disk) raises once, there, and closing has nothing left to
    flush.  A line cut short by it reads back as the expected unreadable last line.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "ab", buffering=0)
        self._lock = threading.Lock()

    def write(self, record: EpisodeRecord | dict[str, Any]) -> None:
        line = dumps_line(as_row(record))
        with self._lock:
            write_all(self._fh.fileno(), line, self.path)
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[EpisodeRecord | dict[str, Any]]) -> None:
    """Atomically replace ``path`` with ``rows``."""
    atomic_write(path, (dumps_line(as_row(row)) for row in rows))


class NotARecordsFile(ValueError):
    """A records path that is not a regular file (a directory, or a FIFO that would block forever)."""


def open_records(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading, once it is known to be a regular file: opened without blocking
    and checked on the open descriptor, so a FIFO cannot hang the reader; :class:`NotARecordsFile`
    otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "directory" if stat.S_ISDIR(mode) else "FIFO" if stat.S_ISFIFO(mode) else "special file"
        raise NotARecordsFile(f"{path} is a {kind}, not a records file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _numbered_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """Each non-blank line's number in the file and its row (``None`` for one that is not a JSON object)."""
    with open_records(path) as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8", "replace"))
            except json.JSONDecodeError:
                yield number, None
                continue
            yield number, row if isinstance(row, dict) else None


def read_jsonl(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """Rows of a JSONL file and the number of unreadable lines skipped.

    A truncated last line (a run killed mid-write) is the expected unreadable line."""
    lines = list(_numbered_rows(path))
    rows = [row for _, row in lines if row is not None]
    return rows, len(lines) - len(rows)


class NotARecord(ValueError):
    """A row of a records file that is not a record; the message names the file, row and field."""


def load_records(path: str | os.PathLike[str]) -> list[EpisodeRecord]:
    """The records of a JSONL file; :class:`NotARecord` for a row that is not one (a field of
    the wrong type: ``score`` a string, ``turn_log`` not a list, ...), naming the line as an
    editor counts it (blank and unreadable lines included), so the user can find it."""
    records = []
    for number, row in _numbered_rows(path):
        if row is None:
            continue
        try:
            records.append(EpisodeRecord.model_validate(row))
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(map(str, first["loc"])) or "record"
            raise NotARecord(f"{path}: line {number} is not a record ({where}: {first['msg']})") from None
    return records
