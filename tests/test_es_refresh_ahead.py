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

from agent_envs.es import adapter_blocks, lora_slots
from agent_envs.es.batched import describe_refresh
from agent_envs.es.lowrank import LowRankPerturber, distinct, lora_rank_slot
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
    assert answer["ahead_blocks"]  # the refresh before made each module's adapters one block (adapter_blocks.find)
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


@pytest.mark.parametrize(
    ("seeds", "signs"),
    [([5, 6, 7, 8], [1, 1, 1, 1]), ([5, 6, 7, 8], [1, -1, -1, 1]), ([9, 5, 9, 5], [-1, 1, 1, -1])],
    ids=["distinct", "distinct-signed", "repeated-out-of-order"],
)
@pytest.mark.parametrize("gathered_before", [True, False], ids=["in-blocks", "one-by-one"])
def test_members_written_ahead_in_blocks_or_one_by_one_are_the_bits_of_a_refresh_that_writes_them(
    seeds: list[int], signs: list[int], gathered_before: bool
) -> None:
    """A few copies for all modules (``adapter_blocks.write``) where the adapters lie in one block each and
    take their members in runs, as a refresh's gathering leaves them and mirrored pairs take them; else one
    adapter after another (a fresh engine's adapters, members in no runs)."""
    ahead, now = engine_worker(), engine_worker()
    for worker in (ahead, now) if gathered_before else (now,):
        assert worker.es_lowrank_refresh(IDS, BEFORE, SIGMA, SIGNS)["ok"]
    assert ahead.es_lowrank_prefetch(seeds, SIGMA, refresh=[IDS, seeds, SIGMA, signs])["writing_ahead"]
    answer = ahead.es_lowrank_refresh(IDS, seeds, SIGMA, signs)
    baseline = now.es_lowrank_refresh(IDS, seeds, SIGMA, signs)
    in_runs = adapter_blocks.runs([distinct(seeds).index(s) for s in seeds], signs) is not None
    assert answer["ok"] and baseline["ok"] and answer["ahead_blocks"] is (gathered_before and in_runs)
    assert digests(ahead, IDS) == digests(now, IDS)
    assert all(torch.equal(a, b) for a, b in zip(slot_tensors(ahead), slot_tensors(now)))


@pytest.mark.parametrize(
    ("seeds", "signs"), [(SEEDS, SIGNS), ([5, 6, 7, 8], [1, -1, 1, -1])], ids=["mirrored", "signs-in-no-run"]
)
def test_a_refresh_that_writes_itself_from_its_draws_takes_the_blocks_and_the_bits_of_one_member_by_member(
    seeds: list[int], signs: list[int]
) -> None:
    """Not written ahead (no ``refresh=``), a refresh writes the members it finds drawn as the writes ahead do
    (``refresh_ahead.write_members``): in blocks where the adapters lie and take them in runs, with the bits of
    a refresh that draws each member itself, and keeps their factors for the update."""
    drawn, by_member = engine_worker(), engine_worker()
    for worker in (drawn, by_member):
        assert worker.es_lowrank_refresh(IDS, BEFORE, SIGMA, SIGNS)["ok"]  # gathered: each module one block
    assert drawn.es_lowrank_prefetch(seeds, SIGMA)["writing_ahead"] is False
    answer = drawn.es_lowrank_refresh(IDS, seeds, SIGMA, signs)
    baseline = by_member.es_lowrank_refresh(IDS, seeds, SIGMA, signs)  # nothing drawn ahead: member by member
    in_runs = adapter_blocks.runs([distinct(seeds).index(s) for s in seeds], signs) is not None
    assert (answer["prefetched"], baseline["prefetched"]) == (4, 0)
    assert answer["write_blocks"] is in_runs and baseline["write_blocks"] is False
    assert digests(drawn, IDS) == digests(by_member, IDS)
    assert all(torch.equal(a, b) for a, b in zip(slot_tensors(drawn), slot_tensors(by_member)))
    # the update (members in another order than drawn: from the factors the write kept) is the same too
    update_seeds = distinct(seeds)[::-1]
    for worker in (drawn, by_member):
        worker.es_lowrank_update(update_seeds, [0.5 * (i + 1) for i in range(len(update_seeds))], 0.01, SIGMA)
    states = [worker._es_lowrank_state() for worker in (drawn, by_member)]
    assert states[0].kept_factors == states[1].kept_factors == len(update_seeds)
    assert states[0].checksum() == states[1].checksum()


def test_adapters_lie_in_one_block_only_where_their_memory_says_so() -> None:
    block = torch.arange(4 * 2 * 3, dtype=torch.bfloat16).view(4, 2, 3)

    def spaced(parts: list[torch.Tensor]) -> tuple[int, int] | None:
        found = adapter_blocks._spaced(parts)
        return None if found is None else (found.first.data_ptr(), found.step)

    assert spaced([block[i] for i in range(4)]) == (block.data_ptr(), 6)
    assert spaced([block[i] for i in (0, 2)]) == (block.data_ptr(), 12)
    assert spaced([block[0, :, 1:], block[1, :, 1:]]) == (block[0, :, 1:].data_ptr(), 6)  # parts of rows
    assert spaced([block[i] for i in (0, 1, 3)]) is None  # not evenly spaced
    assert spaced([block[i] for i in (2, 1, 0)]) is None  # descending
    assert spaced([block[0, :, :2], block.transpose(1, 2)[1, :2]]) is None  # other strides
    flat = torch.zeros(10, dtype=torch.bfloat16)
    assert spaced([flat[0:4].view(2, 2), flat[2:6].view(2, 2)]) is None  # overlapping


def test_the_same_module_of_every_layer_is_written_as_one_run() -> None:
    """Two decoder layers: each module's blocks of both layers lie a constant step apart in the gathered
    adapters and in the draws, so each factor of each module is one view (7 runs per factor, not 14)."""
    worker = engine_worker()
    assert worker.es_lowrank_refresh(IDS, BEFORE, SIGMA, SIGNS)["ok"]
    state = worker._es_lowrank_state()
    state.prefetch(SEEDS, SIGMA)
    draws = state.pending_draws(SEEDS, SIGMA).result().draws
    found = adapter_blocks.find(lora_slots.plan(manager_of(worker), IDS, state.targets, state.rank))
    assert found is not None and len(found) == 14
    factor_runs = adapter_blocks.plan(found, draws)
    assert [[run.modules for run in runs] for runs in factor_runs] == [[2] * 7, [2] * 7]
    # a layout's first refresh: the loaded adapters lie apart, so nothing is found to write in blocks
    fresh = engine_worker()
    assert adapter_blocks.find(lora_slots.plan(manager_of(fresh), IDS, state.targets, state.rank)) is None


@pytest.mark.parametrize(
    ("rows", "signs", "runs"),
    [
        ([0, 0, 1, 1], [1, -1, 1, -1], (2, [1])),
        ([0, 1, 2], [1, 1, 1], (1, [])),
        ([0, 1, 2], [-1, -1, -1], (1, [0])),
        ([0, 1, 2], [1, -1, 1], None),  # signs that are no run's
        ([0, 1, 0, 1], [1, -1, 1, -1], None),  # members that are no run's
        ([0, 0, 1], [1, -1, 1], None),  # a run cut short
    ],
)
def test_adapters_take_their_members_in_runs_or_are_written_one_by_one(
    rows: list[int], signs: list[int], runs: Any
) -> None:
    assert adapter_blocks.runs(rows, signs) == runs


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


def test_a_refresh_note_says_which_writes_went_in_blocks() -> None:
    """The benchmark's notes (``batched.describe_refresh``) tell a write in blocks from one adapter after another,
    ahead or in the refresh itself: what a GPU run's table is read for."""
    base = {"prefetched": 4, "wait_s": 0.1, "write_s": 0.2, "slots_s": 0.3}
    ahead = {"ahead_wait_s": 1.0, "ahead_write_s": 0.5, "ahead_stack_s": 0.4}
    assert "wrote 0.200 s in blocks," in describe_refresh({**base, "write_blocks": True})
    assert "wrote 0.200 s," in describe_refresh({**base, "write_blocks": False})
    assert "wrote 0.500 s in blocks, stacked" in describe_refresh({**base, **ahead, "ahead_blocks": True})
    assert "wrote 0.500 s, stacked" in describe_refresh({**base, **ahead, "ahead_blocks": False})
    assert "0.200" not in describe_refresh({**base, **ahead})  # written ahead: the refresh itself wrote nothing
