"""Gymnasium spaces for chat conversations (observations) and completion text (actions), and the
functions Gymnasium's wrappers and vector envs look up by space: the padding chat of
``FrameStackObservation`` and ``DelayObservation``, and the shared memory of ``AsyncVectorEnv``
(which it uses by default)."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Iterator

import numpy as np
from gymnasium.spaces import Space
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory
from gymnasium.wrappers.utils import create_zero_array

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


@create_zero_array.register(Conversation)
def _zero_chat(space: Conversation) -> Chat:  # type: ignore[misc]  # mypy misreads the generic fallback
    """The chat closest to empty that is still in the space (one blank system message)."""
    return [{"role": "system", "content": ""}]


class SharedChats:
    """The batch of chats an ``AsyncVectorEnv`` shares between its worker processes: one slot per
    environment in a list kept by a manager process, since a chat has no fixed size to lay out in
    a shared array.  Reads see the workers' latest writes; a deep copy (what the vector env returns
    unless ``copy=False``) is a tuple of chats, as without shared memory.  The manager process ends
    with the vector env object (``close`` stops only the workers)."""

    def __init__(self, slots: Any, n: int):
        self.slots = slots
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Chat:
        chat: Chat = self.slots[index]
        return chat

    def __iter__(self) -> Iterator[Chat]:
        return iter(self.slots[: self.n])

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[Chat, ...]:
        return tuple(self.slots[: self.n])  # one round trip, already a copy


@create_shared_memory.register(Conversation)
def _create_shared_chats(space: Conversation, n: int = 1, ctx: ModuleType | Any = None) -> Any:
    import multiprocessing

    return (ctx or multiprocessing).Manager().list([None] * n)  # the list's proxy keeps its manager alive


@read_from_shared_memory.register(Conversation)
def _read_shared_chats(space: Conversation, shared_memory: Any, n: int = 1) -> SharedChats:
    return SharedChats(shared_memory, n)


@write_to_shared_memory.register(Conversation)
def _write_shared_chat(space: Conversation, index: int, value: Chat, shared_memory: Any) -> None:
    shared_memory[index] = value
