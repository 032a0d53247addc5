"""Gymnasium spaces for chat conversations (observations) and completion text (actions)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.spaces import Space

from agent_envs.core.types import Completion

#: ``tool`` carries an observation under native tool calls (docs/protocol.md#native-tool-calls)
ROLES = ("system", "user", "assistant", "tool")
Chat = list[dict[str, Any]]
_WORDS = ("Action:", "Final answer:", "ls", "echo", "python3", "{", "}", '"bash"', "\\boxed{1}", "hi", "\n")


class Conversation(Space[Chat]):
    """A list of ``{"role", "content"}`` messages; roles from :data:`ROLES`, content a string or a
    list of text and image content parts (:mod:`agent_envs.core.content`)."""

    def __init__(self, max_messages: int = 256, seed: int | np.random.Generator | None = None):
        self.max_messages = max_messages
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, list)
            and 0 < len(x) <= self.max_messages
            and all(isinstance(m, dict) and m.get("role") in ROLES and _content_ok(m.get("content")) for m in x)
        )

    def sample(self, mask: Any = None, probability: Any = None) -> Chat:
        n = int(self.np_random.integers(2, 5))
        msgs = [{"role": "system", "content": _text(self.np_random)}]
        for i in range(1, n):
            msgs.append({"role": "user" if i % 2 else "assistant", "content": _text(self.np_random)})
        return msgs

    def __repr__(self) -> str:
        return f"Conversation(max_messages={self.max_messages})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Conversation) and other.max_messages == self.max_messages


class CompletionText(Space[str]):
    """One assistant completion: a string, or a :class:`Completion` carrying token ids or an error."""

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x: Any) -> bool:
        if isinstance(x, Completion):
            x = x.text
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return _text(self.np_random)

    def __repr__(self) -> str:
        return f"CompletionText(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, CompletionText) and other.max_length == self.max_length


def _content_ok(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict)
        and (
            (p.get("type") == "text" and isinstance(p.get("text"), str))
            or (
                p.get("type") == "image_url"
                and isinstance(p.get("image_url"), dict)
                and isinstance(p["image_url"].get("url"), str)
            )
        )
        for p in content
    )


def _text(rng: np.random.Generator) -> str:
    n = int(rng.integers(1, 12))
    return " ".join(_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), size=n))
