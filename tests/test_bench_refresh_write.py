"""benchmarks/bench_refresh_write.py on this CPU at a tiny size: both ways of writing the members ahead give a
row alone and beside the busy thread, the second way goes through ``adapter_blocks`` (the benchmark exits
non-zero where the adapters do not lie in blocks after a gathering), and both write the same bits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_both_ways_of_writing_ahead_give_rows_and_the_same_bits() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_refresh_write.py"), "--shape", "135m", "--members", "4"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "(s)" not in line]
    assert {(r[0].strip(), r[1].strip()) for r in rows} == {
        (way, beside)
        for way in ("one adapter after another", "all modules in a few copies")
        for beside in ("nothing", "a busy thread")
    }
    assert all(float(r[5]) > 0 for r in rows)
    assert "both ways wrote the same bits into every CPU adapter" in done.stdout


def test_an_odd_population_is_refused_by_name() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_refresh_write.py"), "--members", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "--members must be even" in done.stderr
