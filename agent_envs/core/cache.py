"""Cache folders built once and never seen half-written, whatever runs at the same time.

The package materialises a few folders on first use (the embedded model converted from its GGUF
file, the synthetic DocVQA pages).  Two processes often ask for one at the same moment (the main
job starts several evaluations at once), and a process can be killed while it builds.  One rule
for all of them, :func:`build_once`:

* a folder is finished when it holds the marker file :data:`MARKER`, which is written last,
  after everything else, and only then is the folder renamed into place: a folder without it
  (an older layout, a copy interrupted by hand) is never taken as finished;
* one builder at a time: an exclusive ``flock`` on ``<target>.lock`` beside the folder; the others
  wait for it and then find the folder finished (a lock is released when its process dies, so a
  killed builder never blocks the next one);
* the build happens in a staging sibling (``.<name>.*.partial``) renamed over the target; should
  the target be finished by someone who did not take the lock, that counts as success.  Staging
  folders left by killed builders are removed by the next builder, under the lock.

Single files use :func:`agent_envs.core.atomic.atomic_write` (a temporary file renamed into place).
Shell scripts that build a cached file follow the same lock-file convention (``docker/debian_base.sh``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

#: written last into a finished folder; its absence means "not finished"
MARKER = ".agent-envs-complete"


def is_complete(folder: str | os.PathLike[str]) -> bool:
    return (Path(folder) / MARKER).is_file()


def build_once(target: str | os.PathLike[str], build: Callable[[Path], object], *, mode: int = 0o755) -> bool:
    """Make sure ``target`` is a finished folder, calling ``build(staging)`` to fill a fresh staging
    folder when it is not (what it returns is ignored).  Returns True when this call built it, False when it was already there
    (or another process finished it first).  ``mode`` is the folder's permission bits (the
    sandbox's unprivileged user reads the synthetic pages, so 0o755 rather than mkdtemp's 0o700).
    An exception from ``build`` propagates and leaves neither a target nor a staging folder.
    """
    target = Path(target)
    if is_complete(target):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.with_name(target.name + ".lock")) as locked:
        if is_complete(target):
            return False
        if locked:
            _remove_stale_staging(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
        try:
            staging.chmod(mode)
            build(staging)
            (staging / MARKER).write_bytes(b"")
            return _move_into_place(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[bool]:
    """Hold an exclusive lock on ``lock_path``; yields False where the file system has no locks
    (then the rename rule alone keeps the folder whole, at the cost of building it twice)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def _remove_stale_staging(target: Path) -> None:
    """Staging folders of builders that died: under the lock no other builder is running."""
    for stale in target.parent.glob(f".{target.name}.*.partial"):
        shutil.rmtree(stale, ignore_errors=True)


def _move_into_place(staging: Path, target: Path) -> bool:
    try:
        staging.rename(target)  # atomic; succeeds onto a missing or empty folder
        return True
    except OSError:
        if is_complete(target):  # someone else finished first: theirs is as good as ours
            return False
    # an unfinished folder is in the way (an older layout, a hand-made copy): set it aside, then swap
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    target.rename(aside / "old")
    staging.rename(target)
    shutil.rmtree(aside, ignore_errors=True)
    return True
