"""What ``agent-envs serve`` reads from and writes to the OpenAI wire (chat and text completions).

Every body field is either honoured or refused: :data:`CHAT_FIELDS` and :data:`COMPLETION_FIELDS`
list what is read, and anything else (``response_format``, ``frequency_penalty``, ...) is a
:class:`ClientError` (a 400) naming each such field, so that a client never gets an answer that
quietly ignored part of its request.  Sampling settings travel as ``GenerationRequest.sampling``
(the policy's own :class:`SamplingConfig` fields); ``n`` becomes ``n`` requests, choice ``i``
seeded ``seed + i``.  Tool calls are read out of the text as the native tool-call variants read
them (docs/protocol.md#native-tool-calls: ``<tool_call>`` blocks outside thinking), and an assistant
message sent back with ``tool_calls`` is written into the chat in that same form.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from ..core.content import decode_image_url
from .base import Completion, GenerationRequest
from ..protocol.native import call_text, parse_text_calls, without_calls
from .sampling import SamplingConfig

#: seeds and token counts an engine takes (vLLM's limits for them: a signed 64-bit integer)
INT64 = range(-(1 << 63), 1 << 63)
#: body fields that map onto :class:`SamplingConfig` fields of the same name
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "repetition_penalty")
_COMMON = {"model", "max_tokens", "seed", "stop", "n", "logprobs", "stream", "stream_options", "return_token_ids"}
#: the fields a chat body may have
CHAT_FIELDS = frozenset(
    {*SAMPLING_FIELDS, *_COMMON, "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice"}
    | {"chat_template_kwargs", "user"}
)
#: the fields a text-completion body may have
COMPLETION_FIELDS = frozenset({*SAMPLING_FIELDS, *_COMMON, "prompt", "user"})
#: most choices one request may ask for
MAX_N = 64


class ClientError(ValueError):
    """A request the server refuses with a 400 and this message; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ModelOutputError(RuntimeError):
    """The model's reply cannot be what the request demanded (``tool_choice`` required, no call)."""


def whole(body: dict[str, Any], name: str, allowed: range) -> int | None:
    """``body[name]``: absent/null, or a whole number in ``allowed`` (else a :class:`ClientError`)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        shown = str(value)[:40] if isinstance(value, (int, float)) else type(value).__name__
        raise ClientError(
            f"'{name}' must be a whole number from {allowed.start} to {allowed.stop - 1}, got {shown}", name
        )
    return value


def checked_content(content: Any) -> Any:
    """A message's content, refused (``ValueError``: a 400) unless it is a string or a list of
    text parts and image parts whose data URLs decode."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"message content must be a string or a list of parts, got {type(content).__name__}")
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            continue
        if kind == "image_url" and isinstance(part.get("image_url"), dict):
            decode_image_url(str(part["image_url"].get("url", "")))
            continue
        raise ValueError(f"unsupported content part {str(part)[:80]!r} (text and image_url parts are accepted)")
    return content


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """One request message as the policy sees it: an assistant turn sent back with ``tool_calls``
    (``content`` null or text) carries its calls as the ``<tool_call>`` text the model wrote."""
    role, calls = message["role"], message.get("tool_calls")
    if role == "assistant" and calls:
        if not isinstance(calls, list):
            raise ClientError("an assistant message's 'tool_calls' must be a list", "messages")
        text = [message.get("content") or ""]
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ClientError(f"tool call {str(call)[:80]!r} has no function name", "messages")
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except ValueError:
                raise ClientError(f"tool call {function['name']!r}: arguments are not JSON", "messages") from None
            text.append(call_text(function["name"], arguments))
        return {"role": role, "content": "\n".join(t for t in text if t)}
    out = {"role": role, "content": checked_content(message["content"])}
    out.update({k: message[k] for k in ("name", "tool_call_id") if isinstance(message.get(k), str)})
    return out


def tool_choice_of(body: dict[str, Any]) -> str | None:
    """``tool_choice`` as ``"none"``, ``"auto"``, ``"required"`` or a function's name ("auto" when
    tools are given without it); None without tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise ClientError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and t.get("type") == "function" and isinstance((t.get("function") or {}).get("name"), str)
        for t in tools
    ):
        raise ClientError("'tools' must be a list of {'type': 'function', 'function': {'name': ...}}", "tools")
    if choice is None:
        return "auto"
    if choice in ("none", "auto", "required"):
        return str(choice)
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
        raise ClientError(
            "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': N}} "
            "naming one of the tools",
            "tool_choice",
        )
    return name


@dataclass
class WireRequest:
    """A parsed body: the policy requests (one per choice) and how to write the answer."""

    chat: bool
    model: str | None
    requests: list[GenerationRequest]
    tool_choice: str | None
    logprobs: bool
    token_ids: bool
    stream: bool
    stream_usage: bool

    def choice(self, index: int, completion: Completion, tokenizer: Any) -> dict[str, Any]:
        """Choice ``index`` of the answer."""
        finish = completion.finish_reason or "stop"
        out: dict[str, Any] = {"index": index, "finish_reason": finish}
        if self.logprobs:
            out["logprobs"] = logprobs_block(completion, tokenizer, self.chat)
        if self.token_ids and completion.token_ids is not None:
            out["token_ids"] = completion.token_ids
            if completion.prompt_token_ids is not None or self.requests[0].prompt_token_ids is not None:
                out["prompt_token_ids"] = completion.prompt_token_ids or self.requests[0].prompt_token_ids
        if not self.chat:
            out["text"] = completion.text
            return out
        message: dict[str, Any] = {"role": "assistant", "content": completion.text}
        calls = completion.tool_calls or self.tool_calls(completion.text)
        if calls:
            message["tool_calls"] = calls
            message["content"] = without_calls(completion.text).strip() or None
            out["finish_reason"] = "tool_calls" if finish == "stop" else finish
        out["message"] = message
        return out

    def tool_calls(self, text: str) -> list[dict[str, Any]]:
        """The well-formed calls of ``text`` that ``tool_choice`` allows, as OpenAI entries."""
        if self.tool_choice in (None, "none"):
            return []
        calls = [c for c in parse_text_calls(text) if c.error is None]
        if self.tool_choice not in ("auto", "required"):
            calls = [c for c in calls if c.name == self.tool_choice]
        if not calls and self.tool_choice != "auto":
            raise ModelOutputError(
                f"tool_choice {self.tool_choice!r}: the model's reply holds no well-formed matching "
                f"<tool_call> block: {text[:200]!r}"
            )
        return [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in calls
        ]


def logprobs_block(completion: Completion, tokenizer: Any, chat: bool) -> dict[str, Any]:
    """The sampled tokens' log-probabilities in the route's shape; a policy without them is a 400."""
    values, ids = completion.logprobs, completion.token_ids
    if values is None:
        raise ClientError("'logprobs': this server's policy returns no log-probabilities", "logprobs")
    tokens = [tokenizer.decode([i]) for i in ids] if tokenizer is not None and ids is not None else [""] * len(values)
    if chat:
        return {
            "content": [{"token": t, "logprob": v, "bytes": None, "top_logprobs": []} for t, v in zip(tokens, values)]
        }
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": None, "text_offset": None}


def parse_body(body: Any, chat: bool, tokenizer: Any) -> WireRequest:
    """The :class:`WireRequest` a body asks for; :class:`ClientError` (a 400) says what is wrong."""
    if not isinstance(body, dict):
        raise ClientError(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - (CHAT_FIELDS if chat else COMPLETION_FIELDS))
    if unknown:
        raise ClientError(f"unsupported field(s) {', '.join(unknown)}: this server does not implement them", unknown[0])
    sampling = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    thinking = body.get("chat_template_kwargs") or {}
    if not isinstance(thinking, dict) or set(thinking) - {"enable_thinking"}:
        raise ClientError("'chat_template_kwargs' may only set enable_thinking", "chat_template_kwargs")
    sampling.update(thinking)
    SamplingConfig(**sampling)  # a pydantic ValidationError (a ValueError, so a 400) names the field
    seed = whole(body, "seed", INT64)
    n = whole(body, "n", range(1, MAX_N + 1)) or 1
    max_tokens = whole(body, "max_completion_tokens", range(1, INT64.stop)) or whole(
        body, "max_tokens", range(1, INT64.stop)
    )
    stop = body.get("stop") or []
    if chat:
        logprobs = body.get("logprobs") or False
        if not isinstance(logprobs, bool):
            raise ClientError("'logprobs' must be true or false", "logprobs")
        if whole(body, "top_logprobs", range(0, 21)):
            raise ClientError("'top_logprobs' above 0: this server returns only the sampled tokens'", "top_logprobs")
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ClientError("'messages' must be a list of message objects", "messages")
        fields: dict[str, Any] = {"messages": [chat_message(m) for m in messages]}
        tool_choice = tool_choice_of(body)
        if tool_choice is not None:
            fields["tools"] = body["tools"]
    else:
        if whole(body, "logprobs", range(0, 21)):
            raise ClientError("'logprobs' above 0: this server returns only the sampled tokens'", "logprobs")
        logprobs, tool_choice = body.get("logprobs") is not None, None
        fields = {"messages": [], "prompt_token_ids": prompt_ids(body.get("prompt"), tokenizer)}
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
        raise ClientError("'stream_options' may only set include_usage", "stream_options")
    requests = [
        GenerationRequest(
            **fields,
            seed=None if seed is None else (seed + i + (1 << 63)) % (1 << 64) - (1 << 63),
            max_tokens=max_tokens,
            stop=[stop] if isinstance(stop, str) else list(stop),
            logprobs=logprobs,
            sampling=sampling or None,
        )
        for i in range(n)
    ]
    return WireRequest(
        chat=chat,
        model=body.get("model"),
        requests=requests,
        tool_choice=tool_choice,
        logprobs=logprobs,
        token_ids=bool(body.get("return_token_ids")),
        stream=bool(body.get("stream")),
        stream_usage=bool(stream_options.get("include_usage")),
    )


def prompt_ids(prompt: Any, tokenizer: Any) -> list[int]:
    """A completions ``prompt``: token ids as they are, text through the policy's tokenizer."""
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        return list(prompt)
    if isinstance(prompt, str) and prompt:
        if tokenizer is None:
            raise ClientError("a text 'prompt' needs a policy with a tokenizer; send token ids", "prompt")
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    raise ClientError("'prompt' must be one non-empty text or list of token ids (batches are not supported)", "prompt")


def stream_chunks(response: dict[str, Any], chat: bool, usage: bool) -> list[dict[str, Any]]:
    """A finished answer as server-sent-event chunks: per choice its role, its text (and tool
    calls), then its finish reason; with ``include_usage`` a last chunk holding only the usage."""
    head = {k: response[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    chunks = []
    for choice in response["choices"]:
        base = {k: v for k, v in choice.items() if k not in ("message", "finish_reason")}
        if not chat:
            chunks.append({**head, "choices": [{**base, "finish_reason": choice["finish_reason"]}]})
            continue
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        chunks.append({**head, "choices": [{**base, "delta": delta, "finish_reason": None}]})
        end = {"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}
        chunks.append({**head, "choices": [end]})
    if usage:
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return chunks
