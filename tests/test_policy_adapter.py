"""``GenerationRequest.adapter`` on the engine policies and the :class:`AdapterPolicy` view: a request
names an adapter, reaches the engine with it, and an unknown name is a ``request_error`` (never a
silent fall-back to the base weights)."""

from __future__ import annotations

import asyncio

import pytest

from agent_envs.policy.adapter import AdapterPolicy
from agent_envs.policy.base import REQUEST_ERROR, Completion, GenerationRequest
from agent_envs.policy.batching import BatchedEnginePolicy, Prepared
from agent_envs.policy.hf import smollm2_tokenizer as load_tokenizer


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return load_tokenizer()  # the embedded model's (scripts/install.sh installs it)


class AdapterEngine(BatchedEnginePolicy):
    """Answers with the adapter each request reached the engine with."""

    name = "adapter-engine"

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, None, 4096, 0)
        self.seen: list[tuple[str | None, str, int | None]] = []

    def _generate_group(self, group: list[Prepared]) -> list[Completion]:
        self.seen += [(p.request.adapter, p.request.key, p.request.seed) for p in group]
        return [Completion(text=str(p.request.adapter), token_ids=[1]) for p in group]


def request(key: str, adapter: str | None = None) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": "hi"}], seed=7, key=key, adapter=adapter)


def test_engine_policy_serves_registered_adapters_and_refuses_unknown_ones(smollm2_tokenizer) -> None:
    engine = AdapterEngine(smollm2_tokenizer)
    engine.adapters["member-0"] = object()
    out = engine.generate([request("a", "member-0"), request("b"), request("c", "member-9")])
    assert [c.text for c in out[:2]] == ["member-0", "None"]
    assert out[2].error == REQUEST_ERROR and "no adapter named 'member-9' (member-0)" in out[2].error_message
    assert [s[0] for s in engine.seen] == ["member-0", None]  # the unknown one never reached the engine
    empty = AdapterEngine(smollm2_tokenizer).generate([request("d", "x")])[0]
    assert "none registered" in empty.error_message


def test_adapter_view_routes_every_request_and_keeps_members_apart(smollm2_tokenizer) -> None:
    engine = AdapterEngine(smollm2_tokenizer)
    engine.adapters.update({"m0": object(), "m1": object()})
    views = [AdapterPolicy(engine, "m0"), AdapterPolicy(engine, "m1")]
    assert views[0].tokenizer is smollm2_tokenizer and views[0].max_model_len == 4096 and views[0].name == engine.name
    assert views[1].describe()["adapter"] == "m1"
    views[0].warm(request("ep"))
    assert [c.text for c in views[0].generate([request("ep")])] == ["m0"]
    assert asyncio.run(views[1].agenerate(request("ep"))).text == "m1"
    assert engine.seen[0] == ("m0", "m0/ep", 7) and engine.seen[1] == ("m1", "m1/ep", 7)  # same seed, own key
    with pytest.raises(ValueError, match="non-empty"):
        AdapterPolicy(engine, "")
