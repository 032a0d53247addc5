"""TokenCounter against the real SmolLM2 tokenizer (transformers 5 returns dict-like encodings)."""

from __future__ import annotations

import pytest

from agent_envs.policy.hf import smollm2_tokenizer
from agent_envs.core.tokens import TokenCounter, estimate_tokens

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
    assert counter.text_tokens("Observation:") == len(
        counter.tokenizer.encode("Observation:", add_special_tokens=False)
    )


def test_without_a_tokenizer_counts_are_estimates() -> None:
    counter = TokenCounter(None)
    assert not counter.exact
    assert counter.text_tokens("abcdefgh") == 2 == estimate_tokens("abcdefgh")
    assert counter.text_tokens("é") == 1  # UTF-8 bytes / 4, rounded up
    with pytest.raises(ValueError, match="needs a tokenizer"):
        counter.prompt_ids(MESSAGES)


# ----- incremental counting: identical to rendering the whole chat --------------------------------
#: a Qwen3-style template written for this test: ChatML, past reasoning dropped from assistant
#: turns, and an empty think block in the generation prompt when thinking is off
QWEN_STYLE = (
    "{%- for m in messages %}{%- if m.role == 'assistant' %}{%- set c = m.content %}"
    "{%- if '</think>' in c %}{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + c + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)
#: not prefix-stable: the header counts the messages
COUNTING = (
    "{{- 'messages: ' + messages|length|string + '\\n' }}{%- for m in messages %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def with_template(tokenizer, template: str | None):
    import copy

    if template is None:
        return tokenizer
    clone = copy.deepcopy(tokenizer)
    clone.chat_template = template
    return clone


def completion(rng, turn: int) -> str:
    """Long, varied assistant text with the edge cases a model produces: think blocks, stray
    special-token text, trailing whitespace, non-ASCII."""
    words = ["x = 3", "so", "the", "answer", "é", "你好", "</think>", "<think>", "<|im_end|>", "\n\n", "  ", "\t"]
    body = " ".join(rng.choice(words) for _ in range(rng.randint(30, 200)))
    return f"Turn {turn}: {body}" + rng.choice(["", " ", "\n", "\n\n"])


@pytest.mark.parametrize(
    "template, stable",
    [(None, True), (QWEN_STYLE, True), (COUNTING, False)],
    ids=["smollm2", "qwen-style", "not-prefix-stable"],
)
@pytest.mark.parametrize("thinking", [False, True])
def test_incremental_counts_equal_full_rendering_over_long_episodes(counter, template, stable, thinking) -> None:
    import random

    import gymnasium as gym

    tokenizer = with_template(counter.tokenizer, template)
    env = gym.make(
        "MATH-ReAct-v0",
        tokenizer=tokenizer,
        enable_thinking=thinking,
        max_turns=45,
        max_model_len=10**7,
        sandbox="none",
    )
    full = TokenCounter(tokenizer, enable_thinking=thinking)
    assert full.incremental is stable
    rng = random.Random(7)
    for episode in range(1):
        env.reset(seed=episode)
        ep = env.unwrapped._ep
        checked = 0
        while True:
            assert ep.tally.prompt_tokens() == full.prompt_tokens(ep.messages)
            checked += 1
            _, _, terminated, truncated, _ = env.step(completion(rng, ep.turn))
            if terminated or truncated:
                break
        assert checked == 45 and ep.termination_reason == "max_turns"
    env.close()


def test_policy_prompt_cache_matches_full_rendering_per_episode_key(counter) -> None:
    """A policy sees each episode's whole chat again every turn; its cache must give the same ids as
    rendering it, also when a key is reused by a different episode or the chat is edited."""
    import random

    from agent_envs.core.tokens import PromptCache

    cache, rng = PromptCache(counter, size=2), random.Random(3)
    chats = {
        key: [{"role": "system", "content": "Solve."}, {"role": "user", "content": f"Task {key}"}]
        for key in ("a", "b", "c")
    }
    for turn in range(6):
        for key, chat in chats.items():
            assert cache.prompt_ids(key, chat) == counter.prompt_ids(chat), (turn, key)
            chat += [
                {"role": "assistant", "content": completion(rng, turn)},
                {"role": "user", "content": f"Observation from bash:\n{turn}"},
            ]
    edited = chats["a"][:3] + [{"role": "user", "content": "something else"}]
    assert cache.prompt_ids("a", edited) == counter.prompt_ids(edited)
    assert cache.prompt_ids("", chats["b"]) == counter.prompt_ids(chats["b"])
