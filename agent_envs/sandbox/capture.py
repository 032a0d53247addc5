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

    def on_ready(self) -> bool | None: ...


class StreamReader:
    """Reads one pipe into a :class:`Window`; finishes at EOF.

    There is no in-band end marker: code under test can write any bytes, so the end of a call is
    told by the driver's state instead, and then :meth:`read_available` takes what is left.
    """

    def __init__(self, fd: int, keep: int) -> None:
        self.fd = fd
        self.window = Window(keep)
        self.done = False
        self.eof = False

    def fileno(self) -> int:
        return self.fd

    def on_ready(self) -> bool:
        """Read once; False when nothing was there (the pipe must be non-blocking then)."""
        try:
            data = os.read(self.fd, CHUNK)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            data = b""
        if not data:
            self.done = self.eof = True
            return False
        self.window.feed(data)
        return True

    def read_available(self) -> None:
        """Everything already in the (non-blocking) pipe: once its writers are idle, the rest of
        the call's output."""
        while not self.done and self.on_ready():
            pass


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


def settle(sources: list[Source], until: Callable[[], bool], deadline: float,
           writer: PendingWrite | None = None, pending: Callable[[], bool] = lambda: True) -> bool:
    """:func:`pump` for a condition no pipe announces (a driver that has written its status line
    and is about to block on its next read): ``until()`` is asked whenever ``pending()`` holds
    (``until()`` must imply it), every few milliseconds.  False when ``deadline`` passed first."""
    wait = 0.0001
    while True:
        if not pending():
            wait = 0.0001
            pump(sources, pending, deadline, writer)  # back here as soon as pending() turns true
        elif until():
            return True
        elif wait < 0.001:  # the driver is usually there within microseconds: look again soon
            time.sleep(wait)
            wait *= 2
        else:
            if pump(sources, until, min(deadline, time.monotonic() + wait), writer):
                return True
            wait = min(wait * 2, 0.05)
        if time.monotonic() >= deadline:
            return until()


def drain(out: StreamReader, err: StreamReader, deadline: float) -> bool:
    """Serve a command's two output streams until both end; False when ``deadline`` passed first."""
    return pump([out, err], lambda: out.done and err.done, deadline)


def captured(out: StreamReader, err: StreamReader) -> dict[str, Any]:
    """The ``ExecResult`` fields holding what the two streams captured."""
    return {"stdout": out.window.data(), "stderr": err.window.data(),
            "stdout_dropped": out.window.dropped, "stderr_dropped": err.window.dropped}
