"""The driver side of the ES worker calls (agent_envs/es/worker.py): after a weight change the
prefix cache must be reset, and a reset the engine refuses while it still holds KV blocks is asked
again until the engine has drained, or refused with a clear error.

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
