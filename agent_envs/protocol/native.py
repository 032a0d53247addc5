"""Native tool calls: the model's own tool-call format instead of ReAct's ``Action:`` block (docs/protocol.md#native-tool-calls).

A local engine's completion carries its calls as text, Qwen3's (Hermes-style) blocks
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; an OpenAI-compatible server with a
tool parser returns them as ``message.tool_calls`` instead.  Both become :class:`Call` values
here.  Pure functions of the model's output, never raising.

Thinking is never acted on: a call written inside ``<think>`` is not a call.  Thinking is every
``<think>…</think>`` span, the text before a ``</think>`` that has no opening tag (templates that
open the block in the generation prompt), and everything after a ``<think>`` that is never closed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from agent_envs.core.content import Message, text_of

_THINK_SPAN = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)
_ACTION = re.compile(r"Action:\s*(\{.*\})\s*\Z", re.DOTALL)

#: what a call that is not ``{"name": <string>, "arguments": <object>}`` gets back (as its tool message)
MALFORMED_CALL = (
    'Tool call not understood: write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call> with valid JSON.'
)


@dataclass(frozen=True)
class Call:
    """One tool call: ``name`` and ``arguments`` when it is well formed, else ``error`` says why not."""

    name: str | None
    arguments: dict[str, Any] | None
    #: the server's ``tool_calls[].id``, echoed in the tool message that answers it
    id: str | None = None
    error: str | None = None


def visible_text(text: str) -> str:
    """``text`` without its thinking (see the module docstring)."""
    text = _THINK_SPAN.sub("", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end() :]
    opened = _THINK_OPEN.search(text)
    return text if opened is None else text[: opened.start()]


def ends_in_thought(text: str) -> bool:
    """Whether ``text`` stops inside an open ``<think>`` block (a server cut its calls from there)."""
    tail = _THINK_SPAN.sub("", text)
    return _THINK_OPEN.search(tail) is not None


def without_calls(text: str) -> str:
    """The visible text with every ``<tool_call>`` block removed (where a final answer is read)."""
    return _CALL_BLOCK.sub("", visible_text(text))


def _call(obj: Any, call_id: str | None = None) -> Call:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return Call(None, None, call_id, MALFORMED_CALL)
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # the OpenAI shape sends the arguments as JSON text
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return Call(obj["name"], None, call_id, MALFORMED_CALL)
    if not isinstance(arguments, dict):
        return Call(obj["name"], None, call_id, MALFORMED_CALL)
    return Call(obj["name"], arguments, call_id)


def parse_text_calls(text: str) -> list[Call]:
    """Every ``<tool_call>`` block outside thinking, in order; a block cut off by the token limit
    or holding anything but one JSON object is a malformed call."""
    calls = []
    for match in _CALL.finditer(visible_text(text)):
        try:
            calls.append(_call(json.loads(match.group(1))))
        except (ValueError, RecursionError):
            calls.append(Call(None, None, None, MALFORMED_CALL))
    return calls


def parse_server_calls(tool_calls: Sequence[Any], content: str) -> list[Call]:
    """OpenAI ``message.tool_calls`` entries; none of them counts when the ``content`` the server
    returned ends inside a ``<think>`` block (the calls were written in the thinking)."""
    if ends_in_thought(content):
        return []
    calls = []
    for entry in tool_calls:
        function = entry.get("function") if isinstance(entry, dict) else None
        call_id = entry.get("id") if isinstance(entry, dict) and isinstance(entry.get("id"), str) else None
        calls.append(
            _call(function, call_id) if isinstance(function, dict) else Call(None, None, call_id, MALFORMED_CALL)
        )
    return calls


def function_schema(name: str, argument: str, description: str, argument_description: str) -> dict[str, Any]:
    """The OpenAI ``tools`` entry of a tool that takes one string argument."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {argument: {"type": "string", "description": argument_description}},
                "required": [argument],
            },
        },
    }


def call_text(name: str, arguments: Mapping[str, Any]) -> str:
    """A well-formed call as a model writes it (what a scripted baseline writes)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": dict(arguments)}) + "\n</tool_call>"


def skipped_calls(count: int, limit: int) -> str:
    """The one answer to the ``count`` calls past ``ParserSpec.max_calls`` (none of them is executed)."""
    calls = "tool call" if count == 1 else "tool calls"
    return f"Not executed: {count} more {calls}; at most {limit} tool calls are run per turn."


def tool_message(call: Call, body: str) -> Message:
    """The ``tool`` message answering ``call``: its output (or the reason it did not run)."""
    message: Message = {"role": "tool", "content": body}
    if call.name is not None:
        message["name"] = call.name
    if call.id is not None:
        message["tool_call_id"] = call.id
    return message


def react_view(messages: Sequence[Message]) -> list[Message]:
    """The chat as the ReAct protocol would have it: each ``tool`` message a ``user`` message
    ``Observation from <name>:``, each call an ``Action:`` block (for code written against ReAct
    chats, such as the scripted baselines)."""
    out: list[Message] = []
    for m in messages:
        if m["role"] == "tool":
            out.append(
                {"role": "user", "content": f"Observation from {m.get('name', 'tool')}:\n{text_of(m['content'])}"}
            )
        elif m["role"] == "assistant":
            calls = parse_text_calls(text_of(m["content"]))
            out.append(
                {
                    "role": "assistant",
                    "content": "\n".join(
                        "Action:\n" + json.dumps({"name": c.name, "arguments": c.arguments})
                        for c in calls
                        if c.error is None
                    )
                    or text_of(m["content"]),
                }
            )
        else:
            out.append(m)
    return out


def from_react(reply: str) -> str:
    """A ReAct reply ending in an ``Action:`` block, with the block written as a native call."""
    match = _ACTION.search(reply)
    if match is None:
        return reply
    try:
        obj = json.loads(match.group(1))
    except (ValueError, RecursionError):
        return reply
    return reply[: match.start()] + call_text(obj.get("name", ""), obj.get("arguments", {}))


def native_baseline(baseline: Callable[[Any], str]) -> Callable[[Any], str]:
    """A ReAct scripted baseline playing the native format: it reads the chat as ReAct would
    have it and its ``Action:`` block is written as a native call."""

    def reply(request: Any) -> str:
        return from_react(baseline(request.model_copy(update={"messages": react_view(request.messages)})))

    return reply
