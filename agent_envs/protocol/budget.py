"""The token-budget rules every layer applies the same way (docs/protocol.md#budgets-and-termination):
what a request's ``max_tokens`` caps, and whether a prompt still fits the context window.

The environment checks the next prompt before asking for it; engine policies check every prompt
before it reaches the engine; a server refuses what cannot fit.  All three call these functions.
"""

from __future__ import annotations


def token_cap(max_tokens: int | None) -> int | None:
    """The generation cap a request's ``max_tokens`` sets: None when it is None, zero or negative."""
    return max_tokens if max_tokens is not None and max_tokens > 0 else None


def generation_reserve(max_tokens: int | None) -> int:
    """Tokens the context must leave free: ``max_tokens``, or 1 when uncapped (protocol 2.4 step 1)."""
    return token_cap(max_tokens) or 1


def context_detail(prompt_tokens: int, max_tokens: int | None, max_model_len: int | None) -> str:
    """What a ``context_length_exceeded`` outcome says beside the reason: the numbers that did not fit."""
    return f"prompt_tokens {prompt_tokens} + max_tokens {max_tokens} > max_model_len {max_model_len}"


def exceeds_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int | None) -> bool:
    """True when the prompt leaves less than the generation reserve free (unknown window: fits)."""
    return max_model_len is not None and prompt_tokens + generation_reserve(max_tokens) > max_model_len
