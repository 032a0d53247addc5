"""Token counting shared by environments and policies.

With a Hugging Face tokenizer every count is exact and matches what the policy renders (chat
template with ``add_generation_prompt=True`` and ``enable_thinking`` off, as the protocol does).
Without one, counts are estimates (UTF-8 bytes / 4, rounded up) and every record says so through
``token_counts_exact=False``; budgets are then approximate.

A growing chat is counted incrementally (:class:`PromptTally`) when the chat template is
prefix-stable: rendering more messages only appends text, which starts at a special token, so its
tokens simply add.  That is verified once per tokenizer on a probe conversation; a template that
fails it is counted by rendering the whole chat, as before.  Either way the counts are identical.
"""
from __future__ import annotations

import math
import threading
import weakref
from array import array
from collections import OrderedDict
from typing import Any, Callable, Sequence

from agent_envs.core.content import Message  # noqa: F401  (string or content parts)


def _input_ids(encoded: Any) -> list[int]:
    """transformers 5 returns a dict-like encoding from ``apply_chat_template(tokenize=True)``."""
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):
        encoded = encoded[0]
    return list(encoded)


class TokenCounter:
    def __init__(self, tokenizer: Any = None, enable_thinking: bool = False):
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self._template: Callable[..., Any] | None = None
        self._encode: Callable[[str], list[int]] | None = None
        if tokenizer is not None:
            self._template = _unpooled(tokenizer, "apply_chat_template")
            self._encode = _direct_encoder(tokenizer)

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def render(self, messages: Sequence[Message], generation_prompt: bool = True) -> str:
        """The prompt text the policy sees (chat template + generation prompt)."""
        if self._template is None:
            parts = [f"<|{m['role']}|>\n{m['content']}" for m in messages]
            return "\n".join(parts) + ("\n<|assistant|>\n" if generation_prompt else "")
        return self._template(list(messages), tokenize=False, add_generation_prompt=generation_prompt,
                              enable_thinking=self.enable_thinking)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        if self._template is None:
            raise ValueError("prompt_ids needs a tokenizer")
        if self._encode is not None:  # verified equal to the template's own tokenising
            return self._encode(self.render(messages))
        return _input_ids(self._template(list(messages), tokenize=True, add_generation_prompt=True,
                                         enable_thinking=self.enable_thinking))

    def prompt_tokens(self, messages: Sequence[Message]) -> int:
        if self.tokenizer is None:
            return estimate_tokens(self.render(messages))
        return len(self.prompt_ids(messages))

    def message_tokens(self, message: Message) -> int:
        """Cost of one appended observation: the template applied to ``[message]`` alone (protocol 2.4)."""
        return self.prompt_tokens([message])

    def text_tokens(self, text: str) -> int:
        if self.tokenizer is None:
            return estimate_tokens(text)
        return len(self.text_ids(text))

    def text_ids(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("text_ids needs a tokenizer")
        if self._encode is not None:
            return self._encode(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @property
    def incremental(self) -> bool:
        """Whether :class:`PromptTally` may count this template's chats piece by piece."""
        if self.tokenizer is None:
            return False
        with _VERIFIED_LOCK:
            try:
                per_tokenizer = _VERIFIED.setdefault(self.tokenizer, {})
            except TypeError:  # not weak-referenceable: verify per counter
                per_tokenizer = self.__dict__.setdefault("_verified", {})
            if self.enable_thinking not in per_tokenizer:
                per_tokenizer[self.enable_thinking] = _prefix_stable(self)
            return per_tokenizer[self.enable_thinking]


class PromptTally:
    """The prompt tokens of one growing chat, rendering and tokenising each message once.

    ``messages`` is the live, append-only list of the conversation.  :meth:`prompt_ids` and
    :meth:`prompt_tokens` equal ``counter.prompt_ids(messages)`` and ``counter.prompt_tokens(messages)``
    at every point; with a prefix-stable template (see :attr:`TokenCounter.incremental`) only the
    messages appended since the last call are rendered, behind the chat's opening messages (which
    stand in for the whole history).
    """

    def __init__(self, counter: TokenCounter, messages: list[Message], *, incremental: bool | None = None):
        self.counter = counter
        self.messages = messages
        self.incremental = counter.incremental if incremental is None else incremental
        self._head = [dict(m) for m in messages[:2]]  # the opening (system, task) messages
        self._head_text = ""
        self._counted = 0                      # messages whose tokens are in ``_ids``
        self._ids = array("q")                 # tokens of messages[:_counted] without the generation prompt
        self._generation: list[int] = []       # tokens of the generation prompt

    def prompt_tokens(self) -> int:
        if self.incremental and self._extend():
            return len(self._ids) + len(self._generation)
        return self.counter.prompt_tokens(self.messages)

    def prompt_ids(self) -> list[int]:
        if self.incremental and self._extend():
            return self._ids.tolist() + self._generation
        return self.counter.prompt_ids(self.messages)

    def _extend(self) -> bool:
        """Tokenise the messages appended since the last call; False where that is not possible."""
        if self.messages[-1]["role"] == "assistant":  # templates may render a trailing reply specially
            return False
        if self._counted == 0:
            self._head_text = self.counter.render(self._head, generation_prompt=False)
            prompt = self.counter.render(self._head)
            self._ids = array("q", self.counter.text_ids(self._head_text))
            self._generation = self.counter.text_ids(prompt[len(self._head_text):])
            self._counted = len(self._head)
        new = self.messages[self._counted:]
        if new:
            text = self.counter.render(self._head + new, generation_prompt=False)
            if not text.startswith(self._head_text):
                return False
            self._ids.extend(self.counter.text_ids(text[len(self._head_text):]))
            self._counted = len(self.messages)
        return True


class PromptCache:
    """Per-episode :class:`PromptTally` objects for a policy, keyed by the request key.

    A request whose chat extends the cached chat of its key costs only its new messages; anything
    else starts the key afresh.  The least recently used keys beyond ``size`` are dropped.
    """

    def __init__(self, counter: TokenCounter, size: int = 1024):
        self.counter = counter
        self.size = size
        self._tallies: OrderedDict[str, PromptTally] = OrderedDict()
        self._lock = threading.Lock()

    def prompt_ids(self, key: str, messages: Sequence[Message]) -> list[int]:
        if not key or not self.counter.incremental:
            return self.counter.prompt_ids(messages)
        with self._lock:
            tally = self._tallies.pop(key, None)
            known = 0 if tally is None else len(tally.messages)
            if tally is None or len(messages) < known or list(messages[:known]) != tally.messages:
                tally = PromptTally(self.counter, [dict(m) for m in messages])
            else:
                tally.messages.extend(dict(m) for m in messages[known:])
            self._tallies[key] = tally
            while len(self._tallies) > self.size:
                self._tallies.popitem(last=False)
        return tally.prompt_ids()


#: probe contents that would expose a template or tokenizer that is not prefix-stable: whitespace
#: at the edges, think tags, special-token text, non-ASCII
_PROBE = [
    ("Solve it.  ", "Let me think.\n\nAction:\n{\"name\": \"bash\"}"),
    ("Observation from bash:\n4\n\n", " <think>hidden</think>\nvisible "),
    ("Observation from format_check:\n<|im_end|> x", "</think>\n\nFinal answer: 5"),
    ("Observation: é ü 你好\t", "\n\n"),
    ("  leading", "done"),
]
_VERIFIED: "weakref.WeakKeyDictionary[Any, dict[bool, bool]]" = weakref.WeakKeyDictionary()
_VERIFIED_LOCK = threading.Lock()
_DIRECT: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def _prefix_stable(counter: TokenCounter) -> bool:
    """Count a probe chat both ways, step by step; any difference (or error) means full rendering."""
    messages: list[Message] = [{"role": "system", "content": "You are a careful solver. "},
                               {"role": "user", "content": "Question: what is 2+2?\n"}]
    try:
        tally = PromptTally(counter, messages, incremental=True)
        for index, (user, assistant) in enumerate(_PROBE):
            if index != 2 and not _same_ids(tally, counter.prompt_ids(messages)):  # 2: two steps at once
                return False
            messages += [{"role": "assistant", "content": assistant}, {"role": "user", "content": user}]
        return _same_ids(tally, counter.prompt_ids(messages))
    except Exception:  # a template that cannot render the probe is simply counted in full
        return False


def _same_ids(tally: PromptTally, expected: list[int]) -> bool:
    return tally._extend() and tally._ids.tolist() + tally._generation == expected


def _unpooled(tokenizer: Any, method: str) -> Callable[..., Any]:
    """``tokenizer.<method>``, bypassing vLLM's thread pool wrapper where there is one.

    vLLM's engines hand out a tokenizer whose every call borrows a private copy and deep-copies a
    new one when all are busy (about a second of CPU each for a 49k-token vocabulary): the first
    lockstep turn of 200 episodes, warming prompts in 200 env threads, spent most of its time
    copying tokenizers while the GPU waited.  Rendering a chat template mutates nothing, so it
    calls the tokenizer's own class directly.
    """
    cls = type(tokenizer)
    if any(c.__name__ == "ThreadSafeHFTokenizerMixin" for c in cls.__mro__):
        base = next(c for c in cls.__mro__[1:] if hasattr(c, method)
                    and c.__name__ != "ThreadSafeHFTokenizerMixin")
        return getattr(base, method).__get__(tokenizer, base)
    return getattr(tokenizer, method)


def _direct_encoder(tokenizer: Any) -> Callable[[str], list[int]] | None:
    """The Rust tokenizer's one-text ``encode``, when it gives exactly ``tokenizer.encode``'s ids.

    transformers routes one text through ``encode_batch`` (the Rust thread pool) and vLLM through
    its tokenizer pool; from many env threads at once both serialise.  The direct call is checked
    once per tokenizer on probe texts (chat templates included) and not used on any difference.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not callable(getattr(backend, "encode", None)):
        return None

    def encode(text: str) -> list[int]:
        return backend.encode(text, add_special_tokens=False).ids

    with _VERIFIED_LOCK:
        try:
            cached = _DIRECT.get(tokenizer)
        except TypeError:
            cached = None
    if cached is not None:
        return encode if cached else None
    probes = [u + a for u, a in _PROBE] + ["".join(u + a for u, a in _PROBE), ""]
    try:
        template = _unpooled(tokenizer, "apply_chat_template")
        chat = [{"role": "system", "content": _PROBE[0][0]}, {"role": "user", "content": _PROBE[3][0]},
                {"role": "assistant", "content": _PROBE[1][1]}, {"role": "user", "content": _PROBE[2][0]}]
        same = all(encode(t) == list(tokenizer.encode(t, add_special_tokens=False)) for t in probes) and (
            encode(template(chat, tokenize=False, add_generation_prompt=True))
            == _input_ids(template(chat, tokenize=True, add_generation_prompt=True)))
    except Exception:  # any tokenizer or template that cannot take the probe keeps the plain path
        same = False
    with _VERIFIED_LOCK:
        try:
            _DIRECT[tokenizer] = same
        except TypeError:
            pass
    return encode if same else None


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8", "replace")) / 4)
