"""The driver side of the ES worker calls (agent_envs/es/worker.py): after a weight change the
cached KV must be forgotten.  Through one of the package's vLLM policies that is a new cache salt
(nothing to wait for: tests/test_es_vllm.py shows on a real engine that the old blocks are then
unreachable); on a bare engine the prefix cache is reset, and a reset the engine refuses while it
still holds KV blocks is asked again until the engine has drained, or refused with a clear error.

The engine here is a stand-in that refuses a given number of resets: a real vLLM engine cannot be
put into that state on demand (it was seen on an H200 in async mode, where the GPU benchmark runs
the real path)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_envs.es import worker
from agent_envs.es.worker import VLLMPerturbation


class Engine:
    """``collective_rpc`` answers like one worker; ``reset_prefix_cache`` refuses ``busy`` times."""

    def __init__(self, busy: int) -> None:
        self.busy, self.resets, self.calls = busy, 0, []

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        self.calls.append(method)
        return [{"ok": True, "tp_size": 1, "empty_tensors": []}]

    def reset_prefix_cache(self) -> bool:
        self.resets += 1
        return self.resets > self.busy


def test_a_refused_reset_is_asked_again_until_the_engine_has_drained() -> None:
    engine = Engine(busy=3)
    es = VLLMPerturbation(engine)
    assert es.revert(7, 0.01) == [{"ok": True, "tp_size": 1, "empty_tensors": []}]
    assert engine.resets == 4 and es.reset_retries == 3
    es.update([1, 2], [0.5, -0.5], 0.001)
    assert engine.resets == 5 and es.reset_retries == 3  # a free engine resets at once


def test_a_reset_still_refused_at_the_deadline_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "RESET_DEADLINE_S", 0.05)
    engine = Engine(busy=10**9)
    es = VLLMPerturbation(engine)
    with pytest.raises(RuntimeError, match=r"reset after es_apply failed \d+ times in 0 s: requests still hold KV"):
        es.apply(7, 0.01)
    assert engine.calls[-1] == "es_apply" and engine.resets > 1


class SaltedEngine(Engine):
    """An engine handle that takes a new cache salt (as ``VLLMPolicy`` and ``AsyncVLLMPolicy`` do)."""

    def __init__(self) -> None:
        super().__init__(busy=10**9)  # a reset would never succeed: only the salt can work
        self.salts = 0

    def renew_cache_salt(self) -> str:
        self.salts += 1
        return f"salt-{self.salts}"


def test_a_policy_handle_gets_a_new_salt_after_every_weight_change_and_no_reset() -> None:
    engine = SaltedEngine()
    es = VLLMPerturbation(engine)
    es.apply(7, 0.01)
    es.revert(7, 0.01)
    es.update([1, 2], [0.5, -0.5], 0.001)
    assert engine.salts == 3 and engine.resets == 0 and es.reset_retries == 0
    assert es.last_forget["cache"] == "salt" and es.last_forget["reset_retries"] == 0
    es.status()  # no weight change: no new salt
    assert engine.salts == 3
