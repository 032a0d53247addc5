"""The process that draws a population's low-rank factors ahead (agent_envs.es.lowrank_factors): the
bits of drawing them here, a clear error when it fails, and no memory left behind."""

from __future__ import annotations

import contextlib
import gc
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from agent_envs.es import lowrank
from agent_envs.es.lowrank import Target, adapter_tensors, draw_ahead, factors, update_terms
from agent_envs.es.draw_memory import DrawMemory
from agent_envs.es.lowrank_factors import CHUNK

TARGETS = (
    Target("l.0.q_proj.weight", 12, 7),
    Target("l.0.down_proj.weight", 5, 16),
    Target("l.1.q_proj.weight", 12, 7),
)
SEEDS = (41, 7, 2**31 - 2)


def mappings() -> list[str]:
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if "es-lowrank-factors" in line]


def open_files() -> set[int]:
    """The draws' memory files this process holds a descriptor of (a mapping holds one too), by inode."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):  # the listing's own descriptor is gone by the time it is read
        with contextlib.suppress(FileNotFoundError):
            if "es-lowrank-factors" in os.readlink(f"/proc/self/fd/{fd}"):
                inodes.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
    return inodes


def assert_bits(ahead: lowrank.DrawnAhead, seeds: tuple[int, ...], rank: int, sigma: float) -> None:
    """``ahead`` holds the bits of drawing ``seeds`` here: stacked factors and every adapter."""
    for target in TARGETS:
        want_a, want_b = update_terms(seeds, target, rank)
        assert torch.equal(ahead.stacked[target.name][0], want_a) and torch.equal(ahead.stacked[target.name][1], want_b)
        for seed in seeds:
            got_a, got_b = ahead.draws[seed][1][target.name.removesuffix(".weight")]
            want = adapter_tensors(*factors(seed, target, rank), sigma)
            assert torch.equal(got_a, want[0]) and torch.equal(got_b, want[1])


@pytest.mark.parametrize("threads", [1, 2])
def test_the_drawing_process_gives_the_bits_of_drawing_in_this_process(threads: int) -> None:
    ahead = draw_ahead(SEEDS, TARGETS, 3, 0.05, threads=threads)  # 2: blocks of one and two members
    assert list(ahead.draws) == list(SEEDS) and list(ahead.stacked) == [t.name for t in TARGETS]
    assert_bits(ahead, SEEDS, 3, 0.05)
    for seed in SEEDS:
        drawn, tensors = ahead.draws[seed]
        for target in TARGETS:
            a, b = factors(seed, target, 3)
            assert np.array_equal(drawn[target.name][0], a) and np.array_equal(drawn[target.name][1], b)
            got_a, got_b = tensors[target.name.removesuffix(".weight")]
            assert got_a.shape == (3, target.in_features) and got_b.shape == (target.out_features, 3)


def test_each_targets_adapter_arrays_hold_every_members_adapter_in_draw_order() -> None:
    ahead = draw_ahead(SEEDS, TARGETS, 3, 0.05)
    for target in TARGETS:
        module = target.name.removesuffix(".weight")
        block_a, block_b = map(torch.from_numpy, ahead.draws.adapter_arrays(module))
        assert block_a.shape == (len(SEEDS), 3, target.in_features)
        assert block_b.shape == (len(SEEDS), target.out_features, 3)
        for seed in SEEDS:
            got_a, got_b = ahead.draws[seed][1][module]
            member = ahead.draws.index[seed]
            assert torch.equal(block_a[member], got_a) and torch.equal(block_b[member], got_b)


def test_the_draws_make_no_view_per_member_until_one_is_asked_for() -> None:
    """At P = 256 on the 4B shape the views made per member and target were about 129,000 torch tensors a
    generation, let go of beside the engine's scheduling loop (docs/scaling.md): made lazily now."""
    targets = tuple(Target(f"l.{i}.q_proj.weight", 4, 3) for i in range(50))
    seeds = tuple(range(40))  # 40 x 50 x 2 tensors and as many arrays, were they made ahead

    def tensors() -> int:
        gc.collect()
        return sum(type(o) is torch.Tensor for o in gc.get_objects())

    before = tensors()
    ahead = draw_ahead(seeds, targets, 2, 0.01)
    assert tensors() - before <= 2 * len(targets) + 5  # the stacked factors, one pair per target
    drawn, adapters = ahead.draws[seeds[-1]]
    assert len(drawn) == len(adapters) == len(targets)
    assert adapters[targets[0].name.removesuffix(".weight")][0].shape == (2, 3)


def test_members_drawn_in_chunks_keep_the_bits_across_chunk_and_thread_edges() -> None:
    seeds = tuple(range(1000, 1000 + 2 * CHUNK + 5))  # 2 threads: blocks of 18 and 19, each a whole chunk and a part
    assert_bits(draw_ahead(seeds, TARGETS, 4, 0.03, threads=2), seeds, 4, 0.03)


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


def test_a_kept_memory_file_takes_the_next_draws_only_once_nothing_maps_it() -> None:
    memory = DrawMemory(keep=2)
    first = draw_ahead(SEEDS, TARGETS, 3, 0.05, memory=memory)
    second = draw_ahead((5, 6), TARGETS, 3, 0.05, memory=memory)  # the first is still in use: a second file
    third = draw_ahead((8, 9, 10), TARGETS, 3, 0.05, memory=memory)  # both in use: a third, not kept
    assert (memory.made, memory.reused) == (3, 0) and len(open_files()) == 3
    assert_bits(first, SEEDS, 3, 0.05)  # untouched by the draws after it
    del first, third
    gc.collect()
    assert len(mappings()) == 1 and len(open_files()) == 2  # the third file went with its mapping, the first is kept
    # the first file again, over its old values: from 3 members of rank 3 to 4 members of rank 2 and back
    again = draw_ahead((11, 12, 13, 14), TARGETS, 2, 0.01, memory=memory)
    assert (memory.made, memory.reused) == (3, 1)
    assert_bits(again, (11, 12, 13, 14), 2, 0.01)
    assert_bits(second, (5, 6), 3, 0.05)
    del again
    gc.collect()
    assert_bits(draw_ahead((2, 1, 3), TARGETS, 3, 0.07, memory=memory), (2, 1, 3), 3, 0.07)
    assert (memory.made, memory.reused) == (3, 2)
    del memory, second
    gc.collect()
    assert open_files() == set() and mappings() == []  # closed with the memory


def test_a_failing_drawing_process_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lowrank, "request", lambda *args: "not a request")
    with pytest.raises(RuntimeError, match=r"(?s)drawing 3 members' factors failed \(exit 1\).*JSONDecodeError"):
        draw_ahead(SEEDS, TARGETS, 2, 0.01)
    assert mappings() == []
