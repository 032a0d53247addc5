"""Microbatching, context fit and group-failure retry of the lockstep engine base (protocol 4.7, 2.4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_envs.policy.base import Completion, EngineFailed, GenerationRequest
from agent_envs.policy.batching import BatchedEnginePolicy, Prepared, microbatch
from agent_envs.policy.hf import smollm2_tokenizer as load_tokenizer


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    try:
        return load_tokenizer()
    except FileNotFoundError as exc:
        pytest.skip(f"no SmolLM2 tokenizer: {exc}")


def test_microbatch_examples() -> None:
    assert microbatch([], 10) == []
    assert microbatch([4, 4, 4], 0) == [[0, 1, 2]]
    assert microbatch([4, 4, 4], 8) == [[0, 1], [2]]  # reaching the budget closes the group
    assert microbatch([4, 5, 4], 8) == [[0], [1], [2]]  # adding 5 would exceed: new group
    assert microbatch([3, 20, 3], 8) == [[0], [1], [2]]  # oversized stands alone
    assert microbatch([20], 8) == [[0]]


@given(st.lists(st.integers(1, 50), max_size=40), st.integers(1, 100))
def test_microbatch_invariants(sizes: list[int], budget: int) -> None:
    groups = microbatch(sizes, budget)
    assert [i for g in groups for i in g] == list(range(len(sizes)))  # order kept, nothing lost
    for g in groups:
        total = sum(sizes[i] for i in g)
        assert total <= budget or len(g) == 1
    for g, nxt in zip(groups, groups[1:]):  # a group only closes when full or the next would overflow
        total = sum(sizes[i] for i in g)
        assert total >= budget or total + sizes[nxt[0]] > budget


class RecordingEngine(BatchedEnginePolicy):
    """A deterministic engine double: echoes the user message; a group containing "poison" raises,
    and "always-fails" raises even alone."""

    name = "recording"

    def __init__(self, tokenizer, budget: int, max_model_len: int = 4096):
        super().__init__(tokenizer, None, max_model_len, budget)
        self.calls: list[list[str]] = []

    def _generate_group(self, group: list[Prepared]) -> list[Completion]:
        texts = [p.request.messages[-1]["content"] for p in group]
        self.calls.append(texts)
        if "engine-dies" in texts:
            raise EngineFailed("the engine failed during a call")
        if "always-fails" in texts:
            raise ValueError("engine rejected the prompt")
        if "poison" in texts and len(texts) > 1:
            raise RuntimeError("group crashed")
        return [Completion(text=t, token_ids=[1], prompt_tokens=len(p.prompt_ids)) for t, p in zip(texts, group)]


def req(text: str, max_tokens: int = 16) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], seed=1, max_tokens=max_tokens)


def test_groups_follow_the_token_budget(smollm2_tokenizer) -> None:
    engine = RecordingEngine(smollm2_tokenizer, budget=0)
    size = engine.prepare(req("a")).size
    engine = RecordingEngine(smollm2_tokenizer, budget=2 * size)
    out = engine.generate([req("a"), req("b"), req("c")])
    assert [c.text for c in out] == ["a", "b", "c"]
    assert engine.calls == [["a", "b"], ["c"]]


def test_failed_group_is_retried_request_by_request(smollm2_tokenizer) -> None:
    engine = RecordingEngine(smollm2_tokenizer, budget=0)
    out = engine.generate([req("a"), req("poison"), req("always-fails"), req("d")])
    assert engine.calls[0] == ["a", "poison", "always-fails", "d"]
    assert engine.calls[1:] == [["a"], ["poison"], ["always-fails"], ["d"]]
    assert [c.text for c in out[:2]] == ["a", "poison"] and out[3].text == "d"
    assert out[2].error == "request_error"
    assert out[2].error_message == "ValueError: engine rejected the prompt"


def test_an_engine_failure_fails_the_whole_group_without_retrying_on_that_engine(smollm2_tokenizer) -> None:
    engine = RecordingEngine(smollm2_tokenizer, budget=0)
    out = engine.generate([req("a"), req("engine-dies"), req("c")])
    assert engine.calls == [["a", "engine-dies", "c"]]  # no request-by-request retry
    assert {(c.error, c.error_message) for c in out} == {
        ("request_error", "EngineFailed: the engine failed during a call")
    }


def test_context_fit_refuses_before_the_engine(smollm2_tokenizer) -> None:
    engine = RecordingEngine(smollm2_tokenizer, budget=0, max_model_len=64)
    prompt = engine.prepare(req("x", max_tokens=1)).prompt_ids
    fits = 64 - len(prompt)
    out = engine.generate([req("x", max_tokens=fits), req("y", max_tokens=fits + 1), req("z", max_tokens=None)])
    assert engine.calls == [["x", "z"]]  # y never reached the engine; uncapped reserves 1 token
    assert out[1].error == "context_length_exceeded" and out[1].prompt_tokens == len(prompt)
    assert out[0].ok and out[2].ok
