"""Atomic file replacement, so that a run killed mid-write never leaves a half-written file.

Writes go straight to the file descriptor (no user-space buffer), so a full disk raises once, at
the write that hit it, with the file named, and never again while closing.  Every file gets the
mode ``open()`` would give it (0666 less the umask), so the files of one run share one mode.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable


def write_all(fd: int, data: bytes, path: str | os.PathLike[str]) -> None:
    """``os.write`` until every byte of ``data`` is written; an OSError names ``path``."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None


def umask() -> int:
    """The process's umask, read without changing it (``os.umask`` can only set it, which would
    race with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: the one way left
    os.umask(mask)
    return mask


def write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Create or truncate ``path`` and write ``data`` (not atomic: for many small files)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        write_all(fd, data, path)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to a temporary file beside ``path``, fsync it, then rename it over ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        try:
            os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes it 0600
            for chunk in chunks:
                write_all(fd, chunk, target)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
