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
import re
import select
import time
from typing import Any, Callable, Protocol

CHUNK = 65536
#: every character ``str.rstrip()`` removes (``str.isspace``), as UTF-8
SPACE_CHARS = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)
_ASCII_SPACES = bytes(c.encode()[0] for c in SPACE_CHARS if len(c.encode()) == 1)
_WIDE_SPACES = tuple(c.encode() for c in SPACE_CHARS if len(c.encode()) > 1)
#: a run of whitespace characters read backwards (on the reversed bytes, so it is linear): runs of
#: ASCII blanks first, then each multi-byte space reversed
_SPACE_RUN_REVERSED = re.compile(
    b"(?:[" + re.escape(_ASCII_SPACES) + b"]+|" + b"|".join(re.escape(w[::-1]) for w in _WIDE_SPACES) + b")+"
)
_WIDE_LAST_BYTES = frozenset(w[-1] for w in _WIDE_SPACES)
_SPACE_LAST_BYTES = frozenset(_ASCII_SPACES) | _WIDE_LAST_BYTES


def space_suffix(data: bytes) -> int:
    """Bytes of the trailing whitespace of ``data`` (decoded as UTF-8 with replacement, exactly
    what ``rstrip`` would remove).  ``data`` must not end inside a character."""
    if not data or data[-1] not in _SPACE_LAST_BYTES:
        return 0
    window = data[-256:]  # ASCII blanks, the common case: a short run, or a chunk of nothing else
    kept = len(window.rstrip(_ASCII_SPACES))
    if kept:
        kept += len(data) - len(window)
    elif data.translate(None, _ASCII_SPACES):
        kept = len(data.rstrip(_ASCII_SPACES))
    if not kept or data[kept - 1] not in _WIDE_LAST_BYTES:
        return len(data) - kept
    match = _SPACE_RUN_REVERSED.match(data[::-1])
    return match.end() if match else 0


def incomplete_suffix(data: bytes) -> int:
    """Bytes at the end of ``data`` that start a UTF-8 character without finishing it (0-3)."""
    for k in range(1, min(3, len(data)) + 1):
        byte = data[-k]
        if 0x80 <= byte < 0xC0:  # a continuation byte: look further back
            continue
        need = 2 if 0xC2 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else 4 if 0xF0 <= byte < 0xF5 else 0
        return k if need > k else 0
    return 0


class Window:
    """First and last ``keep`` bytes of a stream (see ``ExecResult`` for the layout), and the same
    for the stream without its trailing whitespace (:meth:`stripped`).

    A stream can end in more whitespace than a window holds (``x`` * 200000 then 100000 spaces):
    the tail window is then all blanks, and what ``rstrip`` of the whole stream ends with is gone.
    So the window also tracks the trailing whitespace run (whole characters: bytes that may start
    an unfinished character wait in ``pending``) and keeps the last ``keep`` bytes before it as
    soon as the tail window is about to lose them.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0
        self.pending = b""
        #: bytes fed to head/tail, and the length of their trailing whitespace
        self.total = 0
        self.space = 0
        #: the last ``keep`` bytes before that whitespace, once the tail window no longer holds them
        self.before_space: bytes | None = None

    def feed(self, data: bytes) -> None:
        if self.pending:
            data = self.pending + data
        cut = len(data) - incomplete_suffix(data)
        self.pending = data[cut:]
        self._absorb(data if cut == len(data) else data[:cut])

    def finish(self) -> None:
        """The stream ended: an unfinished character is a character (U+FFFD) after all."""
        pending, self.pending = self.pending, b""
        self._absorb(pending)

    def _absorb(self, data: bytes) -> None:
        if not data:
            return
        run = space_suffix(data)
        if run < len(data):  # the content now ends inside this chunk
            self.space, self.before_space = run, None
        else:
            self.space += run
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - self.keep
        if excess > 0:
            if self.space and self.before_space is None:
                self.before_space = self._known_before(self.total - self.space)
            del self.tail[:excess]
            self.dropped += excess

    def _known_before(self, end: int) -> bytes:
        """The ``keep`` stream bytes before offset ``end`` (fewer near the start), from head and tail."""
        if self.dropped == 0:  # head + tail is the whole stream so far
            known, offset = self.head + self.tail, 0
        else:
            known, offset = self.tail, self.total - len(self.tail)
        return bytes(known[max(0, end - self.keep) - offset : end - offset])

    def data(self) -> bytes:
        self.finish()
        return bytes(self.head + self.tail)

    def stripped(self) -> tuple[bytes, int]:
        """``(data, dropped)`` of the stream without its trailing whitespace, in the same layout."""
        self.finish()
        length = self.total - self.space
        if self.dropped == 0:
            return bytes((self.head + self.tail)[:length]), 0
        if length <= self.keep:
            return bytes(self.head[:length]), 0
        before = self.before_space if self.space else bytes(self.tail)
        assert before is not None and len(before) == self.keep, "the window lost the bytes before its whitespace"
        if length <= 2 * self.keep:
            return bytes(self.head) + before[2 * self.keep - length :], 0
        return bytes(self.head) + before, length - 2 * self.keep


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


def pump(sources: list[Source], until: Callable[[], bool], deadline: float, writer: PendingWrite | None = None) -> bool:
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


def settle(
    sources: list[Source],
    until: Callable[[], bool],
    deadline: float,
    writer: PendingWrite | None = None,
    pending: Callable[[], bool] = lambda: True,
) -> bool:
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


def window_fields(window: Window, name: str) -> dict[str, Any]:
    """The ``ExecResult`` fields of one stream (``name``: ``stdout`` or ``stderr``)."""
    window.finish()
    fields: dict[str, Any] = {name: window.data(), f"{name}_dropped": window.dropped}
    if window.dropped:
        fields[f"{name}_stripped"], fields[f"{name}_stripped_dropped"] = window.stripped()
    return fields


def captured(out: StreamReader, err: StreamReader) -> dict[str, Any]:
    """The ``ExecResult`` fields holding what the two streams captured."""
    return {**window_fields(out.window, "stdout"), **window_fields(err.window, "stderr")}
