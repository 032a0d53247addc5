"""Whether k engines sharing one GPU can all start, from the first one's build (agent_envs.scale.gpu_memory).

The numbers are the H100 80 GB of 2026-12-06: eight SmolLM2-135M-shape engines at ``gpu_memory_utilization``
0.85 split eight ways; the pool measured the first build (79.13 of 79.65 GiB free before, 10.12 GiB taken) and
refused (benchmarks/results/es_generation_h100_2026-12-06b/); the morning's run without the check had vLLM
refuse the eighth engine after every build but the last.
"""

from __future__ import annotations

import dataclasses

from agent_envs.scale.gpu_memory import GIB, MARGIN, BuildMemory, nvml_memory, shared_gpu_shortfall

H100 = BuildMemory(total=int(79.65 * GIB), free_before=int(79.13 * GIB), free_after=int(69.01 * GIB), share=0.85 / 8)


def test_the_h100_pool_of_eight_is_refused_at_its_eighth_engine_with_a_share_that_fits() -> None:
    why = shared_gpu_shortfall(H100, 8)
    assert why is not None and "engine 8 would find about 8.29 GiB free (with 2% of the GPU to spare)" in why, why
    assert "each must find 8.46 GiB free" in why and "the first took 10.12 GiB" in why, why
    assert "a share of at most 0.103 per engine fits (gpu_memory_utilization 0.824 split 8 ways)" in why, why
    # the same engines at the share offered: each takes its share plus what it held beyond it, and all eight
    # start, each with the margin to spare
    fits = 0.103
    over = H100.footprint - H100.share * H100.total
    at_fit = dataclasses.replace(H100, share=fits, free_after=H100.free_before - int(fits * H100.total + over))
    assert shared_gpu_shortfall(at_fit, 8) is None
    assert shared_gpu_shortfall(H100, 7) is None  # seven engines start at 0.85 / 8 each


def test_a_pool_refused_where_no_share_fits_says_fewer_engines() -> None:
    tiny = BuildMemory(total=10 * GIB, free_before=10 * GIB, free_after=6 * GIB, share=0.05)  # 3.5 GiB over
    why = shared_gpu_shortfall(tiny, 4)
    assert why is not None and "no share fits" in why and "fewer engines per GPU" in why, why


def test_one_engine_or_a_lean_pool_fits() -> None:
    assert shared_gpu_shortfall(H100, 1) is None
    # each takes 20 of 100 and asks 18 free: the fifth finds 20, its ask and the margin exactly; a sixth finds 0
    lean = BuildMemory(total=100, free_before=100, free_after=80, share=0.18)
    assert MARGIN == 0.02 and shared_gpu_shortfall(lean, 5) is None and shared_gpu_shortfall(lean, 6) is not None


def test_a_gpu_nvml_cannot_read_is_no_memory() -> None:
    """No such GPU, no driver (CI's machine) or Ray's GPUs declared on a CPU host: the pool checks nothing."""
    assert nvml_memory("99") is None
