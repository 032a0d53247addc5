"""A run's folder, held by one writer from before anything is written in it to the end
(docs/reliability.md#run-folders).

:func:`run_folder` is what ``agent-envs eval`` does before it builds a policy, callable from Python:
the folder must be a writable directory, its lock is taken, an existing records file must be a
regular file, and records already there are kept only for a resumed run.  A run that fails before
writing anything leaves no folder holding only the lock behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Iterator

from .records import open_records
from .runlock import LOCK_NAME, RunLock

RECORDS_NAME = "records.jsonl"


class RunFolderError(ValueError):
    """The run folder cannot hold this run; the message names the folder and why."""


class FolderNotWritable(RunFolderError):
    """The folder, or a parent of it, is not a writable directory (message starts with the folder)."""


class RecordsExist(RunFolderError):
    """The folder already has records and the run is not resumed (message: the records path)."""


def default_run_dir(env_id: str) -> Path:
    """``runs/<env>-<YYYYmmdd-HHMMSS>``: where a run goes when no folder is named."""
    return Path("runs") / f"{env_id}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_writable(out: Path) -> None:
    """``out`` is, or can be made, a directory a file can be written in: checked before a
    (possibly slow) policy is built; :class:`FolderNotWritable` otherwise."""
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise FolderNotWritable(f"{out}: {blocker} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise FolderNotWritable(f"{out} is not a writable directory: {exc.strerror or exc}") from None


def drop_if_only_lock(out: Path, created: bool) -> None:
    """A run that failed before writing anything leaves no folder holding only ``.lock`` (the
    next command would take it for a run): the lock goes, and the folder when this run made it."""
    try:
        if [p.name for p in out.iterdir()] != [LOCK_NAME]:
            return
        (out / LOCK_NAME).unlink()
        if created:
            out.rmdir()
    except OSError:  # another writer got there meanwhile, or the folder is not ours to tidy
        pass


@contextlib.contextmanager
def run_folder(out: str | os.PathLike[str], *, resume: bool = False) -> Iterator[Path]:
    """Hold ``out`` as a run's folder for the ``with`` block and yield its records path.

    Raises :class:`FolderNotWritable`, :class:`~agent_envs.rollout.runlock.RunLockError` (another
    process writes there), :class:`~agent_envs.rollout.records.NotARecordsFile` (a directory or a
    FIFO where the records go: a traceback later, or a run blocked forever) or
    :class:`RecordsExist` (records there and ``resume`` is False).  On leaving, a folder holding
    only the lock is tidied away, then the lock is released."""
    out = Path(out)
    records = out / RECORDS_NAME
    created = not out.exists()
    check_writable(out)
    lock = RunLock(out).acquire()
    try:
        if records.exists():
            open_records(records).close()
        if records.exists() and records.stat().st_size and not resume:
            raise RecordsExist(str(records))
        yield records
    finally:
        drop_if_only_lock(out, created)  # while the lock is still held
        lock.release()
