"""Text-level pieces of the ReAct protocol (docs/protocol.md#final-answer-grammar, #action-parsers, #first-turn-rule).

Everything here is a pure function of the model's text and never raises: a completion is
untrusted input, and a parser crash would end an episode for the wrong reason.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from agent_envs.core.spec import ParserSpec
from agent_envs.protocol.nesting import nesting_depth

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
# `\s*` after the colon may cross a newline, so "Final answer:\n5" yields "5" (docs/protocol.md#final-answer-grammar).
_FINAL = re.compile(r"^\s*(?:final answer|answer)\s*[:\uff1a]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_BOXED_MARKERS = ("\\boxed{", "\x08oxed{")  # the second is "\b" typed in a non-raw string
_ACTION_OPEN = re.compile(r"Action:\s*\{", re.IGNORECASE)
_SINGLE_ACTION = re.compile(r"\s*(?:<think>\s*</think>\s*)?Action:\s*(\{.*\})\s*", re.DOTALL | re.IGNORECASE)
_RELAXED_NAME = re.compile(r"""["']name["']\s*:\s*["']bash["']""", re.IGNORECASE)
_RELAXED_COMMAND = re.compile(r"""["']command["']\s*:\s*(["'])""", re.IGNORECASE)
_MANUAL_UNESCAPES = (("\\\\", "\\"), ('\\"', '"'), ("\\'", "'"), ("\\n", "\n"), ("\\t", "\t"))
#: action JSON nested deeper counts as undecodable.  Python's decoder gives up where the caller's
#: stack meets the recursion limit (about 990 levels from a shallow stack); a fixed bound below
#: it makes the outcome the same from every call site (docs/protocol.md#differences-and-parity-switches)
MAX_ACTION_NESTING = 512


def strip_think(text: str) -> str:
    """Remove every ``<think>…</think>`` span (non-greedy, any case, across lines), then strip."""
    return _THINK.sub("", text).strip()


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{`` if its braces balance, else ``None``.

    The backspace spelling is consulted only when no real ``\boxed{`` occurs, as upstream does.
    """
    for marker in _BOXED_MARKERS:
        at = text.rfind(marker)
        if at < 0:
            continue
        start, depth = at + len(marker), 1
        for pos in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            if depth == 0:
                return text[start:pos].strip()
        return None
    return None


def final_answer_line(text: str) -> str | None:
    """Value of the last ``Final answer:``/``Answer:`` line (boxed content if any), else ``None``.

    Callers strip think blocks first; this function looks at the text as given.
    """
    matches = _FINAL.findall(text)
    if not matches:
        return None
    value = matches[-1].strip()
    boxed = last_boxed(value)
    return value if boxed is None else boxed


def _action_candidate(text: str, to_end: bool) -> str | None:
    """The JSON candidate after the first ``Action:`` + ``{``.

    The strict pass (``{`` … ``}`` + trailing whitespace at the end of the text) and the greedy
    pass (``{`` … last ``}``) both start at the first ``Action: {`` and, whenever the strict one
    matches, end at the same ``}``; so one span serves both. ``to_end`` adds the third pass for
    JSON cut off by the token limit.
    """
    match = _ACTION_OPEN.search(text)
    if match is None:
        return None
    start = match.end() - 1
    last_brace = text.rfind("}")
    if last_brace > start:
        return text[start : last_brace + 1]
    return text[start:].strip() if to_end else None


def _decode_relaxed_string(raw: str) -> str:
    """Decode a captured command string: quote-escaped JSON, then plain JSON, then by hand."""
    for attempt in (raw.replace('"', '\\"'), raw):
        try:
            return str(json.loads(f'"{attempt}"'))
        except (ValueError, RecursionError):
            continue
    for escaped, plain in _MANUAL_UNESCAPES:
        raw = raw.replace(escaped, plain)
    return raw


def parse_relaxed_bash(raw: str) -> dict[str, Any] | None:
    """Fallback for near-JSON bash actions (single quotes, unescaped or unterminated strings)."""
    if _RELAXED_NAME.search(raw) is None:
        return None
    match = _RELAXED_COMMAND.search(raw)
    if match is None:
        return None
    quote, start = match.group(1), match.end()
    pos = start
    while pos < len(raw) and raw[pos] != quote:
        pos += 2 if raw[pos] == "\\" else 1
    command = _decode_relaxed_string(raw[start:pos]).strip()
    return {"name": "bash", "arguments": {"command": command}} if command else None


def _decode_first_value(candidate: str) -> tuple[bool, Any]:
    """(ok, value) of the first JSON value in ``candidate``; trailing text is ignored.  A value
    nested more than :data:`MAX_ACTION_NESTING` levels deep is not ok."""
    try:
        value = json.JSONDecoder().raw_decode(candidate)[0]
    except (ValueError, RecursionError):
        return False, None
    return (True, value) if nesting_depth(value) <= MAX_ACTION_NESTING else (False, None)


def _bash_command(arguments: Any) -> str | None:
    """The non-blank string ``command`` of an arguments dict, else ``None``."""
    command = arguments.get("command") if isinstance(arguments, dict) else None
    return command if isinstance(command, str) and command.strip() else None


def _accept(obj: Any, spec: ParserSpec) -> dict[str, Any] | None:
    """Apply the parser's acceptance rules (docs/protocol.md#action-parsers) to a decoded JSON value."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if spec.require_arguments and "arguments" not in obj:
        return None
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    if spec.require_bash_command and (obj["name"] != "bash" or _bash_command(arguments) is None):
        return None
    return {"name": obj["name"], "arguments": arguments}


def parse_action(text: str, spec: ParserSpec) -> dict[str, Any] | None:
    """The action ``{"name", "arguments"}`` a harness with parser ``spec`` would execute, or ``None``.

    ``text`` should already be think-stripped.
    """
    if not isinstance(spec, ParserSpec):
        raise ValueError(f"unknown parser variant {spec!r}: parse_action needs a ParserSpec")
    relaxed = spec.truncated_and_relaxed
    candidate = _action_candidate(text, to_end=relaxed)
    if candidate is None:
        return None
    ok, obj = _decode_first_value(candidate)
    if not ok:
        return parse_relaxed_bash(candidate) if relaxed else None
    return _accept(obj, spec)


def is_single_bash_action(text: str) -> bool:
    """docs/protocol.md#first-turn-rule: the text is only (an empty think block and) one complete, valid bash action."""
    match = _SINGLE_ACTION.fullmatch(text)
    if match is None:
        return False
    try:
        obj = json.loads(match.group(1))
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("name") == "bash" and _bash_command(obj.get("arguments")) is not None


def answer_status(completion: str) -> Literal["answered", "missing_final_answer"]:
    """Row field ``answer_status``: does the think-stripped completion have a final-answer line?"""
    return "missing_final_answer" if final_answer_line(strip_think(completion)) is None else "answered"
