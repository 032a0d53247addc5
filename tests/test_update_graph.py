"""agent_envs.es.update_graph: the plain low-rank update replayed as one CUDA graph (on by default), the same bits
as the eager update; where it does not apply the update runs eagerly and says why.

This machine has no CUDA device: here the update must fall back with the same bits whether the graph is
asked for or not.  On a GPU host the last test runs the graph itself against the eager update, update
by update (captured on each of the two staging buffers, then replayed); the H200 run of
``benchmarks/bench_update_issue.py --variants eager,graph`` does the same at the 4B shape.
"""

from __future__ import annotations

import pytest
import torch

from agent_envs.es import update_graph
from agent_envs.es.lowrank import LowRankPerturber
from agent_envs.es.pinned_staging import PinnedStaging
from benchmarks.bench_update_issue import SHAPES, model_of


def updates(
    device: torch.device, dtype: torch.dtype, graph: bool, monkeypatch: pytest.MonkeyPatch, staged: bool = False
) -> list[tuple[str, str]]:
    """Three updates as the engine runs them: each generation's factors drawn ahead and taken by its
    refresh, the next generation's draws started before the update (so the two staging buffers
    alternate); each update's fingerprint after it, and how it ran.  ``staged``: on a CPU too, the
    factors copied into staging buffers (not page-locked here), as a GPU's are."""
    monkeypatch.setenv(update_graph.ENV, "1" if graph else "0")
    perturber = LowRankPerturber(model_of(SHAPES["tiny"], dtype, device), 4)
    if staged:
        perturber._staging = PinnedStaging(lambda buffer: False, lambda: None)
    sigma, seen = 0.01, []

    def seeds(generation: int) -> list[int]:
        return [100 + 10 * generation + i for i in range(3)]

    perturber.prefetch(seeds(0), sigma)
    for generation in range(3):
        perturber.take_prefetched(seeds(generation), sigma)
        perturber.prefetch(seeds(generation + 1), sigma)
        perturber.update(seeds(generation), [1.0, -0.5, 0.25 * generation], 0.5, sigma)
        seen.append((perturber.fingerprint(), str(perturber.last_update_timing["graph"])))
    return seen


def test_where_it_does_not_apply_the_update_runs_eagerly_with_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    eager = updates(cpu, torch.float32, False, monkeypatch)
    asked = updates(cpu, torch.float32, True, monkeypatch)
    assert [f for f, _ in asked] == [f for f, _ in eager]
    assert len({f for f, _ in eager}) == 3  # every update moved the weights
    assert {how for _, how in eager} == {f"off ({update_graph.ENV} is 0)"}
    assert {how for _, how in asked} == {"eager: the weights are not on one CUDA device"}


def test_a_refused_capture_leaves_the_run_on_the_eager_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the device refuses the capture, that update and the run's later ones go eagerly (the same
    bits), and each says why; the capture is not tried again every generation."""
    tried: list[int] = []

    def refuse(self: update_graph.UpdateGraph, *args: object, **kwargs: object) -> None:
        tried.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    cpu = torch.device("cpu")
    eager = updates(cpu, torch.float32, False, monkeypatch)
    monkeypatch.setattr(update_graph, "why_not", lambda *args, **kwargs: None)  # as on a GPU host
    monkeypatch.setattr(update_graph.UpdateGraph, "prepare", refuse)
    refused = updates(cpu, torch.float32, True, monkeypatch, staged=True)
    assert [f for f, _ in refused] == [f for f, _ in eager] and len(tried) == 1
    assert {how for _, how in refused} == {
        "eager: the capture failed (RuntimeError: operation not permitted when stream is capturing)"
    }


def test_each_condition_is_named() -> None:
    cpu = torch.device("cpu")
    assert update_graph.why_not([cpu], None, None, plain=False) == "Adam's update keeps state per step"
    assert update_graph.why_not([cpu, cpu], None, None, plain=True) == "the weights are not on one CUDA device"
    cuda = torch.device("cuda", 0)
    assert update_graph.why_not([cuda, torch.device("cuda", 1)], None, None, plain=True) == (
        "the weights are not on one CUDA device"
    )
    assert (
        update_graph.why_not([cuda], None, {}, plain=True) == "the factors were not stacked ahead in a staging buffer"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the graph itself runs on a GPU host")
def test_the_graph_replays_the_eager_updates_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda")
    eager = updates(cuda, torch.bfloat16, False, monkeypatch)
    graphed = updates(cuda, torch.bfloat16, True, monkeypatch)
    assert [f for f, _ in graphed] == [f for f, _ in eager]
    # generation 0 reads the first staging buffer, 1 the second (the draws alternate), 2 the first again
    assert [how for _, how in graphed] == ["captured", "captured", "replayed"]


def test_a_run_can_turn_the_graph_on_or_off_whatever_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LowRankPerturber.wants_graph`` (set through the worker extension's ``es_lowrank_update_graph``, the
    driver's ``VLLMLowRank.use_update_graph``) wins over the environment variable; None gives it back."""
    from agent_envs.es.worker import ESWorkerExtension

    cpu = torch.device("cpu")
    worker = ESWorkerExtension()
    worker._es_lowrank = perturber = LowRankPerturber(model_of(SHAPES["tiny"], torch.float32, cpu), 4)

    def how(seed: int) -> str:
        perturber.update([seed], [1.0], 0.5, 0.01)
        return str(perturber.last_update_timing["graph"])

    monkeypatch.setenv(update_graph.ENV, "1")
    assert worker.es_lowrank_update_graph(False) == {"ok": True, "update_graph": False}
    assert how(1) == "off"
    worker.es_lowrank_update_graph(None)
    assert how(2) == "eager: the weights are not on one CUDA device"  # the environment's 1 again
    monkeypatch.setenv(update_graph.ENV, "0")
    worker.es_lowrank_update_graph(True)
    assert how(3) == "eager: the weights are not on one CUDA device"
