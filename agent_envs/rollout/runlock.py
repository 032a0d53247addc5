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
import time
from pathlib import Path

LOCK_NAME = ".lock"


class RunFolderBusy(RuntimeError):
    """Another process writes into the run folder; the message names it."""


class RunLock:
    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd = -1

    def acquire(self) -> "RunLock":
        """Take the lock, or raise :class:`RunFolderBusy` naming its holder."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
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

    def release(self) -> None:
        """Drop the lock (the file stays: removing it could race with a writer taking it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(fd: int) -> str:
    """``pid N on host H, started T`` from the lock file, as far as it can be read."""
    try:
        stamp = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {stamp['pid']} on host {stamp['host']}, started {stamp['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its pid is not recorded yet"
