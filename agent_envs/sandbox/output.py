"""Turn an :class:`ExecResult` into the observation text the model sees (docs/protocol.md#output-framing).

Pure and backend-independent, so every sandbox frames output byte for byte like the reference:

* body = stdout, then ``"\\n[stderr]\\n" + stderr`` (just ``"[stderr]\\n" + stderr`` when stdout is
  empty); an empty body becomes ``Bash exited with code N and no output.``;
* ``translate_newlines`` turns ``\\r\\n`` and ``\\r`` into ``\\n`` (a runner that read its pipes in
  text mode), otherwise they are kept (a sandbox that decoded bytes);
* ``rstrip`` strips trailing whitespace before ``"\\n[exit_code] N"``;
* truncation: ``exact_limit`` keeps floor((limit-19)/2) + marker + ceil((limit-19)/2) characters
  (exactly ``limit``), otherwise floor(limit/2) on each side of the marker.

"Bash" in the no-output and timeout texts is the framing's ``label`` (the tool's name).

Huge streams arrive as head/tail windows (``*_dropped > 0``).  Such a text is far longer than
the limit, so only its first and last few thousand characters matter; they are taken from the
windows and the result equals what capturing everything would have given.  ``rstrip`` of a
windowed stream uses the capture's own view of the stream without its trailing whitespace
(``*_stripped``), because the blanks can fill the whole tail window.
"""

from __future__ import annotations

from agent_envs.core.spec import Framing
from agent_envs.sandbox.base import ExecResult

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

    def __init__(self, head: str, tail: str | None = None, stripped: "_Text | None" = None) -> None:
        self.head = head
        self.tail = tail  # None: the text is exactly ``head``
        self.stripped = stripped  # this text without its trailing whitespace, when known apart

    @classmethod
    def of_stream(
        cls, data: bytes, dropped: int, newlines: bool, stripped: tuple[bytes | None, int] = (None, 0)
    ) -> "_Text":
        """``newlines``: translate CR and CRLF to LF, as a text-mode pipe does.  ``stripped``: the
        stream without its trailing whitespace, ``(data, dropped)`` (data None: not captured)."""
        if dropped <= 0:
            return cls(_decode(data, newlines))
        half = len(data) // 2
        rest = None if stripped[0] is None else cls.of_stream(stripped[0], stripped[1], newlines)
        return cls(_decode(data[:half], newlines), _decode(data[half:], newlines)[_RESYNC_CHARS:], rest)

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
        if self.stripped is not None:
            return self.stripped.rstrip()
        return _Text(self.head, self.tail.rstrip())

    def first(self, n: int) -> str:
        return self.head[:n]

    def last(self, n: int) -> str:
        src = self.head if self.tail is None else self.tail
        return src[len(src) - n :] if n > 0 else ""

    def whole_if_short(self, limit: int) -> str | None:
        return self.head if self.tail is None and len(self.head) <= limit else None


def truncate(text: _Text, framing: Framing, limit: int) -> str:
    short = text.whole_if_short(limit)
    if short is not None:
        return short
    if framing.exact_limit:
        keep = max(limit - len(MARKER), 0)
        first, last = keep // 2, keep - keep // 2
    else:
        first = last = limit // 2
    return text.first(first) + MARKER + text.last(last)


def timeout_text(timeout_s: float, label: str = "Bash") -> str:
    return f"{label} timed out after {timeout_s:.1f}s."


def format_observation(result: ExecResult, framing: Framing, limit: int = 6000) -> str:
    """The tool observation body (without the ``Observation from <tool>:`` header)."""
    if not isinstance(framing, Framing):
        raise ValueError(f"unknown observation style {framing!r}: format_observation needs a Framing")
    if result.launch_error is not None:
        return truncate(_Text(LAUNCH_ERROR_PREFIX + result.launch_error), framing, limit)
    if result.timed_out:
        return truncate(_Text(timeout_text(result.timeout_s or 0.0, framing.label)), framing, limit)
    newlines = framing.translate_newlines
    out = _Text.of_stream(
        result.stdout, result.stdout_dropped, newlines, (result.stdout_stripped, result.stdout_stripped_dropped)
    )
    err = _Text.of_stream(
        result.stderr, result.stderr_dropped, newlines, (result.stderr_stripped, result.stderr_stripped_dropped)
    )
    if out.empty() and err.empty():
        return truncate(_Text(f"{framing.label} exited with code {result.returncode} and no output."), framing, limit)
    separator = "[stderr]\n" if out.empty() else "\n[stderr]\n"
    if err.empty():
        body = out.rstrip() if framing.rstrip else out
    elif framing.rstrip and err.rstrip().empty():  # the blanks end inside the separator
        body = out + _Text(separator.rstrip())
    else:
        body = out + _Text(separator) + (err.rstrip() if framing.rstrip else err)
    return truncate(body + _Text(f"\n[exit_code] {result.returncode}"), framing, limit)
