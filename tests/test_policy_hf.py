"""TransformersPolicy on the CPU with the embedded SmolLM2-135M: the protocol's seeded sampling."""

from __future__ import annotations

import pytest
import torch

from agent_envs.policy.base import GenerationRequest
from agent_envs.policy.hf import default_cpu_policy, process_logits
from agent_envs.policy.sampling import SamplingConfig

QUESTION = [{"role": "user", "content": "List three colours, one per line."}]


@pytest.fixture(scope="module")
def policy():
    try:
        p = default_cpu_policy(num_threads=1)
    except FileNotFoundError as exc:
        pytest.skip(f"default CPU model unavailable: {exc}")
    yield p
    p.close()


def req(seed: int, max_tokens: int = 12, stop: list[str] | None = None, content: str | None = None):
    messages = [{"role": "user", "content": content}] if content else QUESTION
    return GenerationRequest(messages=messages, seed=seed, max_tokens=max_tokens, stop=stop or ["Observation:"])


def test_seeded_and_independent_of_batch_composition(policy) -> None:
    alone = policy.generate([req(5)])[0]
    batch = policy.generate([req(9, content="Say hi."), req(5), req(6)])
    assert alone.ok and len(alone.token_ids) > 0 and alone.prompt_tokens == len(policy.counter.prompt_ids(QUESTION))
    assert batch[1].token_ids == alone.token_ids and batch[1].text == alone.text
    assert batch[2].token_ids != alone.token_ids  # another seed, another sample
    assert len(alone.token_ids) <= 12 and (alone.finish_reason == "length") == (len(alone.token_ids) == 12)


def test_stop_string_truncates_like_the_engine(policy) -> None:
    full = policy.generate([req(11, max_tokens=24)])[0]
    assert len(full.text) > 6, full.text
    stop = full.text[len(full.text) // 2 :][:3]
    cut = policy.generate([req(11, max_tokens=24, stop=[stop])])[0]
    assert cut.text == full.text[: full.text.find(stop)]
    assert cut.finish_reason == "stop" and len(cut.token_ids) <= len(full.token_ids)


def test_context_fit_and_uncapped_requests(policy) -> None:
    prompt = len(policy.counter.prompt_ids(QUESTION))
    over = req(1, max_tokens=policy.max_model_len - prompt + 1)
    out = policy.generate([over])[0]
    assert out.error == "context_length_exceeded" and out.prompt_tokens == prompt
    assert policy.max_model_len == 8192


def test_sampling_filters() -> None:
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    none = torch.tensor([], dtype=torch.long)
    kept = lambda **kw: torch.isfinite(process_logits(logits, none, none, SamplingConfig(**kw))).tolist()  # noqa: E731
    assert kept(top_k=2, presence_penalty=0) == [True, True, False, False, False]
    assert kept(top_k=-1, top_p=0.7, presence_penalty=0) == [True, True, False, False, False]
    assert kept(top_k=-1, min_p=0.2, presence_penalty=0) == [True, True, False, False, False]
    assert kept(temperature=0.0, presence_penalty=0) == [True, False, False, False, False]
    # presence penalty 2 applies once per token already generated, however often it appeared
    penalised = process_logits(logits, none, torch.tensor([0, 0, 3]), SamplingConfig(top_k=-1))
    assert penalised.tolist() == [2.0, 3.0, 2.0, -1.0, 0.0]
    # repetition penalty divides positive and multiplies negative logits of seen tokens (prompt too)
    rep = process_logits(
        torch.tensor([4.0, -1.0, 1.0]),
        torch.tensor([0]),
        torch.tensor([1]),
        SamplingConfig(top_k=-1, presence_penalty=0, repetition_penalty=2.0),
    )
    assert rep.tolist() == [2.0, -2.0, 1.0]


def test_batch_decode_pads_correctly_and_is_repeatable(policy) -> None:
    """Batched decoding (opt-in): a left-padded short prompt decodes as it does alone (greedy), the
    same group gives the same completions twice, and every request keeps its own budget."""
    from agent_envs.policy.hf import TransformersPolicy

    greedy = SamplingConfig(temperature=0.0, presence_penalty=0.0)
    batched = TransformersPolicy(
        policy.source, model=policy.model, tokenizer=policy.tokenizer, sampling=greedy, batch_decode=True
    )
    single = TransformersPolicy(policy.source, model=policy.model, tokenizer=policy.tokenizer, sampling=greedy)
    long_prompt = "Write a short poem about the sea, the wind and a small boat, in four lines."
    group = [req(1, max_tokens=8, content="Say hi."), req(2, max_tokens=8, content=long_prompt)]
    together = batched.generate(group)
    assert [c.token_ids for c in together] == [single.generate([r])[0].token_ids for r in group]

    batched.sampling = policy.sampling
    group = [req(5, max_tokens=4), req(9, content="Say hi."), req(6, max_tokens=12)]
    first, again = batched.generate(group), batched.generate(group)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [len(c.token_ids) <= r.max_tokens for c, r in zip(first, group)] == [True] * 3
    assert len(first[0].token_ids) == 4 and first[0].finish_reason == "length"
