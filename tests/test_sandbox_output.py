"""Observation framing (docs/protocol.md#output-framing), including head/tail windows of huge streams."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.sandbox.capture import SPACE_CHARS, Window, window_fields
from agent_envs.sandbox.base import ExecResult
from protocol_specs import format_observation

MARK = "\n...[truncated]...\n"


def R(out: bytes = b"", err: bytes = b"", rc: int = 0, **kw) -> ExecResult:
    return ExecResult(returncode=rc, stdout=out, stderr=err, **kw)


@pytest.mark.parametrize("style", ["docvqa", "math"])
def test_stderr_only_and_empty(style):
    assert format_observation(R(b"", b"err\n", 3), style) == (
        "[stderr]\nerr\n[exit_code] 3" if style == "docvqa" else "[stderr]\nerr\n\n[exit_code] 3"
    )
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


def _window(data: bytes, keep: int, step: int = 7919) -> Window:
    w = Window(keep)
    for i in range(0, len(data), step):
        w.feed(data[i : i + step])
    return w


def _windowed(data: bytes, keep: int) -> tuple[bytes, int]:
    w = _window(data, keep)
    return w.data(), w.dropped


def _captured(out: bytes, err: bytes, rc: int, keep: int, step: int = 7919) -> ExecResult:
    """What a sandbox returns for these streams: windows, and the windows of their stripped form."""
    return ExecResult(
        returncode=rc,
        **window_fields(_window(out, keep, step), "stdout"),
        **window_fields(_window(err, keep, step), "stderr"),
    )


_chunks = st.lists(
    st.sampled_from(["a", "é", "€", "\n", "\r", "\r\n", " ", "\U0001f600", "\ufffd"]), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(
    out_unit=_chunks,
    err_unit=_chunks,
    out_reps=st.integers(0, 900),
    err_reps=st.integers(0, 900),
    junk=st.binary(max_size=8),
    style=st.sampled_from(["docvqa", "math"]),
    rc=st.integers(0, 255),
)
def test_windows_equal_full_capture(out_unit, err_unit, out_reps, err_reps, junk, style, rc):
    """Head/tail windows frame exactly like the whole stream would (keep >= 4 * limit)."""
    limit, keep = 600, 4096
    out = ("".join(out_unit) * out_reps).encode() + junk
    err = junk + ("".join(err_unit) * err_reps).encode()
    full = format_observation(R(out, err, rc), style, limit)
    assert format_observation(_captured(out, err, rc, keep), style, limit) == full


_blanks = st.lists(
    st.sampled_from([" ", "\n", "\t", "\r\n", "\u3000", "\xa0", "\u2003", "\x1c"]), min_size=1, max_size=6
)


@settings(max_examples=60, deadline=None)
@given(
    out_unit=_chunks,
    blank=_blanks,
    out_reps=st.integers(0, 900),
    blank_reps=st.integers(0, 3000),
    err_unit=_chunks,
    err_reps=st.integers(0, 200),
    err_blank_reps=st.integers(0, 3000),
    junk=st.binary(max_size=4),
    step=st.integers(1, 9000),
    rc=st.integers(0, 255),
)
def test_trailing_whitespace_longer_than_a_window_frames_like_the_whole_stream(
    out_unit, blank, out_reps, blank_reps, err_unit, err_reps, err_blank_reps, junk, step, rc
):
    """docs/protocol.md#output-framing: DocVQA strips the body's trailing whitespace, which may be
    far longer than the tail window (the window then holds blanks only)."""
    limit, keep = 600, 4096
    blanks = "".join(blank)
    out = ("".join(out_unit) * out_reps).encode() + junk + (blanks * blank_reps).encode()
    err = ("".join(err_unit) * err_reps + blanks * err_blank_reps).encode()
    full = format_observation(R(out, err, rc), "docvqa", limit)
    assert format_observation(_captured(out, err, rc, keep, step), "docvqa", limit) == full


def test_issue_repro_200k_characters_then_100k_spaces():
    out = b"x" * 200_000 + b" " * 100_000
    framed = format_observation(_captured(out, b"", 0, 65536, 65536), "docvqa")
    assert framed == format_observation(R(out), "docvqa")
    assert framed == "x" * 2990 + MARK + "x" * 2977 + "\n[exit_code] 0"


@pytest.mark.parametrize("mode", ["persistent", "fresh"])
def test_real_sandbox_frames_trailing_blanks_like_the_whole_stream(mode):
    """The issue's command through the DocVQA bash tool in real bubblewrap."""
    env = gym.make("DocVQA-CLI-v0", sandbox={"backend": "bwrap", "mode": mode})
    try:
        env.reset(seed=0)
        command = "python3 -c \"import sys; sys.stdout.write('x'*200000+' '*100000)\""
        messages, *_ = env.step("Action: " + json.dumps({"name": "bash", "arguments": {"command": command}}))
    finally:
        env.close()
    body = messages[-1]["content"].removeprefix("Observation from bash:\n")
    assert body == format_observation(R(b"x" * 200_000 + b" " * 100_000), "docvqa")
    assert body == "x" * 2990 + MARK + "x" * 2977 + "\n[exit_code] 0"  # 6,000 characters, as the reference


def test_space_chars_are_what_rstrip_removes():
    assert SPACE_CHARS == "".join(c for c in map(chr, range(0x110000)) if c.isspace())


def test_window_keeps_ends_and_counts_dropped():
    data = bytes(range(256)) * 1000
    kept, dropped = _windowed(data, 1000)
    assert kept == data[:1000] + data[-1000:] and dropped == len(data) - 2000
    assert math.isclose(len(kept) / 2, 1000)
