"""Observation framing (docs/protocol.md#output-framing), including head/tail windows of huge streams."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_envs.sandbox.capture import Window
from agent_envs.sandbox.base import ExecResult
from protocol_specs import format_observation

MARK = "\n...[truncated]...\n"


def R(out: bytes = b"", err: bytes = b"", rc: int = 0, **kw) -> ExecResult:
    return ExecResult(returncode=rc, stdout=out, stderr=err, **kw)


@pytest.mark.parametrize("style", ["docvqa", "math"])
def test_stderr_only_and_empty(style):
    assert format_observation(R(b"", b"err\n", 3), style) == (
        "[stderr]\nerr\n[exit_code] 3" if style == "docvqa" else "[stderr]\nerr\n\n[exit_code] 3")
    assert format_observation(R(rc=0), style) == "Bash exited with code 0 and no output."


def test_docvqa_strips_math_keeps_trailing_newline():
    assert format_observation(R(b"hi\n  \n"), "docvqa") == "hi\n[exit_code] 0"
    assert format_observation(R(b"hi\n"), "math") == "hi\n\n[exit_code] 0"
    assert format_observation(R(b"a", b"b"), "math") == "a\n[stderr]\nb\n[exit_code] 0"
    assert format_observation(R(b"   "), "docvqa") == "\n[exit_code] 0"


def test_timeout_and_launch_error_texts():
    assert format_observation(R(rc=124, timed_out=True, timeout_s=20), "docvqa") == "Bash timed out after 20.0s."
    assert format_observation(R(rc=124, timed_out=True, timeout_s=1.25), "math") == "Bash timed out after 1.2s."
    res = R(rc=126, launch_error="embedded null byte")
    assert format_observation(res, "docvqa") == "[ERROR] Failed to execute command: embedded null byte"


def test_truncation_lengths():
    out = format_observation(R(b"x" * 200), "docvqa", 80)
    assert len(out) == 80 and MARK in out and out.startswith("x" * 30) and out.endswith("[exit_code] 0")
    out = format_observation(R(b"x" * 200), "math", 80)
    assert len(out) == 80 + 19 and out.startswith("x" * 40 + MARK)
    odd = format_observation(R(b"x" * 200), "docvqa", 81)  # 62 kept: 31 + 31
    assert odd == "x" * 31 + MARK + "x" * 17 + "\n[exit_code] 0"


def test_math_turns_cr_and_crlf_into_newlines_docvqa_keeps_them():
    """The reference math runner read its pipes in text mode; the DocVQA sandbox decoded bytes."""
    res = R(b"a\r\nb\rc\n", b"e\r\n")
    assert format_observation(res, "math") == "a\nb\nc\n\n[stderr]\ne\n\n[exit_code] 0"
    assert format_observation(res, "docvqa") == "a\r\nb\rc\n\n[stderr]\ne\n[exit_code] 0"


def test_bytes_decode_with_replacement():
    assert format_observation(R(b"\xff\x00ok"), "docvqa") == "\ufffd\x00ok\n[exit_code] 0"


def test_unknown_style_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown observation style"):
        format_observation(R(b"x"), "html")  # type: ignore[arg-type]


def _windowed(data: bytes, keep: int) -> tuple[bytes, int]:
    w = Window(keep)
    for i in range(0, len(data), 7919):
        w.feed(data[i:i + 7919])
    return w.data(), w.dropped


_chunks = st.lists(st.sampled_from(["a", "é", "€", "\n", "\r", "\r\n", " ", "\U0001f600", "\ufffd"]), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(out_unit=_chunks, err_unit=_chunks, out_reps=st.integers(0, 900), err_reps=st.integers(0, 900),
       junk=st.binary(max_size=8), style=st.sampled_from(["docvqa", "math"]), rc=st.integers(0, 255))
def test_windows_equal_full_capture(out_unit, err_unit, out_reps, err_reps, junk, style, rc):
    """Head/tail windows frame exactly like the whole stream would (keep >= 4 * limit)."""
    limit, keep = 600, 4096
    out = ("".join(out_unit) * out_reps).encode() + junk
    err = junk + ("".join(err_unit) * err_reps).encode()
    full = format_observation(R(out, err, rc), style, limit)
    (o, od), (e, ed) = _windowed(out, keep), _windowed(err, keep)
    assert format_observation(R(o, e, rc, stdout_dropped=od, stderr_dropped=ed), style, limit) == full


def test_window_keeps_ends_and_counts_dropped():
    data = bytes(range(256)) * 1000
    kept, dropped = _windowed(data, 1000)
    assert kept == data[:1000] + data[-1000:] and dropped == len(data) - 2000
    assert math.isclose(len(kept) / 2, 1000)
