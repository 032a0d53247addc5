"""Turn an :class:`ExecResult` into the observation text the model sees (docs/protocol.md#output-framing).

Pure and backend-independent, so every sandbox frames output byte for byte like the reference:

* body = stdout, then ``"\\n[stderr]\\n" + stderr`` (just ``"[stderr]\\n" + stderr`` when stdout is
  empty); an empty body becomes ``Bash exited with code N and no output.``;
* ``math`` turns ``\\r\\n`` and ``\\r`` into ``\\n`` (the reference math runner read its pipes in
  text mode), ``docvqa`` keeps them (the reference DocVQA sandbox decoded bytes);
* ``docvqa`` strips trailing whitespace before ``"\\n[exit_code] N"``, ``math`` does not;
* truncation: ``docvqa`` keeps floor((limit-19)/2) + marker + ceil((limit-19)/2) characters
  (exactly ``limit``), ``math`` keeps floor(limit/2) on each side of the marker.

Huge streams arrive as head/tail windows (``*_dropped > 0``).  Such a text is far longer than
the limit, so only its first and last few thousand characters matter; they are taken from the
windows and the result equals what capturing everything would have given.
"""
from __future__ import annotations

from typing import Literal

from agent_envs.sandbox.base import ExecResult

Style = Literal["docvqa", "math"]
MARKER = "\n...[truncated]...\n"
LAUNCH_ERROR_PREFIX = "[ERROR] Failed to execute command: "
#: characters dropped from the start of a decoded tail window: a window may begin inside a
#: UTF-8 sequence, and the decoder resynchronises within three bytes
_RESYNC_CHARS = 4


def _decode(data: bytes, newlines: bool) -> str:
    text = data.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n") if newlines else text


class _Text:
    """A text known completely, or only by a prefix and a suffix around a dropped middle."""

    def __init__(self, head: str, tail: str | None = None) -> None:
        self.head = head
        self.tail = tail  # None: the text is exactly ``head``

    @classmethod
    def of_stream(cls, data: bytes, dropped: int, newlines: bool) -> "_Text":
        """``newlines``: translate CR and CRLF to LF, as a text-mode pipe does."""
        if dropped <= 0:
            return cls(_decode(data, newlines))
        half = len(data) // 2
        return cls(_decode(data[:half], newlines), _decode(data[half:], newlines)[_RESYNC_CHARS:])

    def __add__(self, other: "_Text") -> "_Text":
        if self.tail is None and other.tail is None:
            return _Text(self.head + other.head)
        if self.tail is None:
            return _Text(self.head + other.head, other.tail)
        if other.tail is not None:
            return _Text(self.head, other.tail)
        return _Text(self.head, self.tail + other.head)

    def empty(self) -> bool:
        return self.tail is None and not self.head

    def rstrip(self) -> "_Text":
        if self.tail is None:
            return _Text(self.head.rstrip())
        return _Text(self.head, self.tail.rstrip())

    def first(self, n: int) -> str:
        return self.head[:n]

    def last(self, n: int) -> str:
        src = self.head if self.tail is None else self.tail
        return src[len(src) - n:] if n > 0 else ""

    def whole_if_short(self, limit: int) -> str | None:
        return self.head if self.tail is None and len(self.head) <= limit else None


def truncate(text: _Text, style: Style, limit: int) -> str:
    short = text.whole_if_short(limit)
    if short is not None:
        return short
    if style == "docvqa":
        keep = max(limit - len(MARKER), 0)
        first, last = keep // 2, keep - keep // 2
    else:
        first = last = limit // 2
    return text.first(first) + MARKER + text.last(last)


def timeout_text(timeout_s: float) -> str:
    return f"Bash timed out after {timeout_s:.1f}s."


def format_observation(result: ExecResult, style: Style, limit: int = 6000) -> str:
    """The tool observation body (without the ``Observation from bash:`` header)."""
    if style not in ("docvqa", "math"):
        raise ValueError(f"unknown observation style {style!r}; expected 'docvqa' or 'math'")
    if result.launch_error is not None:
        return truncate(_Text(LAUNCH_ERROR_PREFIX + result.launch_error), style, limit)
    if result.timed_out:
        return truncate(_Text(timeout_text(result.timeout_s or 0.0)), style, limit)
    newlines = style == "math"
    body = _Text.of_stream(result.stdout, result.stdout_dropped, newlines)
    err = _Text.of_stream(result.stderr, result.stderr_dropped, newlines)
    if not err.empty():
        body = body + _Text("[stderr]\n" if body.empty() else "\n[stderr]\n") + err
    if body.empty():
        return truncate(_Text(f"Bash exited with code {result.returncode} and no output."), style, limit)
    if style == "docvqa":
        body = body.rstrip()
    return truncate(body + _Text(f"\n[exit_code] {result.returncode}"), style, limit)
