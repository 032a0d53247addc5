"""A run's starting objects kept out of full garbage collections while its generations run
(agent_envs/es/frozen_heap.py): what the run makes is still collected, everything is collectable again
after the run, and a freeze someone else made stays."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
from test_es_history import Scorer, make_model

from agent_envs.es.frozen_heap import run_heap_frozen
from agent_envs.es.history import ESConfig
from agent_envs.es.perturb import SeededPerturber
from agent_envs.es.population import ESTrainer, evaluate_member


class Cycle:
    """An object only a reference cycle keeps alive: freed by the collector alone."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def nothing_frozen() -> None:
    """Start from an unfrozen heap (an in-process vLLM engine of an earlier test freezes its own; a freeze
    only spares objects full passes, so undoing it changes nothing another test sees)."""
    gc.unfreeze()


def collected(ref: weakref.ref[Any]) -> bool:
    gc.collect()
    return ref() is None


def test_the_heap_at_the_start_is_frozen_and_what_the_run_makes_is_collected() -> None:
    before = Cycle()
    before_ref = weakref.ref(before)
    with run_heap_frozen():
        assert gc.get_freeze_count() > 0
        del before
        assert not collected(before_ref)  # frozen: no pass looks at it
        made = Cycle()
        made_ref = weakref.ref(made)
        del made
        assert collected(made_ref)  # made inside the run: collected as usual
    assert gc.get_freeze_count() == 0 and collected(before_ref)  # unfrozen after the run


def test_a_freeze_made_before_stays() -> None:
    gc.freeze()  # e.g. vLLM's engine core in this process freezes its startup heap
    try:
        with run_heap_frozen():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_trainers_generations_run_with_the_heap_frozen(tmp_path: Path) -> None:
    model = make_model()
    cfg = ESConfig(env_id="toy", generations=2, population=2, case_batch_size=2, seed=7, alpha=0.05)
    frozen: list[int] = []

    def evaluate(batch: Any, seed: int, generation: int, member: int) -> Any:
        frozen.append(gc.get_freeze_count())
        return evaluate_member(
            None, cfg.env_id, batch, seed, generation=generation, member=member, rollout=Scorer(model)
        )

    tasks = [{"id": f"t{i}", "x": i / 5} for i in range(4)]
    trainer = ESTrainer(cfg, SeededPerturber(model), tasks, evaluate, str(tmp_path / "h.json"), log=lambda _: None)
    trainer.run()
    assert len(frozen) == 4 and min(frozen) > 0
    assert gc.get_freeze_count() == 0
