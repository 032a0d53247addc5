"""TokenCounter against the real SmolLM2 tokenizer (transformers 5 returns dict-like encodings)."""
from __future__ import annotations

import pytest

from agent_envs.policy.hf import smollm2_tokenizer
from agent_envs.tokens import TokenCounter, estimate_tokens

MESSAGES = [{"role": "system", "content": "You solve math."}, {"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    try:
        return TokenCounter(smollm2_tokenizer())
    except FileNotFoundError as exc:
        pytest.skip(f"no SmolLM2 tokenizer: {exc}")


def test_render_adds_the_generation_prompt(counter: TokenCounter) -> None:
    text = counter.render(MESSAGES)
    assert text.startswith("<|im_start|>system\nYou solve math.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")


def test_prompt_ids_are_plain_ints_matching_the_rendered_text(counter: TokenCounter) -> None:
    ids = counter.prompt_ids(MESSAGES)
    assert all(type(i) is int for i in ids)
    assert ids == counter.tokenizer.encode(counter.render(MESSAGES), add_special_tokens=False)
    assert counter.prompt_tokens(MESSAGES) == len(ids)
    assert counter.exact


def test_message_cost_is_the_template_of_that_message_alone(counter: TokenCounter) -> None:
    observation = {"role": "user", "content": "Observation from bash:\n4"}
    assert counter.message_tokens(observation) == len(counter.prompt_ids([observation]))
    assert counter.text_tokens("Observation:") == len(counter.tokenizer.encode("Observation:", add_special_tokens=False))


def test_without_a_tokenizer_counts_are_estimates() -> None:
    counter = TokenCounter(None)
    assert not counter.exact
    assert counter.text_tokens("abcdefgh") == 2 == estimate_tokens("abcdefgh")
    assert counter.text_tokens("é") == 1  # UTF-8 bytes / 4, rounded up
    with pytest.raises(ValueError, match="needs a tokenizer"):
        counter.prompt_ids(MESSAGES)
