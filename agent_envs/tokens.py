"""Token counting shared by environments and policies.

With a Hugging Face tokenizer every count is exact and matches what the policy renders (chat
template with ``add_generation_prompt=True`` and ``enable_thinking`` off, as the protocol does).
Without one, counts are estimates (UTF-8 bytes / 4, rounded up) and every record says so through
``token_counts_exact=False``; budgets are then approximate.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

Message = dict[str, str]


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

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text the policy sees (chat template + generation prompt)."""
        if self.tokenizer is None:
            parts = [f"<|{m['role']}|>\n{m['content']}" for m in messages]
            return "\n".join(parts) + "\n<|assistant|>\n"
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True, enable_thinking=self.enable_thinking
        )

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("prompt_ids needs a tokenizer")
        return _input_ids(
            self.tokenizer.apply_chat_template(
                list(messages), tokenize=True, add_generation_prompt=True, enable_thinking=self.enable_thinking
            )
        )

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
        return len(self.tokenizer.encode(text, add_special_tokens=False))


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8", "replace")) / 4)
