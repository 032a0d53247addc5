"""agent_envs.es.kernel_profile: what an engine's kernels took over a window of steps (here the host's
torch operators: this machine has no CUDA device), summed and ranked."""

from __future__ import annotations

import pytest
import torch

from agent_envs.es.kernel_profile import KernelProfile, summarize, table


def test_summarize_ranks_by_time_keeps_the_top_and_sums_the_rest() -> None:
    summary = summarize([("gemm", 10, 600.0), ("idle", 3, 0.0), ("widen", 10, 300.0), ("norm", 20, 100.0)], top=2)
    assert summary["total_ms"] == pytest.approx(1.0) and summary["kernels"] == 3  # a kernel of no time is left out
    assert [(r["name"], r["calls"], r["share"]) for r in summary["rows"]] == [("gemm", 10, 0.6), ("widen", 10, 0.3)]
    assert summary["others_ms"] == pytest.approx(0.1)
    assert table(summary).splitlines()[-1] == "| the others | | 0.1 | 10.0% |"


def test_a_recording_holds_what_ran_between_start_and_stop_only() -> None:
    profile, x = KernelProfile(), torch.randn(64, 64)
    x @ x  # before the recording
    assert profile.start()["device"] == "cpu"
    with pytest.raises(RuntimeError, match="already recording"):
        profile.start()
    for _ in range(3):
        torch.mm(x, x)
    summary = profile.stop(top=50)
    mm = [r for r in summary["rows"] if r["name"] == "aten::mm"]
    assert mm and mm[0]["calls"] == 3 and summary["total_ms"] > 0
    with pytest.raises(RuntimeError, match="no kernel profile is recording"):
        profile.stop()
