"""Token counting shared by environments and policies.

With a Hugging Face tokenizer every count is exact and matches what the policy renders (chat
template with ``add_generation_prompt=True`` and ``enable_thinking`` off, as the protocol does).
Without one, counts are estimates (UTF-8 bytes / 4, rounded up) and every record says so through
``token_counts_exact=False``; budgets are then approximate.

Images (docs/protocol.md#image-token-counts): with a processor (an HF ``AutoProcessor``: a
tokenizer, an image processor and a chat template that renders image parts) a chat is rendered by
the processor's template and counted as the processor tokenises it, image tokens included, so
counts stay exact.  Without one, each image costs one token per started
:data:`IMAGE_TILE` x :data:`IMAGE_TILE` pixel tile, its text parts are counted as text, and the
count is marked not exact.

A growing chat is counted incrementally (:class:`PromptTally`) when the chat template is
prefix-stable: rendering more messages only appends text, which starts at a special token, so its
tokens simply add; each image adds what the processor expands its placeholder to.  That is
verified once per tokenizer (or processor) on a probe conversation; a template that fails it is
counted by rendering the whole chat, as before.  Either way the counts are identical.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import threading
import weakref
from array import array
from collections import OrderedDict
from typing import Any, Callable, Sequence

from agent_envs.core.content import (
    Message,
    copy_message,
    has_images,
    image_part,
    image_urls,
    images_of,
    open_image,
    text_of,
    text_part,
)

#: side in pixels of the tile one image token stands for when no processor is given (a 14-pixel
#: patch merged 2x2, the rate of the Qwen2-VL family)
IMAGE_TILE = 28
#: image costs remembered per counter (by the image's data URL digest)
_IMAGE_CACHE_SIZE = 1024


def _input_ids(encoded: Any) -> list[int]:
    """transformers 5 returns a dict-like encoding from ``apply_chat_template(tokenize=True)``."""
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):
        encoded = encoded[0]
    return list(encoded)


def _text_only(messages: Sequence[Message]) -> list[Message]:
    """The chat with every content-part list replaced by its text (for templates without images)."""
    return [m if isinstance(m.get("content"), str) else {**m, "content": text_of(m["content"])} for m in messages]


def processor_inputs(processor: Any, text: str, images: list[Any], return_tensors: str | None = None) -> Any:
    """A processor's inputs for a rendered chat (``text``, one placeholder per image) and its images:
    ``input_ids`` holds every image expanded to its image tokens.  The one place both the counts
    (:class:`TokenCounter`) and the policies (:mod:`agent_envs.policy.vision`) get image prompts from."""
    return processor(
        text=[text], images=[images] if images else None, return_tensors=return_tensors, add_special_tokens=False
    )


def image_size(url: str) -> tuple[int, int]:
    """(width, height) of an image data URL, read from its header."""
    raw = base64.b64decode(url.split(";base64,", 1)[1])
    with open_image(io.BytesIO(raw), "the image data URL") as img:
        width, height = img.size
        return width, height


def estimate_image_tokens(width: int, height: int) -> int:
    """The processor-free image cost: one token per started ``IMAGE_TILE``-pixel tile."""
    return math.ceil(width / IMAGE_TILE) * math.ceil(height / IMAGE_TILE)


class TokenCounter:
    """``tools``: OpenAI-style tool schemas the chat template renders into every prompt
    (docs/protocol.md#native-tool-calls); None renders no tools, as the protocol does."""

    def __init__(
        self,
        tokenizer: Any = None,
        enable_thinking: bool = False,
        processor: Any = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ):
        self.processor = processor
        self.tokenizer = tokenizer if tokenizer is not None else getattr(processor, "tokenizer", None)
        self.enable_thinking = enable_thinking
        self.tools = [dict(t) for t in tools] if tools else None
        #: what memos and verdicts are kept under: the thinking flag, and the tools when given
        self._variant: Any = (
            self.enable_thinking
            if self.tools is None
            else (self.enable_thinking, json.dumps(self.tools, sort_keys=True))
        )
        self._plain: TokenCounter | None = None
        self._image_costs: OrderedDict[str, int] = OrderedDict()
        self._image_lock = threading.Lock()
        self._template: Callable[..., Any] | None = None
        self._encode: Callable[[str], list[int]] | None = None
        self._memo: SharedMemo | None = None
        #: what is learnt once about this counter's template (tokenizer, or processor when given)
        self._state = _state_of(self.processor if self.processor is not None else self.tokenizer)
        if self.tokenizer is not None:
            self._template = _unpooled(self.tokenizer, "apply_chat_template")
            self._encode = _direct_encoder(self.tokenizer)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled and copied as its arguments: the lock, memos and probe results are this process's
        (an environment that holds a counter pickles for subprocess vector envs and Ray)."""
        return (type(self), (self.tokenizer, self.enable_thinking, self.processor, self.tools))

    @property
    def exact(self) -> bool:
        """Whether text counts are exact (a tokenizer is known)."""
        return self.tokenizer is not None

    def exact_for(self, messages: Sequence[Message]) -> bool:
        """Whether the counts of this chat are exact: text needs a tokenizer, images a processor."""
        return self.exact and (self.processor is not None or not has_images(messages))

    def _template_kwargs(self) -> dict[str, Any]:
        """``enable_thinking`` for the template; a processor gets it only when its template reads it
        (a processor hands unknown keywords to its tokeniser call instead).  Tools when given."""
        tools = {} if self.tools is None else {"tools": self.tools}
        if self.processor is None or "enable_thinking" in str(getattr(self.processor, "chat_template", "")):
            return {"enable_thinking": self.enable_thinking, **tools}
        return tools

    def render(self, messages: Sequence[Message], generation_prompt: bool = True) -> str:
        """The prompt text the policy sees (chat template + generation prompt)."""
        if self.tokenizer is None:
            parts = [f"<|{m['role']}|>\n{text_of(m['content'])}" for m in messages]
            return "\n".join(parts) + ("\n<|assistant|>\n" if generation_prompt else "")
        if self.processor is not None:
            text: str = self.processor.apply_chat_template(
                [copy_message(m) for m in messages],
                tokenize=False,
                add_generation_prompt=generation_prompt,
                **self._template_kwargs(),
            )
            return text
        text = self._apply_template(
            _text_only(messages), tokenize=False, add_generation_prompt=generation_prompt, **self._template_kwargs()
        )
        return text

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("prompt_ids needs a tokenizer")
        if self.processor is not None:
            return _input_ids(processor_inputs(self.processor, self.render(messages), images_of(messages)))
        if has_images(messages):
            raise ValueError("a chat with images has token ids only with a processor (processor=...)")
        return self._text_prompt_ids(messages)

    def _text_prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        if self._encode is not None:  # verified equal to the template's own tokenising
            return self._encode(self.render(_text_only(messages)))
        return _input_ids(
            self._apply_template(
                _text_only(messages), tokenize=True, add_generation_prompt=True, **self._template_kwargs()
            )
        )

    def _apply_template(self, messages: Sequence[Message], **kwargs: Any) -> Any:
        """The tokenizer's chat template (set whenever a tokenizer is)."""
        assert self._template is not None
        return self._template(messages, **kwargs)

    def prompt_tokens(self, messages: Sequence[Message]) -> int:
        if self.tokenizer is None:
            return estimate_tokens(self.render(messages)) + self.image_tokens(messages)
        if self.processor is None and has_images(messages):
            return len(self._text_prompt_ids(messages)) + self.image_tokens(messages)
        return len(self.prompt_ids(messages))

    def message_tokens(self, message: Message) -> int:
        """Cost of one appended observation: the template applied to ``[message]`` alone (protocol 2.4);
        without the tools, which a template renders into a chat's opening, not into each message."""
        if self.tools is not None:
            return self.without_tools().prompt_tokens([message])
        return self.prompt_tokens([message])

    def without_tools(self) -> "TokenCounter":
        """This counter rendering no tools (same tokenizer, processor and thinking flag)."""
        if self._plain is None:
            self._plain = TokenCounter(self.tokenizer, self.enable_thinking, self.processor)
        return self._plain

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

    def image_tokens(self, messages: Sequence[Message]) -> int:
        """What the images of ``messages`` add to the rendered text's tokens: with a processor,
        each image's expansion beyond its placeholder text; without, the tile estimate."""
        return sum(self._image_cost(url) for url in image_urls(messages))

    def _image_cost(self, url: str) -> int:
        key = hashlib.sha1(url.encode("ascii", "replace")).hexdigest()
        with self._image_lock:
            if key in self._image_costs:
                self._image_costs.move_to_end(key)
                return self._image_costs[key]
        if self.processor is None:
            cost = estimate_image_tokens(*image_size(url))
        else:
            probe = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
            cost = len(self.prompt_ids(probe)) - len(self.text_ids(self.render(probe)))
        with self._image_lock:
            self._image_costs[key] = cost
            while len(self._image_costs) > _IMAGE_CACHE_SIZE:
                self._image_costs.popitem(last=False)
        return cost

    def shared_memo(self) -> SharedMemo:
        """The memo of this counter's template (tokenizer or processor, thinking flag)."""
        if self._memo is None:
            with _STATES_LOCK:
                self._memo = self._state.memos.setdefault(self._variant, SharedMemo())
        return self._memo

    @property
    def incremental(self) -> bool:
        """Whether :class:`PromptTally` may count this template's chats piece by piece."""
        if self.tokenizer is None:
            return False
        verified = self._state.incremental
        with _VERIFY_LOCK:
            if self._variant not in verified:
                verified[self._variant] = _prefix_stable(self)
            return verified[self._variant]


class SharedMemo:
    """Rendered-and-tokenised message groups of one chat template, shared by all its counters.

    Each turn the environment (context check) and the policy (prompt) count the same new messages
    behind the same opening; with this memo the second count is a lookup.  Keys hold the message
    texts themselves (no image parts), so a hit is exactly the same rendering.
    """

    def __init__(self, size: int = 4096):
        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        if key is None:
            return None
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        if key is None:
            return
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def _memo_key(head: str, messages: Sequence[Message]) -> tuple[Any, ...] | None:
    """A hashable key for rendering ``messages`` behind ``head``; None when a message carries parts."""
    if any(not isinstance(m.get("content"), str) or len(m) != 2 for m in messages):
        return None
    return (head, *((m["role"], m["content"]) for m in messages))


class PromptTally:
    """The prompt tokens of one growing chat, rendering and tokenising each message once.

    ``messages`` is the live, append-only list of the conversation.  :meth:`prompt_ids` and
    :meth:`prompt_tokens` equal ``counter.prompt_ids(messages)`` and ``counter.prompt_tokens(messages)``
    at every point; with a prefix-stable template (see :attr:`TokenCounter.incremental`) only the
    messages appended since the last call are rendered, behind the chat's opening messages (which
    stand in for the whole history), and each new image adds its cost
    (:meth:`TokenCounter.image_tokens`).  The ids of a chat with images come from the processor.
    """

    def __init__(self, counter: TokenCounter, messages: list[Message], *, incremental: bool | None = None):
        self.counter = counter
        self.messages = messages
        self.incremental = counter.incremental if incremental is None else incremental
        self._head = [dict(m) for m in messages[:2]]  # the opening (system, task) messages
        self._head_text = ""
        self._counted = 0  # messages whose tokens are in ``_ids``
        self._ids = array("q")  # tokens of messages[:_counted] without the generation prompt
        self._generation: list[int] = []  # tokens of the generation prompt
        self._images = 0  # image tokens of messages[:_counted] beyond their text

    def prompt_tokens(self) -> int:
        if self.incremental and self._extend():
            return len(self._ids) + len(self._generation) + self._images
        return self.counter.prompt_tokens(self.messages)

    def prompt_ids(self) -> list[int]:
        if self.incremental and self._extend() and not self._images:
            return self._ids.tolist() + self._generation
        return self.counter.prompt_ids(self.messages)

    def _extend(self) -> bool:
        """Tokenise the messages appended since the last call; False where that is not possible."""
        if self.messages[-1]["role"] == "assistant":  # templates may render a trailing reply specially
            return False
        memo = self.counter.shared_memo()
        if self._counted == 0:
            key = _memo_key("head", self._head)
            head = memo.get(key)
            if head is None:
                head_text = self.counter.render(self._head, generation_prompt=False)
                prompt = self.counter.render(self._head)
                head = (head_text, self.counter.text_ids(head_text), self.counter.text_ids(prompt[len(head_text) :]))
                memo.put(key, head)
            self._head_text, ids, self._generation = head
            self._ids = array("q", ids)
            self._images = self.counter.image_tokens(self._head)
            self._counted = len(self._head)
        new = self.messages[self._counted :]
        if new:
            key = _memo_key(self._head_text, new)
            ids = memo.get(key)
            if ids is None:
                text = self.counter.render(self._head + new, generation_prompt=False)
                if not text.startswith(self._head_text):
                    return False
                ids = self.counter.text_ids(text[len(self._head_text) :])
                memo.put(key, ids)
            self._ids.extend(ids)
            self._images += self.counter.image_tokens(new)
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
    ("Solve it.  ", 'Let me think.\n\nAction:\n{"name": "bash"}'),
    ("Observation from bash:\n4\n\n", " <think>hidden</think>\nvisible "),
    ("Observation from format_check:\n<|im_end|> x", "</think>\n\nFinal answer: 5"),
    ("Observation: é ü 你好\t", "\n\n"),
    ("  leading", "done"),
]


class _TemplateState:
    """What is learnt once per tokenizer or processor object and shared by all counters built on
    it: whether its chats count incrementally (per thinking flag and tools), whether its Rust
    encoder may be called directly, and its count memos (per thinking flag and tools)."""

    def __init__(self) -> None:
        self.incremental: dict[Any, bool] = {}
        self.direct: bool | None = None
        self.memos: dict[Any, SharedMemo] = {}


_STATES: "weakref.WeakKeyDictionary[Any, _TemplateState]" = weakref.WeakKeyDictionary()
#: guards lookups in ``_STATES`` and the memo tables only; never held while rendering or tokenising
_STATES_LOCK = threading.Lock()
#: held while a template is probed (:func:`_prefix_stable` renders and tokenises, taking
#: ``_STATES_LOCK`` on the way), so concurrent counters probe each template once
_VERIFY_LOCK = threading.Lock()


def _state_of(owner: Any) -> _TemplateState:
    """The shared state of ``owner``; an object that cannot be weakly referenced gets its own."""
    with _STATES_LOCK:
        try:
            state = _STATES.get(owner)
            if state is None:
                state = _STATES[owner] = _TemplateState()
        except TypeError:
            state = _TemplateState()
    return state


def _prefix_stable(counter: TokenCounter) -> bool:
    """Count a probe chat both ways, step by step; any difference (or error) means full rendering."""
    messages: list[Message] = [
        {"role": "system", "content": "You are a careful solver. "},
        {"role": "user", "content": "Question: what is 2+2?\n"},
    ]
    try:
        tally = PromptTally(counter, messages, incremental=True)
        for index, (user, assistant) in enumerate(_PROBE):
            if index != 2 and not _same_ids(tally, counter.prompt_ids(messages)):  # 2: two steps at once
                return False
            messages += [{"role": "assistant", "content": assistant}, {"role": "user", "content": user}]
        if not _same_ids(tally, counter.prompt_ids(messages)):
            return False
        return counter.processor is None or _images_add_up(counter)
    except Exception:  # a template that cannot render the probe is simply counted in full
        return False


def _images_add_up(counter: TokenCounter) -> bool:
    """Whether the processor's count of a chat with images (in the opening messages and later
    ones) is the text's tokens plus each image's own cost."""
    from PIL import Image

    image = image_part(Image.new("RGB", (56, 84), (200, 40, 40)))
    messages: list[Message] = [
        {"role": "system", "content": "Read the page."},
        {"role": "user", "content": [text_part("Question: what is it?"), image]},
    ]
    tally = PromptTally(counter, messages, incremental=True)
    for turn in range(2):
        if not _same_count(tally, len(counter.prompt_ids(messages))):
            return False
        messages += [
            {"role": "assistant", "content": f"Action {turn}"},
            {"role": "user", "content": [text_part("Observation from view:\nshown"), image]},
        ]
    return _same_count(tally, len(counter.prompt_ids(messages)))


def _same_count(tally: PromptTally, expected: int) -> bool:
    return tally._extend() and len(tally._ids) + len(tally._generation) + tally._images == expected


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
        base = next(c for c in cls.__mro__[1:] if hasattr(c, method) and c.__name__ != "ThreadSafeHFTokenizerMixin")
        bound: Callable[..., Any] = getattr(base, method).__get__(tokenizer, base)
        return bound
    found: Callable[..., Any] = getattr(tokenizer, method)
    return found


def _direct_encoder(tokenizer: Any) -> Callable[[str], list[int]] | None:
    """The Rust tokenizer called directly, when it gives exactly ``tokenizer.encode``'s ids.

    Not through vLLM's tokenizer pool (see :func:`_unpooled`), and as a one-text ``encode_batch``:
    the Rust ``encode`` holds the interpreter lock while it works, ``encode_batch`` releases it, so
    env threads tokenise on all cores at once (here: 2 threads 2.0x, 1 thread 1.08x faster than
    ``encode``).  Checked once per tokenizer on probe texts (chat templates included) and not used
    on any difference.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not callable(getattr(backend, "encode_batch", None)):
        return None

    def encode(text: str) -> list[int]:
        ids: list[int] = backend.encode_batch([text], add_special_tokens=False)[0].ids
        return ids

    state = _state_of(tokenizer)
    if state.direct is not None:
        return encode if state.direct else None
    probes = [u + a for u, a in _PROBE] + ["".join(u + a for u, a in _PROBE), ""]
    try:
        template = _unpooled(tokenizer, "apply_chat_template")
        chat = [
            {"role": "system", "content": _PROBE[0][0]},
            {"role": "user", "content": _PROBE[3][0]},
            {"role": "assistant", "content": _PROBE[1][1]},
            {"role": "user", "content": _PROBE[2][0]},
        ]
        same = all(encode(t) == list(tokenizer.encode(t, add_special_tokens=False)) for t in probes) and (
            encode(template(chat, tokenize=False, add_generation_prompt=True))
            == _input_ids(template(chat, tokenize=True, add_generation_prompt=True))
        )
    except Exception:  # any tokenizer or template that cannot take the probe keeps the plain path
        same = False
    state.direct = same
    return encode if same else None


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8", "replace")) / 4)
