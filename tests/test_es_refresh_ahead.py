"""The next generation's adapters written during the rollouts (agent_envs/es/refresh_ahead.py) through the
worker's own calls (``es_lowrank_prefetch(..., refresh=)``, ``es_lowrank_refresh``, ``es_lowrank_update``)
on vLLM-shaped LoRA structures: the same CPU adapters, GPU slots and update bits as a refresh that writes
them itself, the slots untouched until the refresh (the rollouts read them), and a refresh that still does
it all itself, saying why, wherever writing ahead cannot apply.  The real engine's path is checked bit for
bit by scripts/es_lowrank_check.py and the replay test (tests/test_es_lowrank_vllm.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_es_lora_resident import StackedLayer
from test_es_lowrank import tiny_llama

from agent_envs.es import lora_slots
from agent_envs.es.lowrank import LowRankPerturber, lora_rank_slot
from agent_envs.es.worker import ESWorkerExtension

RANK, SIGMA = 2, 0.02
IDS = [1, 2, 3, 4]
SEEDS, SIGNS = [101, 101, 202, 202], [1, -1, 1, -1]  # mirrored pairs
BEFORE = [7, 7, 8, 8]  # the members the slots hold while the next ones are written


def engine_worker(index_to_id: list[int | None] | None = None) -> ESWorkerExtension:
    """A worker whose model is a tiny Llama and whose LoRA manager holds adapters ``IDS`` (every target
    unpacked, in bfloat16 as on a GPU) with vLLM's stacked slots, one slot per adapter by default."""
    model = tiny_llama()
    state = LowRankPerturber(model, RANK)
    index_to_id = list(IDS) if index_to_id is None else index_to_id
    slot = lora_rank_slot(RANK)

    def adapter() -> Any:
        loras = {
            t.name.removesuffix(".weight"): SimpleNamespace(
                lora_a=torch.zeros(RANK, t.in_features, dtype=torch.bfloat16),
                lora_b=torch.zeros(t.out_features, RANK, dtype=torch.bfloat16),
                scaling=1,
            )
            for t in state.targets
        }
        return SimpleNamespace(loras=loras)

    adapters = {i: adapter() for i in IDS}
    manager = SimpleNamespace(
        get_adapter=adapters.get,
        capacity=len(IDS),
        lora_index_to_id=index_to_id,
        modules={
            t.name.removesuffix(".weight"): StackedLayer(
                [(slot, t.in_features)], [(t.out_features, slot)], slots=len(index_to_id)
            )
            for t in state.targets
        },
        packed_modules={},
        _get_lora_layer_weights=lambda lora_model, name: lora_model.loras.get(name),
    )
    worker = ESWorkerExtension()
    worker.model_runner = SimpleNamespace(lora_manager=SimpleNamespace(_adapter_manager=manager))  # type: ignore[attr-defined]
    worker._es_lowrank = state
    return worker


def manager_of(worker: ESWorkerExtension) -> Any:
    return worker.model_runner.lora_manager._adapter_manager  # type: ignore[attr-defined]


def slot_tensors(worker: ESWorkerExtension) -> list[torch.Tensor]:
    """Every stacked slot tensor, copied: what the engine's steps read."""
    layers = manager_of(worker).modules.values()
    return [t.clone() for layer in layers for t in (*layer.lora_a_stacked, *layer.lora_b_stacked)]


def digests(worker: ESWorkerExtension, ids: list[int]) -> list[str]:
    return [lora_slots.slot_digest(manager_of(worker), i) for i in ids]


def refreshed(worker: ESWorkerExtension, ahead: bool, key: tuple[Any, ...] | None = None) -> dict[str, Any]:
    """Generation ``BEFORE`` in the slots, then the next members drawn (and written ahead, or not) during
    its rollouts, then their refresh: its answer."""
    assert worker.es_lowrank_refresh(IDS, BEFORE, SIGMA, SIGNS)["ok"]
    extra = {"refresh": list(key or (IDS, SEEDS, SIGMA, SIGNS))} if ahead else {}
    assert worker.es_lowrank_prefetch(SEEDS, SIGMA, **extra)["writing_ahead"] is ahead
    return worker.es_lowrank_refresh(IDS, SEEDS, SIGMA, SIGNS)


def test_adapters_written_ahead_are_the_bits_of_a_refresh_that_writes_them_and_leave_the_slots_alone() -> None:
    ahead, now = engine_worker(), engine_worker()
    assert ahead.es_lowrank_refresh(IDS, BEFORE, SIGMA, SIGNS)["ok"]
    serving, serving_digests = slot_tensors(ahead), digests(ahead, IDS)
    assert ahead.es_lowrank_prefetch(SEEDS, SIGMA, refresh=[IDS, SEEDS, SIGMA, SIGNS])["writing_ahead"]
    ahead._es_ahead_writer().wait()
    # written into the CPU adapters and gathered, but the slots the rollouts read still hold the members before
    assert all(torch.equal(a, b) for a, b in zip(slot_tensors(ahead), serving))
    assert digests(ahead, IDS) != serving_digests
    answer = ahead.es_lowrank_refresh(IDS, SEEDS, SIGMA, SIGNS)
    baseline = refreshed(now, ahead=False)
    assert answer["ok"] and answer["slots"] == baseline["slots"] == 4
    assert answer["prefetched"] == baseline["prefetched"] == 4
    assert answer["write_s"] == 0.0 and "slots_stack_s" not in answer  # only the copy was left
    assert {"ahead_wait_s", "ahead_write_s", "ahead_stack_s", "slots_queue_s"} <= set(answer)
    assert not {"ahead_write_s", "ahead_error"} & set(baseline)
    assert digests(ahead, IDS) == digests(now, IDS) != serving_digests
    assert all(torch.equal(a, b) for a, b in zip(slot_tensors(ahead), slot_tensors(now)))
    # the update of these members takes the factors the write kept, as after a refresh that drew them itself
    # (in another order than drawn: from the kept draws, not the factors stacked in the draws' order)
    for worker in (ahead, now):
        worker.es_lowrank_update([202, 101], [-1.0, 0.5], 0.01, SIGMA)
    states = [worker._es_lowrank_state() for worker in (ahead, now)]
    assert states[0].kept_factors == states[1].kept_factors == 2
    assert states[0].checksum() == states[1].checksum()


def test_the_next_refresh_written_ahead_during_an_update_is_queued_beside_it() -> None:
    ahead, now = engine_worker(), engine_worker()
    for worker, writes in ((ahead, True), (now, False)):
        refreshed(worker, ahead=False)
        extra = {"refresh": [IDS, BEFORE, SIGMA, SIGNS]} if writes else {}
        worker.es_lowrank_prefetch(BEFORE, SIGMA, **extra)
        answer = worker.es_lowrank_update([101, 202], [0.5, -1.0], 0.01, SIGMA, None, [IDS, BEFORE, SIGMA, SIGNS])
        assert answer["refreshed"]["ok"] and ("ahead_write_s" in answer["refreshed"]) is writes
    assert digests(ahead, IDS) == digests(now, IDS)
    assert ahead._es_lowrank_state().checksum() == now._es_lowrank_state().checksum()


@pytest.mark.parametrize(
    ("worker_of", "key", "between", "why"),
    [
        # adapter 4 holds no GPU slot: the engine would copy it in from its CPU adapter mid-generation
        (lambda: engine_worker([None, 1, 2, 3]), None, None, "hold no GPU slot"),
        # asked ahead for other members than the refresh then asks for
        (engine_worker, (IDS, SEEDS, SIGMA, [1, 1, 1, 1]), None, "written ahead for other members"),
        # the adapters moved slots between the writes and the refresh
        (engine_worker, None, lambda m: m.lora_index_to_id.reverse(), "other GPU slots"),
    ],
)
def test_a_refresh_that_could_not_be_written_ahead_writes_it_all_and_says_why(
    worker_of: Any, key: Any, between: Any, why: str
) -> None:
    ahead, now = worker_of(), worker_of()
    for worker in (ahead, now):
        assert worker.es_lowrank_refresh(IDS, BEFORE, SIGMA, SIGNS)["ok"]
    ahead.es_lowrank_prefetch(SEEDS, SIGMA, refresh=list(key or (IDS, SEEDS, SIGMA, SIGNS)))
    now.es_lowrank_prefetch(SEEDS, SIGMA)
    for worker in (ahead, now) if between else ():
        worker._es_ahead_writer().wait()
        between(manager_of(worker))
    answer, baseline = (w.es_lowrank_refresh(IDS, SEEDS, SIGMA, SIGNS) for w in (ahead, now))
    assert answer["ok"] and why in answer["ahead_error"] and "ahead_write_s" not in answer
    assert answer["slots"] == baseline["slots"] and answer["write_s"] > 0
    held = [i for i in IDS if i in manager_of(now).lora_index_to_id]
    assert digests(ahead, held) == digests(now, held)
    cpu = [manager_of(w).get_adapter(4).loras for w in (ahead, now)]
    assert all(torch.equal(cpu[0][m].lora_b, cpu[1][m].lora_b) for m in cpu[0])


def test_a_refresh_written_ahead_must_be_of_the_members_drawn() -> None:
    worker = engine_worker()
    with pytest.raises(ValueError, match="the same seeds and sigma"):
        worker.es_lowrank_prefetch(SEEDS, SIGMA, refresh=[IDS, BEFORE, SIGMA, SIGNS])
    with pytest.raises(ValueError, match="3 signs for 4 member seeds"):
        worker.es_lowrank_prefetch(SEEDS, SIGMA, refresh=[IDS, SEEDS, SIGMA, SIGNS[:3]])
