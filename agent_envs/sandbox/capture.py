"""Streaming capture shared by the sandboxes and the tools that drive sandboxed processes: bounded
memory whatever a command prints.

A :class:`Window` keeps the first and last ``keep`` bytes of a stream and counts what fell in
between, so ``yes`` or ``cat /dev/urandom`` for 20 s costs 2*keep bytes, not gigabytes.
:func:`pump` multiplexes several pipe ends (and an optional pending write) with ``poll`` until a
condition holds or a deadline passes; there are no helper threads.
"""
from __future__ import annotations

import errno
import os
import select
import time
from typing import Any, Callable, Protocol

CHUNK = 65536


class Window:
    """First and last ``keep`` bytes of a stream (see ``ExecResult`` for the layout)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - self.keep
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def data(self) -> bytes:
        return bytes(self.head + self.tail)


class Source(Protocol):
    done: bool

    def fileno(self) -> int: ...

    def on_ready(self) -> None: ...


class StreamReader:
    """Reads one pipe into a :class:`Window`; finishes at EOF or at an in-band ``marker``."""

    def __init__(self, fd: int, keep: int, marker: bytes | None = None) -> None:
        self.fd = fd
        self.window = Window(keep)
        self.marker = marker
        self.carry = b""
        self.done = False
        self.eof = False

    def fileno(self) -> int:
        return self.fd

    def on_ready(self) -> None:
        try:
            data = os.read(self.fd, CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            data = b""
        if not data:
            self.window.feed(self.carry)
            self.carry = b""
            self.done = self.eof = True
            return
        if self.marker is None:
            self.window.feed(data)
            return
        buf = self.carry + data
        at = buf.find(self.marker)
        if at >= 0:
            self.window.feed(buf[:at])
            self.carry = b""
            self.done = True
            return
        keep = len(self.marker) - 1
        self.window.feed(buf[:-keep])
        self.carry = buf[-keep:]


class PendingWrite:
    """Bytes still to be written to a non-blocking pipe end (a command larger than the pipe)."""

    def __init__(self, fd: int, data: bytes) -> None:
        self.fd = fd
        self.view = memoryview(data)
        self.broken = False

    @property
    def done(self) -> bool:
        return self.broken or not self.view

    def on_ready(self) -> None:
        try:
            n = os.write(self.fd, self.view[:CHUNK])
        except BlockingIOError:
            return
        except BrokenPipeError:
            self.broken = True
            return
        self.view = self.view[n:]


def pump(sources: list[Source], until: Callable[[], bool], deadline: float,
         writer: PendingWrite | None = None) -> bool:
    """Serve ``sources`` (and ``writer``) until ``until()``; False when ``deadline`` passed first."""
    poller = select.poll()
    registered: dict[int, object] = {}
    while True:
        if until():
            return True
        wanted: dict[int, object] = {s.fileno(): s for s in sources if not s.done}
        if writer is not None and not writer.done:
            wanted[writer.fd] = writer
        for fd in set(registered) - set(wanted):
            poller.unregister(fd)
        for fd in set(wanted) - set(registered):
            poller.register(fd, select.POLLOUT if wanted[fd] is writer else select.POLLIN)
        registered = wanted
        wait = deadline - time.monotonic()
        if wait <= 0 or not registered:
            return until()
        for fd, _ in poller.poll(wait * 1000):
            registered[fd].on_ready()  # type: ignore[attr-defined]


def drain(out: StreamReader, err: StreamReader, deadline: float) -> bool:
    """Serve a command's two output streams until both end; False when ``deadline`` passed first."""
    return pump([out, err], lambda: out.done and err.done, deadline)


def captured(out: StreamReader, err: StreamReader) -> dict[str, Any]:
    """The ``ExecResult`` fields holding what the two streams captured."""
    return {"stdout": out.window.data(), "stderr": err.window.data(),
            "stdout_dropped": out.window.dropped, "stderr_dropped": err.window.dropped}
