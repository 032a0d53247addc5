"""A single-engine ES run steps every member's environments on one pool of worker threads for the
whole run (``agent_envs.esrun.run.member_env_workers``), not on a pool each member's rollouts start
every generation: 16 members x 16 episodes started 256 threads before a generation's first request;
it keeps the environments themselves on one shelf for the whole run (reset by every generation,
closed at the run's end), instead of 256 ``gym.make`` every generation; and it runs every member's
async episodes on one event loop, not one per member thread (benchmarks/bench_es_loop_host.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Sequence

import pytest

import agent_envs.esrun.run as esrun
from agent_envs.envs.react import ReActEnv
from agent_envs.es.lowrank import Target
from agent_envs.esrun.settings import parse_settings
from agent_envs.policy.base import Completion, GenerationRequest, Policy


class AdapterEcho(Policy):
    """Answers every turn with the same text; holds adapters by name; notes the threads that warm."""

    name = "adapter-echo"

    def __init__(self) -> None:
        self.adapters: dict[str, int] = {}
        self.threads: set[str] = set()
        #: the threads whose event loops asked for generations
        self.loops: set[str] = set()
        self.lock = threading.Lock()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return [Completion(text="I am not sure yet.", finish_reason="stop", engine=self.name) for _ in requests]

    async def agenerate(self, request: GenerationRequest) -> Completion:
        with self.lock:
            self.loops.add(threading.current_thread().name)
        return self.generate([request])[0]

    def warm(self, request: GenerationRequest) -> None:
        with self.lock:
            self.threads.add(threading.current_thread().name)

    def add_adapter(self, name: str, path: Any) -> None:
        self.adapters[name] = len(self.adapters) + 1

    def lora_id(self, name: str) -> int:
        return self.adapters[name]

    def remove_adapter(self, name: str) -> None:
        self.adapters.pop(name, None)


class NoWeights:
    """The low-rank backend's calls, with nothing behind them."""

    perturbation_kind = "lowrank"
    tp_size = 1

    def __init__(self, engine: Any, rank: int) -> None:
        self.rank, self.targets = rank, [Target("model.layers.0.mlp.down_proj.weight", 4, 4)]
        self.base_checksum = "0" * 64

    def fingerprint(self) -> str:
        return "none"

    def update(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [{}]

    def refresh(self, *args: Any) -> None:
        return None


def fake_engine_settings(perturbation: str, monkeypatch: pytest.MonkeyPatch, policy: Policy, tmp_path: Path) -> Any:
    """An ES run's settings (2 members x 3 tasks, 2 turns, 3 generations), its engine and backend
    swapped for ``policy`` and backends with no weights."""
    monkeypatch.setattr(esrun, "build_policy", lambda settings, engine_kwargs: policy)
    monkeypatch.setattr(esrun, "VLLMLowRank", NoWeights)
    monkeypatch.setattr(esrun, "VLLMPerturbation", lambda engine, **kw: NoWeightsFull())
    monkeypatch.setattr(esrun, "choose_lora_kernel", lambda kernel, population=None: "vllm")
    monkeypatch.setattr(esrun, "use_tuned", lambda *args: "no kernels")
    return parse_settings(
        [
            *("--model", "none", "--train", "builtin", "--env", "MATH-ReAct-v0", "--history", str(tmp_path / "h.json")),
            *("--population", "2", "--case-batch", "3", "--generations", "3", "--max-turns", "2"),
            *("--sandbox", "none", "--toy-reward", "--eval-interval", "0", "--mode", "async"),
            *(("--perturbation", "lowrank", "--rank", "2") if perturbation == "lowrank" else ()),
        ]
    )


@pytest.mark.parametrize("perturbation", ["lowrank", "full"])
def test_members_step_their_envs_on_one_pool_for_the_whole_run(
    perturbation: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    policy = AdapterEcho()
    settings = fake_engine_settings(perturbation, monkeypatch, policy, tmp_path)
    before = {t.name for t in threading.enumerate()}
    with esrun.open_run(settings) as run:
        assert run.trainer is not None
        records = [run.trainer.step(g) for g in range(2)]
    assert all(len(s["result"]) == 3 for r in records for s in r["samples"])
    assert policy.threads and all(name.startswith("es-env") for name in policy.threads), policy.threads
    assert not [t.name for t in threading.enumerate() if t.name.startswith("es-env") and t.name not in before]
    # every member's episodes on the run's one event loop, which ended with the run
    assert policy.loops == {"es-episodes"}, policy.loops
    assert "es-episodes" not in {t.name for t in threading.enumerate()}


@pytest.mark.parametrize("perturbation", ["lowrank", "full"])
def test_the_members_envs_are_built_once_for_the_whole_run_and_closed_at_its_end(
    perturbation: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built: list[ReActEnv] = []
    closed: list[ReActEnv] = []
    init, close = ReActEnv.__init__, ReActEnv.close

    def counted_init(self: ReActEnv, **kwargs: Any) -> None:
        built.append(self)
        init(self, **kwargs)

    def counted_close(self: ReActEnv) -> None:
        closed.append(self)
        close(self)

    monkeypatch.setattr(ReActEnv, "__init__", counted_init)
    monkeypatch.setattr(ReActEnv, "close", counted_close)
    settings = fake_engine_settings(perturbation, monkeypatch, AdapterEcho(), tmp_path)
    with esrun.open_run(settings) as run:
        assert run.trainer is not None
        records = [run.trainer.step(g) for g in range(3)]
        closed_before_end = len(closed)
    assert all(len(s["result"]) == 3 for r in records for s in r["samples"])
    # 3 generations: every member's 3 episodes at once in low-rank ES, one member after another in full-rank
    assert len(built) == (2 * 3 if perturbation == "lowrank" else 3), len(built)
    assert sorted(map(id, closed[closed_before_end:])) == sorted(map(id, built))  # all closed at the run's end


class NoWeightsFull:
    """The full-rank backend's calls, with nothing behind them."""

    tp_size = 1

    def fingerprint(self) -> str:
        return "none"

    def status(self) -> list[Any]:
        return [{}]

    def apply(self, seed: int, sigma: float) -> list[Any]:
        return [{}]

    def revert(self, seed: int, sigma: float) -> list[Any]:
        return [{}]

    def update(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [{}]
