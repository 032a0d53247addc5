"""Whether k engines sharing one GPU can all start, from the first one's build (agent_envs.scale.gpu_memory).

The numbers are the H100 80 GB of 2026-12-06: eight SmolLM2-135M-shape engines at ``gpu_memory_utilization``
0.85 split eight ways; the pool measured the first build (79.13 of 79.65 GiB free before, 10.12 GiB taken) and
refused (benchmarks/results/es_generation_h100_2026-12-06b/); the morning's run without the check had vLLM
refuse the eighth engine after every build but the last.  The share the check offered then, 0.824 split eight
ways, started all eight on 2026-12-07 and the eighth ran out of memory in its build
(benchmarks/results/es_generation_h100_2026-12-07/): an engine needs its whole footprint free, not its share.
"""

from __future__ import annotations

import dataclasses

from agent_envs.scale.gpu_memory import GIB, MARGIN, BuildMemory, nvml_memory, shared_gpu_shortfall

H100 = BuildMemory(total=int(79.65 * GIB), free_before=int(79.13 * GIB), free_after=int(69.01 * GIB), share=0.85 / 8)


def test_the_h100_pool_of_eight_is_refused_at_its_eighth_engine_with_a_share_that_fits() -> None:
    why = shared_gpu_shortfall(H100, 8)
    assert why is not None and "engine 8 would find about 8.29 GiB free where it needs 11.71 GiB" in why, why
    assert "the first took 10.12 GiB, 1.66 GiB beyond its share (0.1062 of 79.65 GiB)" in why, why
    assert "a share of at most 0.100 per engine fits (gpu_memory_utilization 0.800 split 8 ways)" in why, why
    assert shared_gpu_shortfall(H100, 7) is None  # seven engines build at 0.85 / 8 each


def at_share(share: float) -> BuildMemory:
    """The H100's first build at another share: the share plus what the first engine held beyond its own."""
    over = H100.footprint - H100.share * H100.total
    return dataclasses.replace(H100, share=share, free_after=H100.free_before - int(share * H100.total + over))


def test_the_share_offered_builds_all_eight_and_the_old_offer_is_refused() -> None:
    """At 0.800 / 8 the eighth finds its whole footprint and the margin; at 0.824 / 8 (the offer of a rule
    that asked each engine for its share only) it finds its share but not its build: what the H100 showed."""
    assert shared_gpu_shortfall(at_share(0.100), 8) is None
    old_offer = shared_gpu_shortfall(at_share(0.103), 8)
    assert old_offer is not None and "engine 8 would find about" in old_offer, old_offer
    free_for_eighth = at_share(0.103).free_after - 6 * at_share(0.103).footprint
    assert 0.103 * H100.total < free_for_eighth < at_share(0.103).footprint + MARGIN * H100.total


def test_a_pool_refused_where_no_share_fits_says_fewer_engines() -> None:
    tiny = BuildMemory(total=10 * GIB, free_before=10 * GIB, free_after=6 * GIB, share=0.05)  # 3.5 GiB over
    why = shared_gpu_shortfall(tiny, 4)
    assert why is not None and "no share fits" in why and "fewer engines per GPU" in why, why


def test_one_engine_or_a_lean_pool_fits() -> None:
    assert shared_gpu_shortfall(H100, 1) is None
    # each asks 18 of 100 and takes 20: the fourth finds 40, its 20 and the margin; the fifth finds 20, enough
    # for vLLM's start check (18) but not for its build and the margin (22)
    lean = BuildMemory(total=100, free_before=100, free_after=80, share=0.18)
    assert MARGIN == 0.02 and shared_gpu_shortfall(lean, 4) is None
    fifth = shared_gpu_shortfall(lean, 5)
    assert fifth is not None and "engine 5 would find" in fifth, fifth


def test_a_gpu_nvml_cannot_read_is_no_memory() -> None:
    """No such GPU, no driver (CI's machine) or Ray's GPUs declared on a CPU host: the pool checks nothing."""
    assert nvml_memory("99") is None
