"""The process that draws a population's low-rank factors ahead (agent_envs.es.lowrank_factors): the
bits of drawing them here, a clear error when it fails, and no memory left behind."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

from agent_envs.es import lowrank
from agent_envs.es.lowrank import Target, adapter_tensors, draw_ahead, factors, update_terms
from agent_envs.es.lowrank_factors import CHUNK

TARGETS = (
    Target("l.0.q_proj.weight", 12, 7),
    Target("l.0.down_proj.weight", 5, 16),
    Target("l.1.q_proj.weight", 12, 7),
)
SEEDS = (41, 7, 2**31 - 2)


def mappings() -> list[str]:
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if "es-lowrank-factors" in line]


@pytest.mark.parametrize("threads", [1, 2])
def test_the_drawing_process_gives_the_bits_of_drawing_in_this_process(threads: int) -> None:
    ahead = draw_ahead(SEEDS, TARGETS, 3, 0.05, threads=threads)  # 2: blocks of one and two members
    assert list(ahead.draws) == list(SEEDS) and list(ahead.stacked) == [t.name for t in TARGETS]
    for seed in SEEDS:
        drawn, tensors = ahead.draws[seed]
        for target in TARGETS:
            a, b = factors(seed, target, 3)
            assert np.array_equal(drawn[target.name][0], a) and np.array_equal(drawn[target.name][1], b)
            lora_a, lora_b = adapter_tensors(a, b, 0.05)
            got_a, got_b = tensors[target.name.removesuffix(".weight")]
            assert torch.equal(got_a, lora_a) and torch.equal(got_b, lora_b)
            assert got_a.shape == (3, target.in_features) and got_b.shape == (target.out_features, 3)
    for target in TARGETS:
        want_a, want_b = update_terms(SEEDS, target, 3)
        assert torch.equal(ahead.stacked[target.name][0], want_a) and torch.equal(ahead.stacked[target.name][1], want_b)


def test_members_drawn_in_chunks_keep_the_bits_across_chunk_and_thread_edges() -> None:
    seeds = tuple(range(1000, 1000 + 2 * CHUNK + 5))  # 2 threads: blocks of 18 and 19, each a whole chunk and a part
    ahead = draw_ahead(seeds, TARGETS, 4, 0.03, threads=2)
    for target in TARGETS:
        want_a, want_b = update_terms(seeds, target, 4)
        assert torch.equal(ahead.stacked[target.name][0], want_a) and torch.equal(ahead.stacked[target.name][1], want_b)
    for seed in seeds:
        got_a, got_b = ahead.draws[seed][1][TARGETS[1].name.removesuffix(".weight")]
        want = adapter_tensors(*factors(seed, TARGETS[1], 4), 0.03)
        assert torch.equal(got_a, want[0]) and torch.equal(got_b, want[1])


def test_the_shared_memory_goes_with_the_last_array_that_uses_it() -> None:
    assert mappings() == []
    ahead = draw_ahead(SEEDS, TARGETS, 2, 0.01)
    kept = ahead.stacked[TARGETS[0].name][0]
    assert len(mappings()) == 1  # mapped once, named in no folder
    del ahead
    gc.collect()
    assert len(mappings()) == 1 and kept.abs().sum() > 0  # still in use
    del kept
    gc.collect()
    assert mappings() == []


def test_a_failing_drawing_process_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lowrank, "request", lambda *args: "not a request")
    with pytest.raises(RuntimeError, match=r"(?s)drawing 3 members' factors failed \(exit 1\).*JSONDecodeError"):
        draw_ahead(SEEDS, TARGETS, 2, 0.01)
    assert mappings() == []
