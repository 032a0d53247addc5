"""Page-locked staging of the low-rank update's stacked factors (agent_envs.es.pinned_staging): two
buffers used in turn around the one an update still reads, locked once, the same bits as the draws'
memory, and an update from them equal to one without them.  This machine has no GPU: the lock here
is a recorder (the H200 run locks with cudaHostRegister and reports the update's time)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agent_envs.es.lowrank import LowRankPerturber, Target, draw_ahead
from agent_envs.es.pinned_staging import PinnedStaging
from test_es_lora_resident import tiny_llama

TARGETS = (Target("l.0.q_proj.weight", 12, 7), Target("l.0.down_proj.weight", 5, 16))


class Recorder:
    """Counts locks (answering ``locks``) and settles."""

    def __init__(self, locks: bool = True) -> None:
        self.answer, self.locked, self.settled = locks, [], 0

    def lock(self, buffer: torch.Tensor) -> bool:
        self.locked.append(buffer.numel())
        return self.answer

    def settle(self) -> None:
        self.settled += 1


def values(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


def test_buffers_are_used_in_turn_around_the_busy_one_and_locked_once() -> None:
    recorder = Recorder()
    staging = PinnedStaging(recorder.lock, recorder.settle)
    first = staging.stage(values(100, 1))
    assert torch.equal(first, torch.from_numpy(values(100, 1))) and recorder.locked == [100]
    second = staging.stage(values(80, 2), busy=first)  # an update still reads the first: the other buffer
    assert torch.equal(first, torch.from_numpy(values(100, 1))) and torch.equal(second, torch.from_numpy(values(80, 2)))
    assert recorder.locked == [100, 80] and recorder.settled == 0
    third = staging.stage(values(90, 3), busy=second)  # back to the first buffer, big enough: not locked again
    assert torch.equal(third, torch.from_numpy(values(90, 3))) and torch.equal(second, torch.from_numpy(values(80, 2)))
    assert recorder.locked == [100, 80] and recorder.settled == 1  # waited for any copy still reading it
    assert third.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    fourth = staging.stage(values(120, 4), busy=third)  # the second buffer is too small: a new one, locked
    assert recorder.locked == [100, 80, 120] and torch.equal(fourth, torch.from_numpy(values(120, 4)))
    assert staging.stage(values(5, 5)).untyped_storage().data_ptr() == first.untyped_storage().data_ptr()


def test_a_buffer_that_could_not_be_locked_is_used_as_it_is() -> None:
    recorder = Recorder(locks=False)
    staging = PinnedStaging(recorder.lock, recorder.settle)
    staging.stage(values(10, 1))
    assert staging.stage(values(10, 2)).sum() == torch.from_numpy(values(10, 2)).sum()
    assert staging.locked == [False, False] and recorder.settled == 0


def test_only_float32_vectors_are_staged() -> None:
    with pytest.raises(ValueError, match="1-D float32 values, got float64 of 1"):
        PinnedStaging(Recorder().lock).stage(np.zeros(3))


def test_staged_stacked_factors_have_the_bits_of_the_draws_memory() -> None:
    staging = PinnedStaging(Recorder().lock, lambda: None)
    plain, staged = draw_ahead((3, 9), TARGETS, 2, 0.05), draw_ahead((3, 9), TARGETS, 2, 0.05, staging)
    assert plain.staged is None and staged.staged is not None
    for target in TARGETS:
        for got, want in zip(staged.stacked[target.name], plain.stacked[target.name]):
            assert got.shape == want.shape and torch.equal(got, want)
            assert got.untyped_storage().data_ptr() == staged.staged.untyped_storage().data_ptr()


def test_an_update_from_staged_factors_equals_one_without_and_the_next_draws_spare_its_buffer() -> None:
    staged, plain = LowRankPerturber(tiny_llama(), 2), LowRankPerturber(tiny_llama(), 2)
    staged._staging = PinnedStaging(Recorder().lock, lambda: None)  # what a perturber on a GPU makes itself
    for generation, seeds in enumerate(([5, 6], [7, 8], [9, 10])):
        for perturber in (staged, plain):
            perturber.prefetch(seeds, 0.02)
            ready = perturber.take_prefetched(seeds, 0.02)
            for seed in seeds:
                perturber.member_adapter(seed, 0.02, ready)
        reading = staged._stacked[2]
        before = reading.clone()
        staged.prefetch([100 + generation, 200], 0.02)  # the next generation's draws, staged meanwhile
        staged._ahead[2].result()
        assert torch.equal(reading, before)  # not in the buffer the update is about to read
        for perturber in (staged, plain):
            perturber.update(seeds, [1.0, -0.5], 0.01, 0.02)
        assert staged.kept_factors == 2 and staged.checksum() == plain.checksum()
