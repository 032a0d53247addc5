"""One writer per run folder: ``<run>/.lock``, held with ``flock`` while an eval writes there.

The kernel drops the lock when its holder dies, however it dies (``SIGKILL`` included), so a
killed run never leaves a stale lock behind; the file keeps the holder's pid, host and start time
for the error a second writer gets (docs/reliability.md#run-folders).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

LOCK_NAME = ".lock"


#: how much of each field of a holder's stamp an error shows (the file is anyone's text)
SHOWN_CHARS = 64


class RunLockError(RuntimeError):
    """The run folder's lock cannot be taken; the message says why and what to do."""


class RunFolderBusy(RunLockError):
    """Another process writes into the run folder; the message names it."""


class RunLock:
    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd = -1

    def acquire(self) -> "RunLock":
        """Take the lock, or raise :class:`RunFolderBusy` naming its holder, or :class:`RunLockError`
        when the lock's path is not a plain file (a symlink is never followed: the stamp written
        below would truncate and rewrite its target)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO must not block
        try:
            fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            raise self._unusable(exc.strerror or str(exc)) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise self._unusable(None)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunFolderBusy(
                f"{self.path.parent} is in use by another eval ({holder}); wait for it to "
                "finish, or choose another --out"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        stamp = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(stamp) + "\n").encode(), 0)
        self._fd = fd
        return self

    def _unusable(self, reason: str | None) -> RunLockError:
        """What stands in the lock's place (or why it cannot be opened), and the fix."""
        try:
            mode = os.lstat(self.path).st_mode
        except OSError:
            mode = 0
        kind = next((name for test, name in _KINDS if test(mode)), None)
        why = f"it is a {kind}, not a plain file" if kind else (reason or "it is not a plain file")
        return RunLockError(f"{self.path} cannot be the run lock: {why}; remove it, or choose another --out")

    def release(self) -> None:
        """Drop the lock (the file stays: removing it could race with a writer taking it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


#: what can stand where the lock file should be, named for the error
_KINDS = (
    (stat.S_ISLNK, "symbolic link"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


def _holder(fd: int) -> str:
    """``pid N on host H, started T`` from the lock file, as far as it can be read; each field
    printable and at most :data:`SHOWN_CHARS` long (another process wrote it)."""
    try:
        stamp = json.loads(os.pread(fd, 4096, 0) or b"{}")
        pid, host, started = (_shown(stamp[k]) for k in ("pid", "host", "started"))
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid is not recorded yet"
    return f"pid {pid} on host {host}, started {started}"


def _shown(value: object) -> str:
    text = "".join(c if c.isprintable() else "?" for c in str(value)[: SHOWN_CHARS + 1])
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."
