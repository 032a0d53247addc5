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
  killed builder never blocks the next one).  A waiter says on stderr, once, what it waits for
  (the folder, the lock and the holder's pid, which the holder writes into the lock file) and gives
  up with :class:`BuildWaitTimeout` after ``wait_s`` (default :data:`WAIT_S`): a holder alive for
  that long is stuck, and waiting silently forever is the worst answer;
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
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

#: written last into a finished folder; its absence means "not finished"
MARKER = ".agent-envs-complete"
#: how long a process waits for another one's build before giving up (builds take seconds to minutes)
WAIT_S = 1800.0


def cache_root() -> Path:
    """Where every cached folder lives: ``$AGENT_ENVS_CACHE``, else ``~/.cache/agent-envs`` (docs/install.md#caches).
    Read at each call, so a process that sets the variable before building anything moves it all."""
    return Path(os.environ.get("AGENT_ENVS_CACHE") or Path.home() / ".cache" / "agent-envs").expanduser()


class BuildWaitTimeout(TimeoutError):
    """Another process held a cache folder's build lock for longer than the caller would wait."""


def is_complete(folder: str | os.PathLike[str]) -> bool:
    return (Path(folder) / MARKER).is_file()


def build_once(
    target: str | os.PathLike[str], build: Callable[[Path], object], *, mode: int = 0o755, wait_s: float = WAIT_S
) -> bool:
    """Make sure ``target`` is a finished folder, calling ``build(staging)`` to fill a fresh staging
    folder when it is not (what it returns is ignored).  Returns True when this call built it, False when it was already there
    (or another process finished it first).  ``mode`` is the folder's permission bits (the
    sandbox's unprivileged user reads the synthetic pages, so 0o755 rather than mkdtemp's 0o700).
    An exception from ``build`` propagates and leaves neither a target nor a staging folder.
    Raises :class:`BuildWaitTimeout` when another process holds the lock for more than ``wait_s``.
    """
    target = Path(target)
    if is_complete(target):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target, wait_s) as locked:
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
def _exclusive(target: Path, wait_s: float) -> Iterator[bool]:
    """Hold the exclusive lock of ``target``; yields False where the file system has no locks
    (then the rename rule alone keeps the folder whole, at the cost of building it twice).  The
    holder writes its pid into the lock file for waiters to name; O_NOFOLLOW, so that write never
    lands in a file a symlink points to."""
    lock_path = target.with_name(target.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        if not _wait_for_lock(fd, target, lock_path, wait_s):
            yield False
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def _wait_for_lock(fd: int, target: Path, lock_path: Path, wait_s: float) -> bool:
    """Take the lock at once, or say once what we wait for and poll until ``wait_s`` has passed
    (``flock`` itself has no deadline; a poll every second at most costs nothing beside a build).
    False where the file system has no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    except OSError:
        return False
    holder = _holder(fd)
    print(
        f"[agent-envs] waiting for {holder} to finish building {target} (lock {lock_path}); "
        f"giving up after {wait_s:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    deadline, pause = time.monotonic() + wait_s, 0.05
    while True:
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise BuildWaitTimeout(
                    f"{holder} has held {lock_path} for over {wait_s:.0f} s without finishing {target}; "
                    "if it is stuck, end it and try again"
                ) from None
        pause = min(2 * pause, 1.0)


def _holder(fd: int) -> str:
    """``process 1234`` from the lock file, or ``another process`` (only digits are trusted: the
    file is shared, and its text is never echoed)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return f"process {int(text)}" if text.isdigit() and len(text) < 12 else "another process"


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
